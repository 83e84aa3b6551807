"""Build sketches from the plain dicts that topologies and snapshots carry.

A sketch config dict is JSON-friendly so it can be fingerprinted and logged::

    {"levels": 4, "cells_per_level": 100000,
     "decay": {"kind": "exponential", "lambda_per_s": 0.01},
     "lo": 0.0, "hi": 1.0, "aggregator": "min", "hasher": "siphash", "seed": 42}

Decay kinds: ``exponential`` (``lambda_per_s``), ``linear`` (``rate_per_s``),
``none``.
"""
from __future__ import annotations

from typing import Any

from grudge_stream.exceptions import ConfigError


DEFAULT_DECAY = {"kind": "exponential", "lambda_per_s": 0.01}


def build_decay(spec: dict) -> Any:
    """The decay of a config dict: the one parser (``score_config.decay_from_dict``, strict:
    a wrong kind, a missing or an unknown field is a ConfigError)."""
    from grudge_stream.sketches.score_config import decay_from_dict

    return decay_from_dict(spec)


def decay_of(conf: dict) -> Any:
    """The decay of a ScoreSketch config dict (the default when it names none)."""
    return build_decay(conf.get("decay", DEFAULT_DECAY))


def score_sketch_kwargs(conf: dict) -> dict:
    kwargs = {k: v for k, v in conf.items() if k != "decay"}
    kwargs["decay"] = decay_of(conf)
    return kwargs


def build_score_sketch(conf: dict, *, split: bool = False) -> Any:
    """A ScoreSketch, or with ``split`` a SplitScoreSketch (punishment and forgiveness kept apart)."""
    from grudge_stream import ScoreSketch
    from grudge_stream.sketches.split import SplitScoreSketch

    try:
        return (SplitScoreSketch if split else ScoreSketch)(**score_sketch_kwargs(conf))
    except TypeError as exc:
        raise ConfigError(f"bad ScoreSketch config {conf!r}: {exc}") from None


def decay_lambda_per_ms(conf: dict) -> float:
    """The exponential decay constant per millisecond, or 0 for other decays."""
    from grudge_stream.sketches.score_config import Exponential

    decay = decay_of(conf)
    return decay.lambda_per_s / 1000.0 if isinstance(decay, Exponential) else 0.0
