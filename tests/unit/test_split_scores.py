"""Split-sign scores: punishment and forgiveness kept apart keep each error one-sided."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from grudge_stream import ConfigError, Exponential, Linear, MismatchError, SnapshotError
from grudge_stream.operators import EventCodec, SourceRecord
from grudge_stream.operators.scores import FeedbackScoreOperator
from grudge_stream.sketches.split import SplitScoreSketch

LAM = 0.01  # per second
L, M = 3, 64


def split(**kw) -> SplitScoreSketch:
    args = dict(levels=L, cells_per_level=M, decay=Exponential(LAM), lo=0.0, hi=1.0, hasher="siphash", seed=5)
    args.update(kw)
    return SplitScoreSketch(**args)


def cells(sk: SplitScoreSketch, key: bytes) -> list[int]:
    return sk.query_detailed(key, now_ms=0)["cell_indexes"]


def colliders(sk: SplitScoreSketch, target: bytes, levels: set[int]) -> list[bytes]:
    """Keys sharing ``target``'s cell on each of ``levels`` and on no other level."""
    want = cells(sk, target)
    found: dict[int, bytes] = {}
    out = []
    for i in range(200_000):
        k = b"c-%d" % i
        c = cells(sk, k)
        hits = {lv for lv in range(L) if c[lv] == want[lv]}
        if hits and hits <= levels:
            for lv in hits:
                found.setdefault(lv, k)
        if set(found) >= levels:
            out = sorted(set(found.values()))
            break
    assert set(found) >= levels, "no colliding keys found"
    return out


class Exact:
    """The exact clamped model of one key."""

    def __init__(self) -> None:
        self.s, self.t = 0.0, 0

    def apply(self, delta: float, now: int) -> float:
        self.s = min(1.0, max(0.0, self.s * math.exp(-LAM * (now - self.t) / 1000.0) + delta))
        self.t = now
        return self.s


def test_without_collisions_it_is_the_exact_clamped_model() -> None:
    sk = split(cells_per_level=100_000, levels=4)
    ex = Exact()
    rng = np.random.default_rng(3)
    t = 0
    for _ in range(5000):
        t += int(rng.integers(0, 2000))
        d = 0.04 if rng.random() < 0.3 else -0.01
        assert sk.update_and_query(b"k", d, now_ms=t) == pytest.approx(ex.apply(d, t), abs=1e-9)


def test_framing_an_innocent_needs_all_levels() -> None:
    sk = split()
    innocent = b"innocent"
    partial = colliders(sk, innocent, set(range(L - 1)))
    for t in range(0, 20_000, 100):
        for k in partial:
            sk.update(k, 0.2, now_ms=t)
        sk.update(innocent, -0.001, now_ms=t)
    assert sk.query(innocent, now_ms=20_000) == 0.0
    full = colliders(sk, innocent, {L - 1})
    for t in range(20_000, 40_000, 100):
        for k in partial + full:
            sk.update(k, 0.2, now_ms=t)
    assert sk.query(innocent, now_ms=40_000) >= 0.5  # all L covered: the known limit of min


def test_hiding_an_abuser_needs_all_levels_and_single_mode_did_not() -> None:
    abuser = b"abuser"
    for mode in ("split", "single"):
        sk = split()
        if mode == "single":
            from grudge_stream import ScoreSketch
            sk = ScoreSketch(levels=L, cells_per_level=M, decay=Exponential(LAM), lo=0.0, hi=1.0,
                             hasher="siphash", seed=5)
        want = sk.query_detailed(abuser, now_ms=0)
        want = want["cell_indexes"] if isinstance(want, dict) else list(want.cell_indexes)
        helpers = []
        for lv in range(L - 1):  # one helper key per level, on all but the last
            for i in range(200_000):
                k = b"h-%d-%d" % (lv, i)
                d = sk.query_detailed(k, now_ms=0)
                c = d["cell_indexes"] if isinstance(d, dict) else list(d.cell_indexes)
                if c[lv] == want[lv] and c[L - 1] != want[L - 1]:
                    helpers.append(k)
                    break
        ex = Exact()
        for t in range(0, 30_000, 200):
            for h in helpers:  # a flood of good outcomes on the abuser's cells
                for _ in range(20):
                    sk.update(h, -0.05, now_ms=t)
            s = sk.update_and_query(abuser, 0.04, now_ms=t)
            e = ex.apply(0.04, t)
        if mode == "split":
            assert s == pytest.approx(e, abs=1e-9) and s >= 0.5
        else:
            assert s < 0.5 <= e  # what split mode fixes: L-1 helper keys hid the abuser


def test_a_clean_history_banks_no_forgiveness() -> None:
    sk = split(cells_per_level=100_000, levels=4)
    ex = Exact()
    t = 0
    for _ in range(100_000):  # 100 good outcomes a second for 1000 s
        t += 10
        sk.update(b"k", -0.001, now_ms=t)
        ex.apply(-0.001, t)
    raised_at: dict[str, int] = {}
    for i in range(100):
        t += 500
        s = sk.update_and_query(b"k", 0.04, now_ms=t)
        e = ex.apply(0.04, t)
        if s >= 0.5:
            raised_at.setdefault("sketch", i)
        if e >= 0.5:
            raised_at.setdefault("exact", i)
    assert raised_at["sketch"] <= raised_at["exact"]
    assert sk.neg.query(b"k", now_ms=t) == 0.0


def test_forgiveness_is_capped_by_what_the_score_holds() -> None:
    sk = split(cells_per_level=1000)
    sk.update(b"k", 0.3, now_ms=0)
    sk.update(b"k", -5.0, now_ms=0)
    assert sk.query(b"k", now_ms=0) == 0.0
    assert sk.neg.query(b"k", now_ms=0) == pytest.approx(0.3)
    assert sk.update_and_query(b"k", 0.2, now_ms=0) == pytest.approx(0.2)  # no debt carried


def test_batch_equals_one_by_one_and_bytes_round_trip() -> None:
    rng = np.random.default_rng(1)
    keys = [b"k%d" % i for i in rng.integers(0, 300, 5000)]
    deltas = np.where(rng.random(5000) < 0.3, 0.05, -0.01)
    now = np.cumsum(rng.integers(0, 50, 5000))
    a, b = split(), split()
    ref = [a.update_and_query(k, float(d), now_ms=int(t)) for k, d, t in zip(keys, deltas, now)]
    got = b.update_and_query_many(b.key_hashes(keys), deltas, now_ms=now)
    assert np.array_equal(np.asarray(ref), got)
    c = SplitScoreSketch.from_bytes(b.to_bytes())
    assert c.config == b.config
    d = b.copy()
    d.update(keys[0], 0.5, now_ms=int(now[-1]))
    assert d.to_bytes() != b.to_bytes() and b.copy().to_bytes() == b.to_bytes()
    assert np.array_equal(c.query_many(keys, now_ms=int(now[-1])), b.query_many(keys, now_ms=int(now[-1])))
    blob = bytearray(b.to_bytes())
    blob[-10] ^= 1
    with pytest.raises(SnapshotError):
        SplitScoreSketch.from_bytes(bytes(blob))


def test_refused_configs() -> None:
    with pytest.raises(ConfigError, match="linear"):
        split(decay=Linear(0.1))
    with pytest.raises(ConfigError, match="min"):
        split(aggregator="max")
    with pytest.raises(ConfigError):
        split(lo=0.5, hi=1.0)


def op(mode: str) -> FeedbackScoreOperator:
    sketch = {"levels": 3, "cells_per_level": 5000, "decay": {"kind": "exponential", "lambda_per_s": 0.05},
              "lo": 0.0, "hi": 1.0, "aggregator": "min", "hasher": "siphash", "seed": 11}
    codec = EventCodec(value_field="outcome", outcomes={"bad": 0.1, "good": -0.01}, allow_numbers=False)
    return FeedbackScoreOperator(operator_id="s", source_topic="t", partition=0, sketch=sketch, codec=codec,
                                 raise_at=0.5, clear_at=0.2, score_mode=mode)


def test_snapshots_of_the_other_mode_are_refused_clearly() -> None:
    recs = [SourceRecord("t", 0, i, 1000 + i, b"k", json.dumps({"outcome": "bad"}).encode()) for i in range(10)]
    single, both = op("single"), op("split")
    single.process(recs)
    both.process(recs)
    with pytest.raises(MismatchError, match="score_mode"):
        op("split").restore(single.snapshot())
    with pytest.raises(MismatchError, match="score_mode"):
        op("single").restore(both.snapshot())
    again = op("split")
    again.restore(both.snapshot())
    assert again.snapshot() == both.snapshot()
    assert "score_mode" not in single.state_config()  # earlier releases' snapshots keep restoring
