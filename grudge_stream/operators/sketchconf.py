"""The sketch configs of operators: typed at the boundary, and their identity in fingerprints.

Operators take the frozen config classes (``ScoreSketchConfig``, ``CountMinConfig``,
``BloomConfig``) or, for compatibility, a dict of their fields, which is turned into the
config class once, here (one function per sketch kind, strict: an unknown field is a
ConfigError; an absent one takes the config class's default)::

    {"levels": 4, "cells_per_level": 100000,
     "decay": {"kind": "exponential", "lambda_per_s": 0.01},
     "lo": 0.0, "hi": 1.0, "aggregator": "min", "hasher": "siphash"}

Decay kinds: ``exponential`` (``lambda_per_s``), ``linear`` (``rate_per_s``), ``none``
(the one parser: ``score_config.decay_from_dict``).

An operator's ``config_dict()`` feeds the fingerprint stored in its snapshots, so the
sketch part of it (``config_identity``) keeps the form it always had: a dict stays as it
was given; a config object shows its fields minus the ones that stay out at their default
(the form the shipped topologies always produced), so a topology that moves from dicts to
config objects keeps its fingerprints. Either way the identity names the index scheme
(``"index_scheme": "independent"``) unless it is ``km``, the only scheme of grudge-stream
0.2: a KM operator keeps 0.2's fingerprint, and a snapshot of one scheme is foreign to an
operator of the other.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

from grudge_stream.exceptions import ConfigError
from grudge_stream.sketches._validate import scheme_dict
from grudge_stream.sketches.bloom_config import BloomConfig
from grudge_stream.sketches.countmin_config import CountMinConfig
from grudge_stream.sketches.score_config import (
    DEFAULT_DECAY,
    Exponential,
    ScoreSketchConfig,
    decay_from_dict,
)

__all__ = ["DEFAULT_DECAY", "bloom_config", "build_bloom", "build_countmin", "build_decay",
           "build_score_sketch", "config_identity", "countmin_config", "decay_lambda_per_ms", "decay_of",
           "score_sketch_config", "score_sketch_kwargs"]

# Fields left out of a config object's identity while they hold their default (the shipped
# topologies never named them, and their fingerprints are stored in snapshots).
QUIET_DEFAULTS: dict[type, tuple[str, ...]] = {
    ScoreSketchConfig: ("seed",),
    CountMinConfig: ("counter_bits", "seed", "top_k"),
    BloomConfig: ("generations", "seed", "overload"),
}


def score_sketch_config(conf: ScoreSketchConfig | Mapping) -> ScoreSketchConfig:
    """A ScoreSketch config from the config object or a dict of its fields."""
    return ScoreSketchConfig.of(conf)


def countmin_config(conf: CountMinConfig | Mapping) -> CountMinConfig:
    """A DecayingCountMin config from the config object or a dict of its fields."""
    return CountMinConfig.of(conf)


def bloom_config(conf: BloomConfig | Mapping) -> BloomConfig:
    """A ForgettingBloom config from the config object or a dict of its fields."""
    return BloomConfig.of(conf)


def config_identity(given: Any, config: Any) -> dict:
    """The sketch config as an operator's ``config_dict()`` shows it (see the module doc):
    ``given`` as it was given when a dict, else the config's fields minus the quiet
    defaults."""
    if isinstance(given, Mapping):
        # As given, plus the index scheme the dict left to its default: the identity names
        # the scheme unless it is km (the 0.2 form, so 0.2 snapshots keep their fingerprint).
        return scheme_dict({**given, "index_scheme": config.index_scheme})
    d = config.to_dict()
    defaults = {f.name: f.default for f in fields(config)}
    for name in QUIET_DEFAULTS[type(config)]:
        if d[name] == defaults[name]:
            del d[name]
    return d


def build_decay(spec: dict) -> Any:
    """The decay of its dict form: the one parser (``score_config.decay_from_dict``, strict:
    a wrong kind, a missing or an unknown field is a ConfigError)."""
    return decay_from_dict(spec)


def build_score_sketch(conf: ScoreSketchConfig | Mapping, *, split: bool = False) -> Any:
    """A ScoreSketch, or with ``split`` a SplitScoreSketch (punishment and forgiveness kept apart)."""
    from grudge_stream import ScoreSketch
    from grudge_stream.sketches.split import SplitScoreSketch

    config = score_sketch_config(conf)
    try:
        return (SplitScoreSketch if split else ScoreSketch)(**config.kwargs())
    except TypeError as exc:  # pragma: no cover - the config was validated
        raise ConfigError(f"bad ScoreSketch config {config!r}: {exc}") from None


def build_countmin(conf: CountMinConfig | Mapping) -> Any:
    from grudge_stream import DecayingCountMin

    return DecayingCountMin(**countmin_config(conf).kwargs())


def build_bloom(conf: BloomConfig | Mapping) -> Any:
    from grudge_stream import ForgettingBloom

    return ForgettingBloom(**bloom_config(conf).kwargs())


def decay_of(conf: ScoreSketchConfig | Mapping) -> Any:
    """The decay of a ScoreSketch config (``DEFAULT_DECAY`` when a dict names none)."""
    return score_sketch_config(conf).decay


def score_sketch_kwargs(conf: ScoreSketchConfig | Mapping) -> dict:
    """ScoreSketch constructor arguments of a config (``ScoreSketchConfig.kwargs``)."""
    return score_sketch_config(conf).kwargs()


def decay_lambda_per_ms(conf: ScoreSketchConfig | Mapping) -> float:
    """The exponential decay constant per millisecond, or 0 for other decays."""
    decay = score_sketch_config(conf).decay
    return decay.lambda_per_s / 1000.0 if isinstance(decay, Exponential) else 0.0
