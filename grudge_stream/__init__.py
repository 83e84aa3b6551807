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
from grudge_stream.sketches.score import (
    Exponential,
    Linear,
    NoDecay,
    Rotator,
    ScoreSketch,
    suggest_levels,
)
from grudge_stream.sketches.split import SplitScoreSketch

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DecayingCountMin",
    "EventClock",
    "Exponential",
    "ForgettingBloom",
    "GrudgeError",
    "InvalidInputError",
    "Linear",
    "ManualClock",
    "MismatchError",
    "NoDecay",
    "Rotator",
    "ScoreSketch",
    "SnapshotError",
    "SplitScoreSketch",
    "SystemClock",
    "suggest_levels",
    "__version__",
]
