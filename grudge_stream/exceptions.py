"""One exception root for grudge-stream, with flat subclasses.

Errors an operator can act on carry an "Operator action:" sentence.
"""
from __future__ import annotations


class GrudgeError(Exception):
    """Root of every error grudge-stream raises on purpose."""


class ConfigError(GrudgeError, ValueError):
    """An invalid sketch, operator or topology configuration."""


class InvalidInputError(GrudgeError, ValueError):
    """A value that must never reach a sketch (NaN/Inf delta, bad timestamp, ...)."""


class SnapshotError(GrudgeError, ValueError):
    """A snapshot that is truncated, corrupt, of another kind or of an unknown version.

    Loading never returns a half-valid sketch: it raises this instead.
    """


class MismatchError(GrudgeError, ValueError):
    """Two sketches (or a sketch and a snapshot) whose config or seed differ."""


class CheckpointError(GrudgeError):
    """A checkpoint could not be written or restored."""


class DeliveryError(GrudgeError):
    """Outputs that are not delivered (nor dead-lettered) yet: no snapshot may cover them.

    Raised by ``OutputPublisher.flush``. Not a ``CheckpointError``: the snapshot store did
    not fail, and the runtimes handle the two apart (a stopping worker skips its final
    snapshot on this one).
    """


class PartitionCountChanged(CheckpointError):
    """The source topic's partition count differs from the one the snapshots were taken on."""


class ForeignDeployment(CheckpointError):
    """The snapshot topic holds another deployment's state: snapshots of another source topic."""
