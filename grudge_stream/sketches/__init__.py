"""Public sketch API: config objects, sizing helpers and the compiled sketch classes."""

from __future__ import annotations

from grudge_stream.sketches.bloom import ForgettingBloom
from grudge_stream.sketches.countmin import DecayingCountMin
from grudge_stream.sketches.score import (
    Exponential,
    Linear,
    NoDecay,
    QueryDetail,
    Rotator,
    RotatorConfig,
    ScoreSketch,
    ScoreSketchConfig,
    suggest_levels,
)
from grudge_stream.sketches.split import SplitScoreSketch

__all__ = [
    "DecayingCountMin",
    "Exponential",
    "ForgettingBloom",
    "Linear",
    "NoDecay",
    "QueryDetail",
    "Rotator",
    "RotatorConfig",
    "ScoreSketch",
    "ScoreSketchConfig",
    "SplitScoreSketch",
    "suggest_levels",
]
