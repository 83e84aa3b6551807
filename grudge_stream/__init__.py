"""grudge-stream: constant-memory, self-decaying sketches for stream processors."""
from __future__ import annotations

from grudge_stream.clock import EventClock, ManualClock, SystemClock
from grudge_stream.exceptions import (
    CheckpointError,
    ConfigError,
    GrudgeError,
    InvalidInputError,
    MismatchError,
    SnapshotError,
)
from grudge_stream.sketches.bloom import ForgettingBloom
from grudge_stream.sketches.countmin import DecayingCountMin

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DecayingCountMin",
    "EventClock",
    "ForgettingBloom",
    "GrudgeError",
    "InvalidInputError",
    "ManualClock",
    "MismatchError",
    "SnapshotError",
    "SystemClock",
    "__version__",
]
