"""grudge-stream: constant-memory, self-decaying sketches for stream processors."""
from __future__ import annotations

from typing import TYPE_CHECKING

from grudge_stream._lazy import lazy_exports
from grudge_stream.exceptions import (
    CheckpointError,
    ConfigError,
    GrudgeError,
    InvalidInputError,
    MismatchError,
    SnapshotError,
)

# The sketches (compiled kernels, numpy) load on first use, so that tools which only need
# a submodule (the dev broker, the settings, the CLI's argument parsing) start light.
_LAZY = {
    "EventClock": "grudge_stream.clock",
    "ManualClock": "grudge_stream.clock",
    "SystemClock": "grudge_stream.clock",
    "ForgettingBloom": "grudge_stream.sketches.bloom",
    "DecayingCountMin": "grudge_stream.sketches.countmin",
    "Exponential": "grudge_stream.sketches.score_config",
    "Linear": "grudge_stream.sketches.score_config",
    "NoDecay": "grudge_stream.sketches.score_config",
    "Rotator": "grudge_stream.sketches.score",
    "ScoreSketch": "grudge_stream.sketches.score",
    "suggest_levels": "grudge_stream.sketches.score_config",
    "SplitScoreSketch": "grudge_stream.sketches.split",
}

if TYPE_CHECKING:
    from grudge_stream.clock import EventClock, ManualClock, SystemClock
    from grudge_stream.sketches.bloom import ForgettingBloom
    from grudge_stream.sketches.countmin import DecayingCountMin
    from grudge_stream.sketches.score import Exponential, Linear, NoDecay, Rotator, ScoreSketch, suggest_levels
    from grudge_stream.sketches.split import SplitScoreSketch


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


def _installed_version() -> str:
    """The one version source is the package metadata (``pyproject.toml``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grudge-stream")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


__version__ = _installed_version()

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
