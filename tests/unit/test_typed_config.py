"""Operators take the typed sketch configs; dicts are turned into them once, strictly."""
from __future__ import annotations

import json

import pytest

from grudge_stream import ConfigError
from grudge_stream.operators.dedup import DedupOperator
from grudge_stream.operators.heavy import HeavyHitterOperator
from grudge_stream.operators.knownkeys import KnownKeyOperator
from grudge_stream.operators.ratelimit import RateLimitOperator
from grudge_stream.operators.scores import FeedbackScoreOperator
from grudge_stream.operators.sketchconf import (
    bloom_config,
    config_identity,
    countmin_config,
    score_sketch_config,
)
from grudge_stream.recipes import TokenBucket, TokenBucketConfig
from grudge_stream.sketches.bloom_config import BloomConfig
from grudge_stream.sketches.countmin_config import CountMinConfig
from grudge_stream.sketches.score_config import (
    DEFAULT_DECAY,
    Exponential,
    Linear,
    NoDecay,
    ScoreSketchConfig,
)

C = dict(operator_id="op", source_topic="t", partition=0)


def test_a_dict_becomes_the_config_class_with_its_defaults() -> None:
    conf = score_sketch_config({"levels": 2, "cells_per_level": 64})
    assert conf == ScoreSketchConfig(levels=2, cells_per_level=64)
    assert conf.decay is DEFAULT_DECAY == Exponential(0.01)
    assert score_sketch_config({"levels": 2, "cells_per_level": 64, "decay": {"kind": "none"}, "hi": 1.0}).decay \
        == NoDecay()
    assert countmin_config({}) == CountMinConfig()
    assert bloom_config({"capacity": 10, "fp_rate": 0.1}) == BloomConfig(capacity=10, fp_rate=0.1)
    # A config object passes through as itself.
    c = CountMinConfig(depth=2)
    assert countmin_config(c) is c


@pytest.mark.parametrize("convert, conf", [
    (score_sketch_config, {"levels": 2, "cells_per_level": 64, "decay_per_s": 1.0}),
    (score_sketch_config, {"cells_per_level": 64}),
    (score_sketch_config, {"levels": 2, "cells_per_level": 64, "decay": {"kind": "exponential"}}),
    (score_sketch_config, {"levels": 2, "cells_per_level": 64, "decay": {"kind": "linear", "rate_per_s": 1,
                                                                          "extra": 1}}),
    (countmin_config, {"depth": 2, "epoch": 5}),
    (bloom_config, {"capacity": 10}),
    (bloom_config, {"capacity": 10, "fp_rate": 0.1, "period": 5}),
    (bloom_config, "capacity=10"),
    (TokenBucketConfig.of, {"rate_per_s": 1, "burst": 2, "levls": 3}),
])
def test_unknown_or_missing_fields_are_config_errors(convert, conf) -> None:
    with pytest.raises(ConfigError):
        convert(conf)


def test_operators_take_the_config_classes_and_keep_the_fingerprints_of_their_dicts() -> None:
    sketch = {"levels": 4, "cells_per_level": 1000, "decay": {"kind": "exponential", "lambda_per_s": 0.01},
              "lo": 0.0, "hi": 1.0, "aggregator": "min", "hasher": "siphash"}
    typed = ScoreSketchConfig(levels=4, cells_per_level=1000, decay=Exponential(0.01), lo=0.0, hi=1.0,
                              aggregator="min", hasher="siphash")
    a = FeedbackScoreOperator(**C, sketch=sketch, raise_at=0.5, clear_at=0.2)
    b = FeedbackScoreOperator(**C, sketch=typed, raise_at=0.5, clear_at=0.2)
    assert a.sketch_config == b.sketch_config == typed
    assert json.dumps(a.config_dict()) == json.dumps(b.config_dict())
    assert a.fingerprint == b.fingerprint
    b.restore(a.snapshot())

    hh = {"depth": 2, "width": 128, "epoch_ms": 500, "hasher": "siphash"}
    a = HeavyHitterOperator(**C, sketch=hh, raise_at=5, clear_at=1)
    b = HeavyHitterOperator(**C, sketch=CountMinConfig(**hh), raise_at=5, clear_at=1)
    assert a.sketch_config == b.sketch_config == CountMinConfig(**hh, top_k=100)
    assert a.fingerprint == b.fingerprint
    assert a.time_scale_ms() == pytest.approx(500 / 0.6931471805599453)

    bloom = {"capacity": 100, "fp_rate": 0.01, "period_ms": 5000, "hasher": "siphash", "overload": "shrink_window"}
    for cls in (DedupOperator, KnownKeyOperator):
        a, b = cls(**C, bloom=bloom), cls(**C, bloom=BloomConfig(**bloom))
        assert a.bloom_config == b.bloom_config == BloomConfig(**bloom)
        assert a.config_dict() == b.config_dict() == {"bloom": {**{k: v for k, v in bloom.items() if k != "overload"},
                                                                "index_scheme": "independent"}}
        assert a.fingerprint == b.fingerprint
        assert a.time_scale_ms() == 5000

    flat = RateLimitOperator(**C, rate_per_s=2, burst=5, levels=3, cells_per_level=64)
    typed_rl = RateLimitOperator(**C, bucket=TokenBucketConfig(rate_per_s=2, burst=5, levels=3, cells_per_level=64))
    as_dict = RateLimitOperator(**C, bucket={"rate_per_s": 2, "burst": 5, "levels": 3, "cells_per_level": 64})
    assert flat.config_dict() == typed_rl.config_dict() == as_dict.config_dict()
    assert flat.fingerprint == typed_rl.fingerprint


def test_config_identity_leaves_out_quiet_defaults_of_config_objects_only() -> None:
    c = CountMinConfig(depth=2, width=8)
    assert config_identity(c, c) == {"depth": 2, "width": 8, "epoch_ms": 1000, "hasher": "murmur3",
                                     "index_scheme": "independent"}
    km = CountMinConfig(depth=2, width=8, index_scheme="km")  # the 0.2 identity: no field
    assert config_identity(km, km) == {"depth": 2, "width": 8, "epoch_ms": 1000, "hasher": "murmur3"}
    assert config_identity(CountMinConfig(seed=3), CountMinConfig(seed=3))["seed"] == 3
    given = {"depth": 2, "width": 8, "seed": 0}
    assert config_identity(given, countmin_config(given)) == {**given, "index_scheme": "independent"}
    given = {"depth": 2, "width": 8, "seed": 0, "index_scheme": "km"}
    assert config_identity(given, countmin_config(given)) == {"depth": 2, "width": 8, "seed": 0}


def test_conflicting_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="top_k"):
        HeavyHitterOperator(**C, sketch=CountMinConfig(top_k=5), raise_at=5, clear_at=1, top_k=10)
    HeavyHitterOperator(**C, sketch=CountMinConfig(top_k=10), raise_at=5, clear_at=1, top_k=10)
    with pytest.raises(ConfigError, match="not both"):
        RateLimitOperator(**C, bucket=TokenBucketConfig(rate_per_s=1, burst=1), burst=2)
    with pytest.raises(ConfigError):
        RateLimitOperator(**C)


def test_linear_decay_time_scale_reads_the_bounds_of_the_config() -> None:
    op = FeedbackScoreOperator(**C, sketch=ScoreSketchConfig(levels=2, cells_per_level=64, decay=Linear(2.0),
                                                             lo=0.0, hi=4.0), raise_at=3, clear_at=1)
    assert op.time_scale_ms() == 2000.0


def test_token_bucket_config_holds_the_bucket_defaults() -> None:
    conf = TokenBucketConfig(rate_per_s=1, burst=2)
    assert conf.to_dict() == {"rate_per_s": 1.0, "burst": 2.0, "reject_penalty": 0.0, "max_debt": None,
                              "levels": 4, "cells_per_level": 100_000, "hasher": "siphash", "seed": 0,
                              "index_scheme": "independent"}
    assert conf.sketch_config.hi == 2.0
    assert TokenBucketConfig(rate_per_s=1, burst=2, reject_penalty=1).sketch_config.hi == float("inf")
    bucket = TokenBucket.from_config(conf)
    assert bucket.sketch.config == conf.sketch_config
    with pytest.raises(ConfigError, match="max_debt"):
        TokenBucketConfig(rate_per_s=1, burst=2, max_debt=1)
