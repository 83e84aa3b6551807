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


class SnapshotRefused(CheckpointError):
    """A partition's snapshots were taken under other state-shaping settings (or another hash
    key) and nothing allows dropping them: the operator decides (exit 2)."""


class ForeignDeployment(CheckpointError):
    """The snapshot topic holds another deployment's state: snapshots of another source topic."""


class WorkerFault(GrudgeError):
    """A fault at run time that a restart can cure (a consumer the group fenced for good and
    could not replace, outputs that cannot be delivered on the way out, a transactional call
    that blocks): the worker ends with ``EXIT_FAULT``, never ``EXIT_USER_ERROR``, so an
    orchestrator restarts it."""


# Exit codes of `grudge-stream worker` (docs/operations.md, "Exit codes"):
EXIT_OK = 0          # stopped (SIGTERM / SIGINT), final snapshots written
EXIT_USER_ERROR = 2  # bad settings, a foreign deployment, a refused snapshot: a restart does not help
EXIT_FAULT = 3       # a fault at run time (broker, group, delivery): restart the worker

# Errors a restart cannot cure: the operator has to act.
USER_ERRORS = (ConfigError, InvalidInputError, SnapshotError, MismatchError, SnapshotRefused,
               ForeignDeployment, PartitionCountChanged)


def exit_code(exc: BaseException) -> int:
    """The exit status a worker that ended with ``exc`` returns."""
    return EXIT_USER_ERROR if isinstance(exc, USER_ERRORS) else EXIT_FAULT
