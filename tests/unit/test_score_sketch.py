"""ScoreSketch semantics: the per-cell step, decays, clamping, try_update, time, inputs."""

from __future__ import annotations

import importlib.machinery
import math
import random

import numpy as np
import pytest

import grudge_stream._cyext._score as kernel
from grudge_stream import (
    ConfigError,
    EventClock,
    Exponential,
    InvalidInputError,
    Linear,
    ManualClock,
    NoDecay,
    ScoreSketch,
    suggest_levels,
)
from grudge_stream.hashing import hash64, level_indexes
from grudge_stream.sketches import QueryDetail, ScoreSketchConfig

INF = math.inf


def sketch(**kw) -> ScoreSketch:
    base = dict(levels=4, cells_per_level=1000, decay=Exponential(0.01), lo=0.0, hi=10.0, seed=42)
    base.update(kw)
    return ScoreSketch(**base)


def test_kernel_is_the_installed_compiled_extension() -> None:
    path = kernel.__file__
    assert any(path.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES), path
    assert "site-packages" in path
    assert ScoreSketch is kernel.ScoreSketch  # the compiled class itself, no Python twin


def test_spec_example_and_test_vector() -> None:
    s = ScoreSketch(
        levels=4,
        cells_per_level=100_000,
        decay=Exponential(0.01),
        lo=0.0,
        hi=1.0,
        aggregator="min",
        hasher="murmur3",
        seed=42,
    )
    s.update(b"client-7", 0.04, now_ms=1_000)
    assert s.query(b"client-7", now_ms=2_000) == 0.04 * math.exp(-0.01 * (1000 / 1000.0))
    assert s.try_update(b"client-7", 1.0, limit=3.0, now_ms=2_000) is True
    r = s.query_detailed(b"client-42", now_ms=2_000)
    assert isinstance(r, QueryDetail)
    assert r.cell_indexes == (70352, 10727, 84211, 9090)  # independent levels (the default)
    km = ScoreSketch(levels=4, cells_per_level=100_000, decay=Exponential(0.01), seed=42, index_scheme="km")
    assert km.query_detailed(b"client-42", now_ms=2_000).cell_indexes == (19472, 64389, 9306, 86927)
    assert r.aggregate == 0.0 and r.level_scores == (0.0, 0.0, 0.0, 0.0)
    assert tuple(r) == (r.aggregate, r.level_scores, r.cell_indexes)  # also a plain tuple


def test_indexes_follow_the_scheme_of_the_key_hash_for_both_hashers() -> None:
    for hasher in ("murmur3", "siphash"):
        for scheme in ("independent", "km"):
            s = sketch(hasher=hasher, seed=0xDEADBEEF, cells_per_level=97, levels=5, index_scheme=scheme)
            for key in (b"", b"a", "gr\u00fc\u00dfe", b"x" * 1000):
                h = hash64(key, 0xDEADBEEF, hasher)
                assert s.key_hash(key) == h
                assert list(s.query_detailed(key, now_ms=0).cell_indexes) == level_indexes(h, 5, 97, scheme)


def test_fresh_key_reads_zero() -> None:
    for agg in ("min", "max", "mean"):
        s = sketch(aggregator=agg, lo=-5.0)
        assert s.query(b"never-seen", now_ms=123) == 0.0


def test_reads_write_back_decay() -> None:
    s = sketch(levels=2, decay=Linear(1.0))
    s.update(b"k", 5.0, now_ms=0)
    before = s._cells()
    assert s.query(b"k", now_ms=2_000) == 3.0
    after = s._cells()
    idx = s.query_detailed(b"k", now_ms=2_000).cell_indexes
    for level, j in enumerate(idx):
        assert before[level, j]["score"] == 5.0 and before[level, j]["last_ms"] == 0
        assert after[level, j]["score"] == 3.0 and after[level, j]["last_ms"] == 2_000


def test_clamp_after_add_per_cell() -> None:
    s = sketch(decay=NoDecay(), lo=-1.0, hi=1.0, levels=1, cells_per_level=1)
    assert s.update_and_query(b"a", 0.7, now_ms=0) == 0.7
    assert s.update_and_query(b"a", 0.7, now_ms=0) == 1.0  # clamped at hi
    assert s.update_and_query(b"a", -5.0, now_ms=0) == -1.0  # clamped at lo
    assert s.update_and_query(b"a", 0.5, now_ms=0) == -0.5  # the clamp is not sticky


def test_clamp_is_per_cell_before_aggregation() -> None:
    # One level's cell is shared with a heavy key and pinned at hi; min still reads the other.
    s = ScoreSketch(levels=2, cells_per_level=3, decay=NoDecay(), lo=0.0, hi=2.0, seed=1)
    keys = [bytes([i]) for i in range(200)]
    idx = {k: s.query_detailed(k, now_ms=0).cell_indexes for k in keys}
    a, b = next(
        (a, b) for a in keys for b in keys if idx[a][0] == idx[b][0] and idx[a][1] != idx[b][1]
    )
    s.update(b, 10.0, now_ms=0)
    s.update(a, 1.0, now_ms=0)
    d = s.query_detailed(a, now_ms=0)
    assert d.level_scores[0] == 2.0 and d.level_scores[1] == 1.0 and d.aggregate == 1.0


def test_update_and_query_returns_post_clamp_aggregate() -> None:
    s = sketch(hi=1.0, decay=NoDecay())
    assert s.update_and_query(b"k", 3.0, now_ms=0) == 1.0


def test_aggregators() -> None:
    for agg, expect in (("min", 1.0), ("max", 4.0), ("mean", 2.5)):
        s = ScoreSketch(
            levels=2, cells_per_level=3, decay=NoDecay(), lo=0.0, hi=100.0, seed=1, aggregator=agg
        )
        keys = [bytes([i]) for i in range(200)]
        idx = {k: s.query_detailed(k, now_ms=0).cell_indexes for k in keys}
        a, b = next(
            (a, b) for a in keys for b in keys if idx[a][0] == idx[b][0] and idx[a][1] != idx[b][1]
        )
        s.update(b, 3.0, now_ms=0)
        s.update(a, 1.0, now_ms=0)
        assert s.query(a, now_ms=0) == expect


# ---- decays -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "decay", [Exponential(0.3), Exponential(1e-6), Linear(0.7), Linear(250.0), NoDecay()]
)
def test_decay_composes_and_is_monotone(decay) -> None:
    rnd = random.Random(5)
    for _ in range(2000):
        s = rnd.choice([1.0, -1.0]) * rnd.uniform(0, 1000)
        t1, t2 = rnd.randint(0, 50_000), rnd.randint(0, 50_000)
        one = decay.apply(s, t1 + t2)
        two = decay.apply(decay.apply(s, t1), t2)
        assert one == pytest.approx(two, rel=1e-12, abs=1e-9)
        # toward zero, never past it, never growing
        assert abs(decay.apply(s, t1)) <= abs(s)
        assert decay.apply(s, t1) * s >= 0
        assert abs(decay.apply(s, t1 + t2)) <= abs(decay.apply(s, t1))
    assert decay.apply(2.5, 0) == 2.5 and decay.apply(2.5, -10) == 2.5


def test_decay_formulas() -> None:
    assert Exponential(0.1).apply(0.9, 1) == 0.9 * math.exp(-0.1 * (1 / 1000.0))
    assert Linear(2.0).apply(5.0, 1500) == 5.0 - (2.0 * 1500) / 1000.0
    assert Linear(2.0).apply(5.0, 10_000) == 0.0  # never crosses 0
    assert Linear(2.0).apply(-5.0, 1500) == -2.0  # negative rises
    assert Linear(2.0).apply(-5.0, 10_000) == 0.0
    assert NoDecay().apply(7.0, 10**9) == 7.0
    assert Exponential.from_half_life(10.0).apply(8.0, 10_000) == pytest.approx(4.0)
    assert Exponential(0.0).half_life_s == INF


def test_the_sketch_uses_the_decay_objects_arithmetic() -> None:
    for decay in (Exponential(0.37), Linear(3.3)):
        s = sketch(decay=decay, levels=1, cells_per_level=1, lo=-10.0)
        s.update(b"k", 7.25, now_ms=100)
        assert s.query(b"k", now_ms=1_337) == decay.apply(7.25, 1_237)


def test_linear_never_crosses_zero_in_the_sketch() -> None:
    s = sketch(decay=Linear(1.0), lo=-10.0, levels=1)
    s.update(b"p", 2.0, now_ms=0)
    s.update(b"n", -2.0, now_ms=0)
    assert s.query(b"p", now_ms=1_000) == 1.0 and s.query(b"n", now_ms=1_000) == -1.0
    assert s.query(b"p", now_ms=60_000) == 0.0 and s.query(b"n", now_ms=60_000) == 0.0


# ---- time -------------------------------------------------------------------------


def test_late_events_do_not_decay_and_do_not_move_stamps_back() -> None:
    s = sketch(decay=Linear(1.0), levels=1, cells_per_level=1)
    s.update(b"k", 5.0, now_ms=10_000)
    assert s.update_and_query(b"k", 1.0, now_ms=4_000) == 6.0  # dt = max(0, 4000 - 10000) = 0
    cell = s._cells()[0, 0]
    assert cell["last_ms"] == 10_000
    assert s.query(b"k", now_ms=11_000) == 5.0  # decays once, from 10 s
    assert s.watermark_ms == 11_000


def test_negative_and_extreme_timestamps_are_legal() -> None:
    s = sketch(decay=Linear(1.0))
    s.update(b"k", 5.0, now_ms=-5_000)
    assert s.query(b"k", now_ms=-4_000) == 4.0
    s.update(b"k", 1.0, now_ms=2**63 - 1)
    assert s.query(b"k", now_ms=2**63 - 1) == 1.0
    with pytest.raises(InvalidInputError):
        s.update(b"k", 1.0, now_ms=-(2**63))  # the never-stamped sentinel
    with pytest.raises(InvalidInputError):
        s.update(b"k", 1.0, now_ms=2**63)
    with pytest.raises(TypeError):
        s.update(b"k", 1.0, now_ms=True)
    with pytest.raises(InvalidInputError):
        s.update(b"k", 1.0, now_ms=float("nan"))
    assert s.query(b"k", now_ms=np.int64(2**63 - 1)) == 1.0


def test_clock_is_used_when_now_ms_is_omitted() -> None:
    clock = ManualClock(1_000)
    s = sketch(decay=Linear(1.0), clock=clock)
    s.update(b"k", 5.0)
    clock.advance(2_000)
    assert s.query(b"k") == 3.0
    assert s.query_many([b"k", b"k"]).tolist() == [3.0, 3.0]
    ev = EventClock()
    s2 = sketch(decay=Linear(1.0), clock=ev)
    ev.observe(10_000)
    s2.update(b"k", 5.0)
    ev.observe(9_000)  # late: the watermark stays
    assert s2.query(b"k") == 5.0
    assert s2.clock is ev


def test_system_clock_by_default() -> None:
    import time

    s = sketch(decay=NoDecay())
    before = time.time_ns() // 1_000_000
    s.update(b"k", 1.0)
    after = time.time_ns() // 1_000_000
    assert before <= s.watermark_ms <= after


def test_bad_clock_is_refused() -> None:
    with pytest.raises(ConfigError):
        sketch(clock=object())


# ---- try_update ----------------------------------------------------------------------


def test_try_update_is_inclusive_and_checked_before_clamping() -> None:
    s = sketch(decay=NoDecay(), hi=1.0, levels=1, cells_per_level=1)
    s.update(b"k", 0.9, now_ms=0)
    assert s.try_update(b"k", 0.5, limit=1.4, now_ms=0) is True  # 0.9 + 0.5 <= 1.4, then clamped
    assert s.query(b"k", now_ms=0) == 1.0
    assert s.try_update(b"k", 0.5, limit=1.4, now_ms=0) is False  # 1.0 + 0.5 > 1.4
    assert s.try_update(b"k", 0.0, limit=1.0, now_ms=0) is True  # equality admits


def test_try_update_refusal_still_decays_and_stamps() -> None:
    s = sketch(decay=Linear(1.0), levels=2)
    s.update(b"k", 5.0, now_ms=0)
    assert s.try_update(b"k", 3.0, limit=4.0, now_ms=1_000) is False  # 4 + 3 > 4
    cells = s._cells()
    for level, j in enumerate(s.query_detailed(b"k", now_ms=1_000).cell_indexes):
        assert cells[level, j]["score"] == 4.0 and cells[level, j]["last_ms"] == 1_000


def test_min_overestimates_never_under_with_non_negative_deltas_under_collisions() -> None:
    rnd = random.Random(11)
    for decay in (NoDecay(), Exponential(0.5), Linear(0.2)):
        s = ScoreSketch(levels=3, cells_per_level=7, decay=decay, lo=0.0, hi=1e12, seed=3)
        exact: dict = {}
        t = 0
        for _ in range(3000):
            t += rnd.randint(0, 300)
            k = rnd.randrange(60).to_bytes(2, "big")
            d = rnd.uniform(0, 5)
            score, last = exact.get(k, (0.0, t))
            score = decay.apply(score, t - last) + d
            exact[k] = (score, t)
            s.update(k, d, now_ms=t)
            kq = rnd.randrange(80).to_bytes(2, "big")
            es, el = exact.get(kq, (0.0, t))
            truth = decay.apply(es, t - el)
            assert s.query(kq, now_ms=t) >= truth * (1 - 1e-12) - 1e-300


def test_exact_when_a_cell_is_not_shared() -> None:
    s = ScoreSketch(
        levels=4, cells_per_level=1 << 20, decay=Exponential(0.2), lo=0.0, hi=INF, seed=9
    )
    rnd = random.Random(2)
    exact = {}
    t = 0
    for _ in range(500):
        t += rnd.randint(1, 1000)
        k = rnd.randrange(20).to_bytes(1, "big")
        d = rnd.uniform(0, 3)
        got = s.update_and_query(k, d, now_ms=t)
        score, last = exact.get(k, (0.0, t))
        exact[k] = (Exponential(0.2).apply(score, t - last) + d, t)
        assert got == exact[k][0]  # bit-exact: same decay steps as a per-key model


def test_mixed_sign_deltas_can_underestimate() -> None:
    # Documented: with negative deltas a colliding key can pull a shared cell down.
    s = ScoreSketch(levels=1, cells_per_level=1, decay=NoDecay(), lo=-10.0, hi=10.0, seed=0)
    s.update(b"a", 3.0, now_ms=0)
    s.update(b"b", -2.0, now_ms=0)
    assert s.query(b"a", now_ms=0) == 1.0  # a's exact score is 3.0


# ---- validation: nothing is touched by bad input ------------------------------------------


def _state(s: ScoreSketch) -> bytes:
    return s.to_bytes()


@pytest.mark.parametrize("bad", [float("nan"), INF, -INF])
def test_non_finite_deltas_and_limits_touch_nothing(bad) -> None:
    s = sketch()
    s.update(b"k", 1.0, now_ms=5)
    before = _state(s)
    for call in (
        lambda: s.update(b"k", bad, now_ms=10),
        lambda: s.update_and_query(b"k", bad, now_ms=10),
        lambda: s.try_update(b"k", bad, 1.0, now_ms=10),
        lambda: s.try_update(b"k", 1.0, bad, now_ms=10),
        lambda: s.update_many([b"a", b"k", b"b"], [1.0, bad, 1.0], now_ms=10),
        lambda: s.update_many([b"a", b"k"], bad, now_ms=10),
        lambda: s.try_update_many([b"a", b"k"], 1.0, [1.0, bad], now_ms=10),
        lambda: s.update_and_query_many(np.array([1, 2], dtype=np.uint64), [bad, 1.0], now_ms=10),
    ):
        with pytest.raises(InvalidInputError):
            call()
        assert _state(s) == before


def test_bad_batch_inputs_touch_nothing() -> None:
    s = sketch()
    s.update(b"k", 1.0, now_ms=5)
    before = _state(s)
    bad_calls = [
        (TypeError, lambda: s.update_many([b"a", 3, b"b"], 1.0, now_ms=10)),
        (TypeError, lambda: s.update_many(b"abc", 1.0, now_ms=10)),
        (TypeError, lambda: s.update_many(np.array([1, 2], dtype=np.int64), 1.0, now_ms=10)),
        (TypeError, lambda: s.update_many(np.array([b"ab", b"cd"]), 1.0, now_ms=10)),
        (InvalidInputError, lambda: s.update_many([b"a", b"b"], [1.0], now_ms=10)),
        (InvalidInputError, lambda: s.update_many([b"a", b"b"], 1.0, now_ms=[1, 2, 3])),
        (TypeError, lambda: s.update_many([b"a", b"b"], 1.0, now_ms=[True, False])),
        (TypeError, lambda: s.update_many([b"a", b"b"], 1.0, now_ms=["1", "2"])),
        (InvalidInputError, lambda: s.update_many([b"a", b"b"], 1.0, now_ms=[1.0, math.nan])),
        (InvalidInputError, lambda: s.update_many([b"a", b"b"], 1.0, now_ms=[1, -(2**63)])),
        (
            InvalidInputError,
            lambda: s.update_many([b"a"], 1.0, now_ms=np.array([2**64 - 1], dtype=np.uint64)),
        ),
        (TypeError, lambda: s.update_many([b"a", b"b"], ["x", "y"], now_ms=10)),
        (TypeError, lambda: s.update_many([b"a", b"b"], [True, False], now_ms=10)),
        (TypeError, lambda: s.update(3, 1.0, now_ms=10)),
        (TypeError, lambda: s.update(b"k", "1.0", now_ms=10)),
    ]
    for exc, call in bad_calls:
        with pytest.raises(exc):
            call()
        assert _state(s) == before


@pytest.mark.parametrize(
    "kw",
    [
        dict(levels=0),
        dict(levels=65),
        dict(levels=True),
        dict(levels=2.0),
        dict(cells_per_level=0),
        dict(cells_per_level=2**32),
        dict(decay=None),
        dict(decay="exponential"),
        dict(lo=1.0, hi=2.0),
        dict(lo=-2.0, hi=-1.0),
        dict(lo=1.0, hi=1.0),
        dict(lo=0.0, hi=0.0),
        dict(lo=float("nan")),
        dict(hi=float("nan")),
        dict(hi="1"),
        dict(decay=NoDecay(), hi=INF),
        dict(decay=NoDecay(), lo=-INF),
        dict(aggregator="median"),
        dict(hasher="md5"),
        dict(seed=-1),
        dict(seed=2**64),
        dict(seed=True),
        dict(seed=1.5),
    ],
)
def test_invalid_configs_raise_config_error(kw) -> None:
    with pytest.raises(ConfigError):
        sketch(**kw)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), INF, True, "0.1"])
def test_invalid_decay_parameters(bad) -> None:
    with pytest.raises(ConfigError):
        Exponential(bad)
    with pytest.raises(ConfigError):
        Linear(bad)


def test_infinite_bounds_with_decay_and_saturation() -> None:
    s = sketch(decay=Exponential(0.1), lo=-INF, hi=INF, levels=1, cells_per_level=1)
    s.update(b"k", 1.7976931348623157e308, now_ms=0)
    assert s.update_and_query(b"k", 1.7976931348623157e308, now_ms=0) == 1.7976931348623157e308
    assert math.isfinite(s.query(b"k", now_ms=10**12))
    assert s.update_and_query(b"k", -1e308, now_ms=10**12) == -1e308
    s2 = ScoreSketch.from_bytes(s.to_bytes())
    assert s2.config.hi == INF and s2.config.lo == -INF


def test_config_is_frozen_and_complete() -> None:
    s = sketch(seed=7)
    cfg = s.config
    assert isinstance(cfg, ScoreSketchConfig)
    assert (
        cfg.levels,
        cfg.cells_per_level,
        cfg.lo,
        cfg.hi,
        cfg.aggregator,
        cfg.hasher,
        cfg.seed,
    ) == (4, 1000, 0.0, 10.0, "min", "murmur3", 7)
    with pytest.raises(AttributeError):
        cfg.levels = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        s.config = cfg  # type: ignore[misc]
    assert s.seed == 7 and s.levels == 4 and s.cells_per_level == 1000


def test_seed_none_is_seed_zero_no_randomness_without_a_seed() -> None:
    a, b = sketch(seed=None), sketch(seed=None)
    assert a.seed == b.seed == 0
    c = sketch(seed=0)
    a.update(b"x", 1.0, now_ms=1)
    c.update(b"x", 1.0, now_ms=1)
    assert a.to_bytes() == c.to_bytes()


def test_memory_bytes_formula_and_size() -> None:
    for levels, m in ((1, 1), (4, 100_000), (3, 12_345)):
        s = ScoreSketch(levels=levels, cells_per_level=m, decay=NoDecay(), hi=1.0, seed=1)
        assert s.memory_bytes() == 16 * levels * m + ScoreSketch.__basicsize__
        assert ScoreSketch.__basicsize__ < 512


def test_keys_str_bytearray_empty_and_huge() -> None:
    s = sketch(decay=NoDecay())
    s.update("gr\u00fc\u00dfe", 1.0, now_ms=0)
    assert s.query("gr\u00fc\u00dfe".encode(), now_ms=0) == 1.0
    s.update(bytearray(b"ba"), 2.0, now_ms=0)
    assert s.query(b"ba", now_ms=0) == 2.0
    s.update(b"", 3.0, now_ms=0)
    assert s.query("", now_ms=0) == 3.0
    big = bytes(1 << 20)
    s.update(big, 4.0, now_ms=0)
    assert s.query(big, now_ms=0) == 4.0


def test_determinism_same_inputs_same_state() -> None:
    def run() -> bytes:
        s = sketch(seed=123, decay=Exponential(0.3))
        rnd = random.Random(99)
        for t in range(2000):
            s.update(rnd.randbytes(4), rnd.uniform(-1, 3), now_ms=t * 7)
        return s.to_bytes()

    assert run() == run()


def test_pickle_is_refused_and_copy_is_independent() -> None:
    import copy
    import pickle

    s = sketch()
    s.update(b"k", 1.0, now_ms=0)
    with pytest.raises(TypeError, match="to_bytes"):
        pickle.dumps(s)
    c = copy.copy(s)
    c.update(b"k", 1.0, now_ms=0)
    assert s.query(b"k", now_ms=0) == 1.0 and c.query(b"k", now_ms=0) == 2.0
    assert copy.deepcopy(s).to_bytes() == s.to_bytes()


# ---- batches ----------------------------------------------------------------------------


def test_batch_equals_singles_for_every_input_form() -> None:
    rnd = random.Random(4)
    keys = [rnd.randbytes(rnd.randint(0, 20)) for _ in range(3000)]
    deltas = np.array([rnd.uniform(-1, 2) for _ in keys])
    times = np.cumsum([rnd.randint(0, 50) for _ in keys]).astype(np.int64)
    limits = np.array([rnd.uniform(0, 5) for _ in keys])
    single = sketch(cells_per_level=257, lo=-3.0)
    want_u = [single.update_and_query(k, float(d), int(t)) for k, d, t in zip(keys, deltas, times)]
    want_t = [
        single.try_update(k, float(d), float(lim), int(t) + 10**6)
        for k, d, t, lim in zip(keys, deltas, times, limits)
    ]
    want_q = [single.query(k, now_ms=int(t) + 2 * 10**6) for k, t in zip(keys, times)]
    for form in ("list", "tuple", "iter", "hashes", "object-array", "memoryview-hashes"):
        s = sketch(cells_per_level=257, lo=-3.0)
        if form == "list":
            ks = list(keys)
        elif form == "tuple":
            ks = tuple(keys)
        elif form == "iter":
            ks = iter(keys)
        elif form == "object-array":
            ks = np.array(keys, dtype=object)
        elif form == "hashes":
            ks = s.key_hashes(keys)
        else:
            ks = memoryview(s.key_hashes(keys))
        if form == "iter":
            got_u = s.update_and_query_many(ks, deltas, now_ms=times)
            ks = iter(keys)
            got_t = s.try_update_many(ks, deltas, limits, now_ms=times + 10**6)
            got_q = s.query_many(iter(keys), now_ms=(times + 2 * 10**6).tolist())
        else:
            got_u = s.update_and_query_many(ks, deltas.tolist(), now_ms=times)
            got_t = s.try_update_many(ks, deltas, limits, now_ms=times + 10**6)
            got_q = s.query_many(ks, now_ms=times + 2 * 10**6)
        assert got_u.tolist() == want_u, form
        assert got_t.tolist() == want_t, form
        assert got_q.tolist() == want_q, form
        assert s.to_bytes() == single.to_bytes(), form


def test_batch_scalars_and_fixed_width_rows() -> None:
    rows = np.frombuffer(bytes(range(256)) * 4, dtype=np.uint8).reshape(64, 16)
    keys = [bytes(r) for r in rows]
    a, b = sketch(), sketch()
    a.update_many(rows, 0.5, now_ms=100)
    for k in keys:
        b.update(k, 0.5, now_ms=100)
    assert a.to_bytes() == b.to_bytes()
    assert a.key_hashes(rows).tolist() == [a.key_hash(k) for k in keys]
    assert a.query_many([], now_ms=1).shape == (0,)
    assert a.try_update_many(np.array([], dtype=np.uint64), 1.0, 2.0, now_ms=[]).dtype == np.bool_
    a.update_many([], 1.0)
    big_batch = [b"x"] * 5000  # spans several lock chunks
    s = sketch(decay=NoDecay(), hi=1e9)
    s.update_many(big_batch, 1.0, now_ms=0)
    assert s.query(b"x", now_ms=0) == 5000.0


def test_read_only_buffers_are_accepted() -> None:
    s = sketch()
    h = s.key_hashes([b"a", b"b"])
    h.flags.writeable = False
    d = np.array([1.0, 2.0])
    d.flags.writeable = False
    t = np.array([5, 6], dtype=np.int64)
    t.flags.writeable = False
    assert s.update_and_query_many(h, d, now_ms=t).tolist() == [1.0, 2.0]
    assert (
        s.update_and_query_many(h, np.array([1, 1], dtype=np.int32), now_ms=7).dtype == np.float64
    )


# ---- sizing ------------------------------------------------------------------------------


def test_suggest_levels_examples_and_errors() -> None:
    assert suggest_levels(100, 1000, 1e-4) == 4
    assert suggest_levels(1000, 100_000, 1e-8) == 4
    assert suggest_levels(1, 1_000_000, 0.5) == 1
    for h, m, target in ((1, 2, 0.3), (50, 64, 1e-3), (10**6, 10**5, 0.1), (7, 10**9, 1e-300)):
        p = -math.expm1(h * math.log1p(-1 / m))
        level = suggest_levels(h, m, target)
        assert p**level <= target and (level == 1 or p ** (level - 1) > target)
    for args in (
        (0, 1000, 0.1),
        (-1, 1000, 0.1),
        (10, 1, 0.1),
        (10, 1000, 0.0),
        (10, 1000, 1.0),
        (10, 1000, float("nan")),
        (10, 1000, -0.5),
        (10**20, 2, 0.5),
    ):
        with pytest.raises(ValueError):
            suggest_levels(*args)


def test_peek_detailed_equals_query_detailed_and_writes_nothing() -> None:
    from grudge_stream import Exponential, Linear, ScoreSketch

    for decay in (Exponential(0.05), Linear(0.01)):
        sk = ScoreSketch(levels=3, cells_per_level=997, decay=decay, lo=-1.0, hi=1.0, seed=5)
        for i in range(500):
            sk.update(f"k{i % 50}".encode(), 0.1 if i % 3 else -0.05, now_ms=1_000 + 7 * i)
        before = sk.to_bytes()
        for k in (b"k1", b"k7", b"never"):
            got = sk.peek_detailed(k, 20_000)
            assert sk.to_bytes() == before  # no decay written back, no watermark moved
            assert got == sk.copy().query_detailed(k, 20_000)


def test_copy_keeps_a_secret_hash_key() -> None:
    from grudge_stream import NoDecay, ScoreSketch
    from grudge_stream.sketches import Rotator

    sk = ScoreSketch(levels=2, cells_per_level=101, decay=NoDecay(), lo=0.0, hi=1.0, hasher="siphash", seed=1)
    sk.use_hash_key(bytes(range(16)))
    sk.update(b"abuser", 0.5, now_ms=10)
    assert sk.copy().key_hash(b"abuser") == sk.key_hash(b"abuser")
    assert sk.copy().query(b"abuser", now_ms=10) == sk.query(b"abuser", now_ms=10)
    rot = Rotator(levels=2, cells_per_level=101, decay=NoDecay(), lo=0.0, hi=1.0, hasher="siphash", seed=1, generations=2,
                  period_ms=1000)
    rot.use_hash_key(bytes(range(16)))
    assert rot.copy().key_hash(b"abuser") == rot.key_hash(b"abuser")


def test_sizing_helpers_share_one_shape() -> None:
    """Every sketch family's sizing helper answers with its constructor arguments
    (``kwargs()``), its memory, and what the shape guarantees."""
    from grudge_stream import DecayingCountMin, ForgettingBloom, ScoreSketch
    from grudge_stream.sketches import bloom_sizing, countmin_sizing, score_sizing
    from grudge_stream.sketches.score_config import Exponential

    s = score_sizing(1000, 100_000, 1e-8)
    assert s.kwargs() == {"levels": 4, "cells_per_level": 100_000}
    assert s.collision_p <= 1e-8 and s.memory_bytes == 16 * 4 * 100_000
    assert ScoreSketch(**s.kwargs(), decay=Exponential(0.01)).memory_bytes() >= s.memory_bytes
    c = countmin_sizing(4.2e-5, 0.02, top_k=10)
    assert c.kwargs() == {"depth": 4, "width": 64_721} and c.epsilon <= 4.2e-5 and c.delta <= 0.02
    assert DecayingCountMin(**c.kwargs(), top_k=10).memory_bytes() == c.memory_bytes
    b = bloom_sizing(100_000, 0.01, 3)
    assert b.kwargs() == {"capacity": 100_000, "fp_rate": 0.01, "generations": 3}
    assert ForgettingBloom(**b.kwargs()).memory_bytes() >= b.memory_bytes
    for sizing in (s, c, b):
        assert sizing.memory_bytes > 0 and isinstance(sizing.kwargs(), dict)
