"""Public sketch API: config objects, sizing helpers and the compiled sketch classes.

The config modules (``score_config``, ``countmin_config``, ``bloom_config``) are pure
Python and never import a kernel; the kernels import them. Names here load on first
use, so importing a config module does not load the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grudge_stream._lazy import lazy_exports

_LAZY = {
    "DecayingCountMin": "grudge_stream.sketches.countmin",
    "ForgettingBloom": "grudge_stream.sketches.bloom",
    "Exponential": "grudge_stream.sketches.score_config",
    "Linear": "grudge_stream.sketches.score_config",
    "NoDecay": "grudge_stream.sketches.score_config",
    "RotatorConfig": "grudge_stream.sketches.score_config",
    "ScoreSketchConfig": "grudge_stream.sketches.score_config",
    "suggest_levels": "grudge_stream.sketches.score_config",
    "ScoreSizing": "grudge_stream.sketches.score_config",
    "score_sizing": "grudge_stream.sketches.score_config",
    "CountMinSizing": "grudge_stream.sketches.countmin_config",
    "countmin_sizing": "grudge_stream.sketches.countmin_config",
    "BloomSizing": "grudge_stream.sketches.bloom_config",
    "bloom_sizing": "grudge_stream.sketches.bloom_config",
    "QueryDetail": "grudge_stream.sketches.score",
    "Rotator": "grudge_stream.sketches.score",
    "ScoreSketch": "grudge_stream.sketches.score",
    "SplitScoreSketch": "grudge_stream.sketches.split",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from grudge_stream.sketches.bloom import ForgettingBloom
    from grudge_stream.sketches.bloom_config import BloomSizing, bloom_sizing
    from grudge_stream.sketches.countmin import DecayingCountMin
    from grudge_stream.sketches.countmin_config import CountMinSizing, countmin_sizing
    from grudge_stream.sketches.score import QueryDetail, Rotator, ScoreSketch
    from grudge_stream.sketches.score_config import (Exponential, Linear, NoDecay, RotatorConfig,
                                                     ScoreSizing, ScoreSketchConfig, score_sizing,
                                                     suggest_levels)
    from grudge_stream.sketches.split import SplitScoreSketch


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
