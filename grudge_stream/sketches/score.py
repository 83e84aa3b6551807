"""ScoreSketch: decaying feedback scores over unbounded keys, in fixed memory.

This module holds the public, frozen config objects (the decays
:class:`Exponential`, :class:`Linear`, :class:`NoDecay`, :class:`ScoreSketchConfig`,
:class:`RotatorConfig`), the sizing helper :func:`suggest_levels`, and
re-exports the compiled :class:`ScoreSketch` and :class:`Rotator`.
Semantics, error direction, sizing and the byte format: ``docs/score-sketch.md``.
"""

from __future__ import annotations

from grudge_stream._cyext._score import QueryDetail, Rotator, ScoreSketch, decay_apply
from grudge_stream.sketches.score_config import (
    AGGREGATORS,
    DECAY_EXPONENTIAL,
    DECAY_LINEAR,
    DECAY_NONE,
    Decay,
    Exponential,
    HASHERS,
    Linear,
    MAX_GENERATIONS,
    MAX_LEVELS,
    NoDecay,
    RotatorConfig,
    ScoreSketchConfig,
    resolve_seed,
    suggest_levels,
)

__all__ = [
    "Decay",
    "Exponential",
    "Linear",
    "NoDecay",
    "QueryDetail",
    "Rotator",
    "RotatorConfig",
    "ScoreSketch",
    "ScoreSketchConfig",
    "suggest_levels",
    "MAX_LEVELS",
    "MAX_GENERATIONS",
]
