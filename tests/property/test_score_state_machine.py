"""Hypothesis state machines: ScoreSketch and Rotator against the pure-Python reference.

Every operation (single and batch, every decay, aggregator, hasher and bound
shape, clamping, try_update, merge, snapshot and copy) is applied to both, and
after every step all cells, outputs and clock state must agree bit for bit.
Tiny tables force collisions; deltas include values that overflow and saturate.
"""

from __future__ import annotations

import math
import pathlib
import struct
import sys

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from score_reference import RefConfig, RefRotator, RefScoreSketch

from grudge_stream import Exponential, Linear, NoDecay, Rotator, ScoreSketch

INF = math.inf
KEYS = [b"", b"a", b"b", b"client-7", "gr\u00fc\u00dfe", b"\x00" * 40, b"k" * 17, bytearray(b"z")]
DECAYS = [
    Exponential(0.0),
    Exponential(0.001),
    Exponential(0.7),
    Exponential(50.0),
    Linear(0.0),
    Linear(0.5),
    Linear(30.0),
    Linear(1e6),
    NoDecay(),
]
FINITE_BOUNDS = [(0.0, 1.0), (-1.0, 1.0), (-2.5, 0.5), (0.0, 1e300), (-0.0, 3.0), (-1e-3, 0.0)]
INFINITE_BOUNDS = [(0.0, INF), (-INF, INF), (-INF, 0.0), (-1.0, INF)]

deltas = st.one_of(
    st.floats(-3.0, 3.0, allow_nan=False),
    st.sampled_from([0.0, -0.0, 1.0, 0.25, 1e308, -1e308, 5e-324, 1.7976931348623157e308, -2.0]),
)
limits = st.one_of(
    st.floats(-4.0, 4.0, allow_nan=False), st.sampled_from([0.0, 1.0, 1e308, -1e308])
)
steps = st.one_of(st.just(0), st.integers(0, 2_000), st.integers(-3_000, -1), st.integers(0, 10**9))
keys = st.sampled_from(KEYS)


@st.composite
def sketch_configs(draw):
    decay = draw(st.sampled_from(DECAYS))
    bounds = FINITE_BOUNDS + ([] if isinstance(decay, NoDecay) else INFINITE_BOUNDS)
    lo, hi = draw(st.sampled_from(bounds))
    return dict(
        levels=draw(st.integers(1, 4)),
        cells_per_level=draw(st.sampled_from([1, 2, 3, 5, 7, 64])),
        decay=decay,
        lo=lo,
        hi=hi,
        aggregator=draw(st.sampled_from(["min", "max", "mean"])),
        hasher=draw(st.sampled_from(["murmur3", "siphash"])),
        seed=draw(st.integers(0, 2**64 - 1)),
        index_scheme=draw(st.sampled_from(["independent", "km"])),
    )


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def same(a: float, b: float) -> bool:
    return bits(a) == bits(b)


def assert_cells(actual: np.ndarray, expected) -> None:
    scores = np.array([s for s, _ in expected], dtype=np.float64)
    stamps = np.array([t for _, t in expected], dtype=np.int64)
    flat = actual.reshape(-1)
    assert np.array_equal(flat["score"].view(np.uint64), scores.view(np.uint64)), "scores differ"
    assert np.array_equal(flat["last_ms"], stamps), "stamps differ"


class ScoreSketchMachine(RuleBasedStateMachine):
    @initialize(cfg=sketch_configs(), start=st.integers(-(10**6), 2 * 10**12))
    def build(self, cfg, start):
        self.kwargs = cfg
        self.sk = ScoreSketch(**cfg)
        self.ref = RefScoreSketch(RefConfig.of(self.sk.config))
        self.now = start

    @rule(step=steps)
    def advance(self, step):
        self.now += step

    @rule(key=keys, delta=deltas)
    def update(self, key, delta):
        assert self.sk.update(key, delta, now_ms=self.now) is None
        self.ref.update(self.ref.hash(key), delta, self.now)

    @rule(key=keys, delta=deltas)
    def update_and_query(self, key, delta):
        got = self.sk.update_and_query(key, delta, self.now)
        assert same(got, self.ref.update(self.ref.hash(key), delta, self.now))

    @rule(key=keys)
    def query(self, key):
        assert same(
            self.sk.query(key, now_ms=self.now), self.ref.query(self.ref.hash(key), self.now)
        )

    @rule(key=keys)
    def query_detailed(self, key):
        got = self.sk.query_detailed(key, now_ms=self.now)
        agg, vals, idx = self.ref.query_detailed(self.ref.hash(key), self.now)
        assert same(got.aggregate, agg)
        assert [bits(v) for v in got.level_scores] == [bits(v) for v in vals]
        assert list(got.cell_indexes) == idx

    @rule(key=keys, delta=deltas, limit=limits)
    def try_update(self, key, delta, limit):
        got = self.sk.try_update(key, delta, limit, now_ms=self.now)
        assert got is self.ref.try_update(self.ref.hash(key), delta, limit, self.now)

    @rule(
        op=st.sampled_from(["update", "query", "update_and_query", "try_update"]),
        events=st.lists(st.tuples(keys, deltas, steps, limits), max_size=40),
        prehashed=st.booleans(),
        scalar_delta=st.booleans(),
        scalar_time=st.booleans(),
    )
    def batch(self, op, events, prehashed, scalar_delta, scalar_time):
        ks = [k for k, _, _, _ in events]
        hs = [self.ref.hash(k) for k in ks]
        ds = [d for _, d, _, _ in events]
        ls = [lim for _, _, _, lim in events]
        times = []
        t = self.now
        for _, _, step, _ in events:
            t = t if scalar_time else t + step
            times.append(t)
        if scalar_delta and events:
            ds = [ds[0]] * len(ds)
        keys_arg = np.array(hs, dtype=np.uint64) if prehashed else list(ks)
        delta_arg = ds[0] if scalar_delta and events else np.array(ds, dtype=np.float64)
        time_arg = self.now if scalar_time else np.array(times, dtype=np.int64)
        if op == "update":
            assert self.sk.update_many(keys_arg, delta_arg, now_ms=time_arg) is None
            for h, d, tt in zip(hs, ds, times):
                self.ref.update(h, d, tt)
        elif op == "query":
            got = self.sk.query_many(keys_arg, now_ms=time_arg)
            want = [self.ref.query(h, tt) for h, tt in zip(hs, times)]
            assert got.dtype == np.float64 and [bits(x) for x in got] == [bits(x) for x in want]
        elif op == "update_and_query":
            got = self.sk.update_and_query_many(keys_arg, delta_arg, now_ms=time_arg)
            want = [self.ref.update(h, d, tt) for h, d, tt in zip(hs, ds, times)]
            assert [bits(x) for x in got] == [bits(x) for x in want]
        else:
            got = self.sk.try_update_many(keys_arg, delta_arg, np.array(ls), now_ms=time_arg)
            want = [self.ref.try_update(h, d, lim, tt) for h, d, lim, tt in zip(hs, ds, ls, times)]
            assert got.dtype == np.bool_ and got.tolist() == want
        if times and not scalar_time:
            self.now = times[-1]

    @rule()
    def snapshot_round_trip(self):
        blob = self.sk.to_bytes()
        self.sk = ScoreSketch.from_bytes(blob)
        assert self.sk.to_bytes() == blob

    @rule()
    def copy(self):
        self.sk = self.sk.copy()

    @rule(events=st.lists(st.tuples(keys, deltas, steps), max_size=15))
    def merge(self, events):
        other = ScoreSketch(**self.kwargs)
        oref = RefScoreSketch(RefConfig.of(other.config))
        t = self.now
        for k, d, step in events:
            t += step
            other.update(k, d, now_ms=t)
            oref.update(oref.hash(k), d, t)
        self.sk.merge(other)
        self.ref.merge(oref)

    @invariant()
    def cells_agree(self):
        if not hasattr(self, "sk"):
            return
        assert_cells(self.sk._cells(), self.ref.cells())
        assert self.sk.watermark_ms == self.ref.watermark


@st.composite
def rotator_configs(draw):
    cfg = draw(sketch_configs())
    cfg["generations"] = draw(st.integers(2, 4))
    cfg["period_ms"] = draw(st.sampled_from([None, 1, 7, 1_000, 15_000]))
    return cfg


class RotatorMachine(RuleBasedStateMachine):
    @initialize(cfg=rotator_configs(), start=st.integers(-(10**5), 10**7))
    def build(self, cfg, start):
        self.kwargs = cfg
        self.r = Rotator(**cfg)
        sk = self.r.config.sketch
        self.ref = RefRotator(RefConfig.of(sk), cfg["generations"], cfg["period_ms"])
        self.now = start

    @rule(step=st.one_of(st.integers(0, 3_000), st.integers(-2_000, -1), st.integers(0, 100_000)))
    def advance(self, step):
        self.now += step

    @rule(key=keys, delta=deltas)
    def update_and_query(self, key, delta):
        got = self.r.update_and_query(key, delta, now_ms=self.now)
        assert same(got, self.ref.update(self.ref.hash(key), delta, self.now))

    @rule(key=keys, delta=deltas)
    def update(self, key, delta):
        self.r.update(key, delta, now_ms=self.now)
        self.ref.update(self.ref.hash(key), delta, self.now)

    @rule(key=keys)
    def query(self, key):
        assert same(
            self.r.query(key, now_ms=self.now), self.ref.query(self.ref.hash(key), self.now)
        )

    @rule(key=keys)
    def query_detailed(self, key):
        got = self.r.query_detailed(key, now_ms=self.now)
        agg, vals, idx = self.ref.query_detailed(self.ref.hash(key), self.now)
        assert same(got.aggregate, agg) and list(got.cell_indexes) == idx
        assert [bits(v) for v in got.level_scores] == [bits(v) for v in vals]

    @rule(key=keys, delta=deltas, limit=limits)
    def try_update(self, key, delta, limit):
        got = self.r.try_update(key, delta, limit, now_ms=self.now)
        assert got is self.ref.try_update(self.ref.hash(key), delta, limit, self.now)

    @rule()
    def rotate(self):
        self.r.rotate()
        self.ref.rotate()

    @rule(
        op=st.sampled_from(["update", "query", "update_and_query", "try_update"]),
        events=st.lists(st.tuples(keys, deltas, st.integers(0, 4_000), limits), max_size=30),
        prehashed=st.booleans(),
    )
    def batch(self, op, events, prehashed):
        hs = [self.ref.hash(k) for k, _, _, _ in events]
        ds = [d for _, d, _, _ in events]
        ls = [lim for _, _, _, lim in events]
        times, t = [], self.now
        for _, _, step, _ in events:
            t += step
            times.append(t)
        keys_arg = np.array(hs, dtype=np.uint64) if prehashed else [k for k, _, _, _ in events]
        if op == "update":
            self.r.update_many(keys_arg, ds, now_ms=times)
            for h, d, tt in zip(hs, ds, times):
                self.ref.update(h, d, tt)
        elif op == "query":
            got = self.r.query_many(keys_arg, now_ms=np.array(times, dtype=np.int64))
            assert [bits(x) for x in got] == [
                bits(self.ref.query(h, tt)) for h, tt in zip(hs, times)
            ]
        elif op == "update_and_query":
            got = self.r.update_and_query_many(keys_arg, np.array(ds), now_ms=np.array(times))
            want = [self.ref.update(h, d, tt) for h, d, tt in zip(hs, ds, times)]
            assert [bits(x) for x in got] == [bits(x) for x in want]
        else:
            got = self.r.try_update_many(
                keys_arg, np.array(ds), np.array(ls), now_ms=np.array(times)
            )
            want = [self.ref.try_update(h, d, lim, tt) for h, d, lim, tt in zip(hs, ds, ls, times)]
            assert got.tolist() == want
        if times:
            self.now = times[-1]

    @rule()
    def snapshot_round_trip(self):
        blob = self.r.to_bytes()
        self.r = Rotator.from_bytes(blob)
        assert self.r.to_bytes() == blob

    @rule(events=st.lists(st.tuples(keys, deltas, st.integers(0, 500)), max_size=10))
    def merge(self, events):
        # A twin at the same rotation state: same config, seed, forced rotations and epoch.
        other = Rotator(**self.kwargs)
        oref = RefRotator(self.ref.cfg, self.ref.n, self.ref.period)
        if self.ref.period:
            start = self.r.epoch * self.ref.period
            other.advance(now_ms=start)
            oref._advance(start)
        while other.rotations < self.r.rotations:
            other.rotate()
            oref.rotate()
        t = self.now
        for k, d, step in events:
            t += step
            if self.ref.period and t // self.ref.period != self.r.epoch:
                break
            other.update(k, d, now_ms=t)
            oref.update(oref.hash(k), d, t)
        if other.epoch == self.r.epoch and other.rotations == self.r.rotations:
            self.r.merge(other)
            self.ref.merge(oref)
            event("rotator merged")

    @invariant()
    def state_agrees(self):
        if not hasattr(self, "r"):
            return
        assert_cells(self.r._cells(), self.ref.cells())
        assert self.r.rotations == self.ref.rotations
        assert self.r.epoch == self.ref.epoch
        assert list(self.r.generation_seeds) == self.ref.seeds()
        assert self.r.watermark_ms == self.ref.watermark


_settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestScoreSketchMachine = ScoreSketchMachine.TestCase
TestScoreSketchMachine.settings = _settings
TestRotatorMachine = RotatorMachine.TestCase
TestRotatorMachine.settings = _settings
