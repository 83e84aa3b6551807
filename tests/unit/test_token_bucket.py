"""The token-bucket recipe against a scalar debt model, boundaries and bursts."""

from __future__ import annotations

import math
import pathlib
import random
import sys
import threading

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "property"))
from score_reference import ScalarBucket

from grudge_stream import ConfigError, InvalidInputError, ManualClock, ScoreSketch
from grudge_stream.recipes import Decision, TokenBucket

CONFIGS = [
    dict(rate_per_s=10.0, burst=5.0),
    dict(rate_per_s=0.37, burst=3.3),
    dict(rate_per_s=1000.0, burst=1.0),
    dict(rate_per_s=2.5, burst=10.0, reject_penalty=1.5),
    dict(rate_per_s=2.5, burst=10.0, reject_penalty=4.0, max_debt=25.0),
    dict(rate_per_s=7.0, burst=2.0, max_debt=6.0),
]


def model_of(cfg) -> ScalarBucket:
    b = TokenBucket(**cfg, seed=0)
    return ScalarBucket(cfg["rate_per_s"], cfg["burst"], cfg.get("reject_penalty", 0.0), b.max_debt)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_decisions_match_a_scalar_debt_model_one_for_one(cfg) -> None:
    rnd = random.Random(CONFIGS.index(cfg))
    for hasher in ("siphash", "murmur3"):
        bucket = TokenBucket(
            **cfg, hasher=hasher, seed=rnd.getrandbits(64), cells_per_level=1 << 16
        )
        keys = [f"client-{i}".encode() for i in range(8)]
        models = {k: model_of(cfg) for k in keys}
        t = rnd.randint(0, 10**12)
        for _ in range(4000):
            t += rnd.choice(
                [0, 0, 1, 3, 17, 120, 999, rnd.randint(0, 20_000), -rnd.randint(1, 800)]
            )
            k = rnd.choice(keys)
            cost = rnd.choice([0.0, 0.5, 1.0, 1.0, 2.0, 3.7, cfg["burst"], cfg["burst"] * 1.5])
            got = bucket.allow(k, cost, now_ms=t)
            ok, retry, debt = models[k].allow(cost, t)
            assert (got.allowed, got.retry_after_ms, got.debt) == (ok, retry, debt)
            assert bool(got) is ok


@pytest.mark.parametrize("cfg", CONFIGS)
def test_retry_after_is_exact_to_the_millisecond(cfg) -> None:
    rnd = random.Random(5)
    bucket = TokenBucket(**cfg, seed=1, cells_per_level=64)
    t = 1_000_000
    checked = 0
    for _ in range(600):
        t += rnd.choice([0, 1, 5, 40, 300])
        cost = rnd.choice([1.0, 1.0, 0.5, 2.0]) if cfg["burst"] >= 2 else 1.0
        d = bucket.allow(b"k", cost, now_ms=t)
        if d.allowed:
            assert d.retry_after_ms == 0
            continue
        w = d.retry_after_ms
        assert w is not None and w >= 1
        blob = bucket.sketch.to_bytes()
        before = TokenBucket.from_sketch(ScoreSketch.from_bytes(blob), burst=cfg["burst"])
        at = TokenBucket.from_sketch(ScoreSketch.from_bytes(blob), burst=cfg["burst"])
        assert not before.allow(b"k", cost, now_ms=t + w - 1).allowed
        assert at.allow(b"k", cost, now_ms=t + w).allowed
        checked += 1
    assert checked > 50


def test_burst_then_sustain() -> None:
    bucket = TokenBucket(rate_per_s=10.0, burst=5.0, seed=2)
    burst = [bucket.allow(b"ip", now_ms=0).allowed for _ in range(20)]
    assert burst == [True] * 5 + [False] * 15
    # At exactly the refill rate every request passes...
    assert all(bucket.allow(b"ip", now_ms=100 * i).allowed for i in range(1, 101))
    # ...at twice the rate, every other one.
    got = [bucket.allow(b"ip", now_ms=10_000 + 50 * i).allowed for i in range(1, 201)]
    assert sum(got) == 100
    # After idling, the bucket is full again but never fuller than burst.
    assert [bucket.allow(b"ip", now_ms=60_000).allowed for _ in range(7)] == [True] * 5 + [
        False
    ] * 2


def test_fresh_key_is_a_full_bucket_and_tokens_report() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=3.0, seed=3)
    assert bucket.tokens(b"new", now_ms=0) == 3.0 and bucket.debt(b"new", now_ms=0) == 0.0
    bucket.allow(b"new", 2.0, now_ms=0)
    assert bucket.tokens(b"new", now_ms=0) == 1.0
    assert bucket.tokens(b"new", now_ms=1_500) == 2.5


def test_reject_penalty_and_max_debt() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=2.0, reject_penalty=5.0, max_debt=12.0, seed=4)
    assert bucket.allow(b"a", 2.0, now_ms=0).allowed
    d = bucket.allow(b"a", 1.0, now_ms=0)
    assert not d.allowed and d.debt == 7.0 and d.retry_after_ms == 6_000
    for _ in range(5):
        d = bucket.allow(b"a", 1.0, now_ms=0)
    assert d.debt == 12.0 and d.retry_after_ms == 11_000  # capped at max_debt
    plain = TokenBucket(rate_per_s=1.0, burst=2.0, seed=4)
    plain.allow(b"a", 2.0, now_ms=0)
    for _ in range(5):
        d = plain.allow(b"a", 1.0, now_ms=0)
    assert d.debt == 2.0 and d.retry_after_ms == 1_000  # no penalty: hammering costs nothing
    assert TokenBucket(rate_per_s=1.0, burst=2.0, reject_penalty=1.0).max_debt == math.inf


def test_a_cost_above_burst_is_never_admitted() -> None:
    bucket = TokenBucket(rate_per_s=100.0, burst=5.0, seed=5)
    d = bucket.allow(b"k", 5.5, now_ms=0)
    assert d == Decision(False, None, 0.0)
    assert bucket.allow(b"k", 5.0, now_ms=0).allowed


def test_clock_and_keys() -> None:
    clock = ManualClock(0)
    bucket = TokenBucket(rate_per_s=1.0, burst=1.0, clock=clock, seed=6)
    assert bucket.allow("gr\u00fc\u00dfe").allowed
    d = bucket.allow("gr\u00fc\u00dfe".encode())
    assert not d.allowed and d.retry_after_ms == 1_000
    clock.advance(999)
    assert not bucket.allow("gr\u00fc\u00dfe").allowed
    clock.advance(1)
    assert bucket.allow("gr\u00fc\u00dfe").allowed


def test_strict_under_32_threads() -> None:
    bucket = TokenBucket(rate_per_s=1e-9, burst=1_000.0, seed=7)
    counts = [0] * 32
    barrier = threading.Barrier(32)

    def worker(i: int) -> None:
        barrier.wait()
        counts[i] = sum(bucket.allow(b"shared", 1.0, now_ms=0).allowed for _ in range(100))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sum(counts) == 1_000


@pytest.mark.parametrize(
    "kw",
    [
        dict(rate_per_s=0.0, burst=1.0),
        dict(rate_per_s=-1.0, burst=1.0),
        dict(rate_per_s=math.inf, burst=1.0),
        dict(rate_per_s=1.0, burst=0.0),
        dict(rate_per_s=1.0, burst=math.nan),
        dict(rate_per_s=1.0, burst=1.0, reject_penalty=-1.0),
        dict(rate_per_s=1.0, burst=2.0, max_debt=1.0),
        dict(rate_per_s=True, burst=1.0),
        dict(rate_per_s=1.0, burst=1.0, hasher="md5"),
    ],
)
def test_invalid_bucket_configs(kw) -> None:
    with pytest.raises(ConfigError):
        TokenBucket(**kw)


def test_invalid_costs_touch_nothing() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=2.0, seed=8)
    bucket.allow(b"k", 1.0, now_ms=0)
    before = bucket.sketch.to_bytes()
    for bad in (-1.0, math.nan, math.inf, "1", True):
        with pytest.raises(InvalidInputError):
            bucket.allow(b"k", bad, now_ms=1)  # type: ignore[arg-type]
    assert bucket.sketch.to_bytes() == before


def test_from_sketch_checks_the_model() -> None:
    from grudge_stream import Exponential, Linear

    with pytest.raises(ConfigError):
        TokenBucket.from_sketch(
            ScoreSketch(levels=1, cells_per_level=8, decay=Exponential(1.0)), burst=1.0
        )
    with pytest.raises(ConfigError):
        TokenBucket.from_sketch(
            ScoreSketch(levels=1, cells_per_level=8, decay=Linear(1.0), hi=1.0), burst=2.0
        )
    b = TokenBucket.from_sketch(
        ScoreSketch(levels=1, cells_per_level=8, decay=Linear(2.0), hi=4.0), burst=4.0
    )
    assert b.rate_per_s == 2.0 and b.allow(b"k", 4.0, now_ms=0).allowed
