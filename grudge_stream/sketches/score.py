"""ScoreSketch: decaying feedback scores over unbounded keys, in fixed memory.

The public face: the compiled :class:`ScoreSketch` and :class:`Rotator`, with the
frozen config objects (the decays :class:`Exponential`, :class:`Linear`,
:class:`NoDecay`, :class:`ScoreSketchConfig`, :class:`RotatorConfig`) and the sizing
helper :func:`suggest_levels` of :mod:`grudge_stream.sketches.score_config`.
Semantics, error direction, sizing and the byte format: ``docs/score-sketch.md``.
"""

from __future__ import annotations

from grudge_stream._cyext._score import QueryDetail as QueryDetail
from grudge_stream._cyext._score import Rotator as Rotator
from grudge_stream._cyext._score import ScoreSketch as ScoreSketch
from grudge_stream._cyext._score import decay_apply  # noqa: F401
from grudge_stream.sketches import score_config as _config
from grudge_stream.sketches.score_config import *  # noqa: F401,F403 - decays, configs, sizing, re-exported
from grudge_stream.sketches.score_config import (  # noqa: F401 - used by callers of this module
    AGGREGATORS, DECAY_EXPONENTIAL, DECAY_LINEAR, DECAY_NONE, HASHERS, resolve_seed)

__all__ = sorted([*_config.__all__, "QueryDetail", "Rotator", "ScoreSketch"])
