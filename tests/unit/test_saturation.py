"""Saturation read-outs: a sketch reports how full it is and warns past its target."""
from __future__ import annotations

import json

import pytest

from grudge_stream.metrics import Metrics
from grudge_stream.operators import EventCodec, SourceRecord
from grudge_stream.operators.heavy import HeavyHitterOperator
from grudge_stream.operators.saturation import FALSE_RAISE_TARGET
from grudge_stream.operators.scores import FeedbackScoreOperator

T0 = 1_700_000_000_000
CODEC = EventCodec(value_field="outcome", outcomes={"bad": 0.6, "good": -0.01}, allow_numbers=False)


def scores(cells: int, mode: str = "split") -> FeedbackScoreOperator:
    sketch = {"levels": 2, "cells_per_level": cells, "decay": {"kind": "exponential", "lambda_per_s": 0.01},
              "lo": 0.0, "hi": 1.0, "aggregator": "min", "hasher": "siphash", "seed": 11}
    return FeedbackScoreOperator(operator_id="s", source_topic="t", partition=0, sketch=sketch, codec=CODEC,
                                 raise_at=0.5, clear_at=0.2, score_mode=mode)


def bad(i: int, key: bytes) -> SourceRecord:
    return SourceRecord("t", 0, i, T0 + i, key, b'{"outcome":"bad"}')


@pytest.mark.parametrize("mode", ["single", "split"])
def test_score_sketch_reports_hot_cells_and_warns_when_overloaded(mode: str) -> None:
    roomy, tight = scores(100_000, mode), scores(50, mode)
    recs = [bad(i, b"k%d" % i) for i in range(40)]
    roomy.process(recs)
    tight.process(recs)
    (r,) = roomy.saturation()
    assert r.warning is None and r.measures["false_raise_probability"] < FALSE_RAISE_TARGET
    assert r.measures["hot_keys_estimate"] == pytest.approx(40, rel=0.01)
    (t,) = tight.saturation()
    assert t.measures["hot_cells_ratio"] > 0.4
    assert t.measures["false_raise_probability"] == pytest.approx(t.measures["hot_cells_ratio"] ** 2, rel=0.2)
    assert t.warning is not None and "cells_per_level" in t.warning
    # Decay empties the cells again: an hour later nothing is hot.
    tight.process([SourceRecord("t", 0, 100, T0 + 3_600_000, b"x", b'{"outcome":"good"}')])
    (later,) = tight.saturation()
    assert later.warning is None and later.measures["hot_cells_ratio"] == 0.0


def heavy(width: int) -> HeavyHitterOperator:
    return HeavyHitterOperator(operator_id="h", source_topic="t", partition=0,
                               sketch={"depth": 3, "width": width, "epoch_ms": 60_000, "seed": 3},
                               raise_at=1000, clear_at=500, top_k=5, report_interval_ms=1000)


def test_count_min_reports_weight_and_error_bound() -> None:
    recs = [SourceRecord("t", 0, i, T0 + i, b"k%d" % (i % 5000), b"") for i in range(20_000)]
    narrow, wide = heavy(64), heavy(1 << 16)
    narrow.process(recs)
    wide.process(recs)
    (n,) = narrow.saturation()
    (w,) = wide.saturation()
    assert n.measures["total_weight"] == pytest.approx(20_000, rel=0.01)
    assert n.measures["error_bound"] == pytest.approx(narrow.sketch.error_bound(n.measures["total_weight"]))
    assert n.warning is not None and w.warning is None


def test_report_top_and_query_read_at_the_same_time() -> None:
    op = heavy(1 << 12)
    recs = [SourceRecord("t", 0, i, T0 + i * 10, b"hot" if i % 2 else b"k%d" % i, b"") for i in range(500)]
    recs.append(SourceRecord("t", 0, 500, T0 + 10 * 60_000, b"late", b""))  # ten epochs later: a report
    out = op.process(recs)
    reports = [json.loads(o.value) for o in out if o.role == "reports"]
    last = reports[-1]
    for entry in last["top"]:
        key = entry.get("key", "").encode()
        assert entry["estimate"] == op.sketch.query(key, now_ms=last["event_time_ms"])


def test_partition_slot_exports_saturation_gauges() -> None:
    from prometheus_client import CollectorRegistry

    from grudge_stream.partitions import PartitionSlot, RestoreOutcome
    from grudge_stream.topology import Topology

    op = scores(50)
    topo = Topology(name="t", source_topic="t", make_operator=lambda p: scores(50), outputs={"dead_letters": "dlq"},
                    snapshot_topic="snap")
    m = Metrics(CollectorRegistry())
    slot = PartitionSlot(topo, 0, RestoreOutcome(op, None, "fresh", 0.0), 1, m)
    slot.process([bad(i, b"k%d" % i) for i in range(40)])
    body = m.render().decode()
    assert any(line.startswith("grudge_sketch_saturation{") and 'measure="false_raise_probability"' in line
               and float(line.rsplit(" ", 1)[1]) > FALSE_RAISE_TARGET for line in body.splitlines())
    assert "grudge_sketch_saturation_warnings_total{" in body


@pytest.mark.parametrize("overload, words", [("shrink_window", "remembered for"), ("raise_fp", "false-positive")])
def test_bloom_reports_fill_window_and_warns_when_over_capacity(overload: str, words: str) -> None:
    from grudge_stream.operators.dedup import DedupOperator

    def dedup() -> DedupOperator:
        return DedupOperator(operator_id="d", source_topic="t", partition=0,
                             bloom={"capacity": 1000, "fp_rate": 0.01, "period_ms": 10_000, "seed": 3,
                                    "overload": overload})

    calm, busy = dedup(), dedup()
    calm.process([SourceRecord("t", 0, i, T0 + i * 20, b"k%d" % i, b"") for i in range(1500)])  # 0.5x
    busy.process([SourceRecord("t", 0, i, T0 + i * 2, b"k%d" % i, b"") for i in range(15_000)])  # 5x
    (c,) = calm.saturation()
    (b,) = busy.saturation()
    assert c.warning is None and c.measures["fill_ratio"] <= 1.0
    assert b.warning is not None and words in b.warning
    if overload == "raise_fp":
        assert b.measures["fp_rate_estimate"] > 0.01 and b.measures["fill_ratio"] > 1.0
    else:
        assert b.measures["effective_window_seconds"] < b.measures["documented_window_seconds"]
        assert b.measures["overloads"] > 0


def test_token_buckets_report_full_cells() -> None:
    from grudge_stream.operators.ratelimit import RateLimitOperator

    def limiter(cells: int) -> RateLimitOperator:
        return RateLimitOperator(operator_id="r", source_topic="t", partition=0, rate_per_s=1.0, burst=5.0,
                                 levels=2, cells_per_level=cells, seed=3)

    recs = [SourceRecord("t", 0, i, T0 + i, b"k%d" % (i % 40), b'{"cost": 1}') for i in range(400)]
    roomy, tight = limiter(100_000), limiter(50)
    roomy.process(recs)
    tight.process(recs)
    (r,) = roomy.saturation()
    (t,) = tight.saturation()
    assert r.warning is None and r.measures["false_limit_probability"] < FALSE_RAISE_TARGET
    assert r.measures["cells_in_use_ratio"] == pytest.approx(80 / 200_000)
    assert t.warning is not None and t.measures["full_cells_ratio"] > 0.3


@pytest.mark.parametrize("now_ms", [None, 5_000, 60_000, 10_000_000])
@pytest.mark.parametrize("lam_per_ms", [0.0, 1e-5, 3e-3])
def test_the_kernels_level_counts_equal_the_arrays_they_replace(now_ms, lam_per_ms) -> None:
    """``ScoreSketch.saturation_counts`` (one pass over the cells in place) counts what the
    copied, decayed arrays count: cells never written, zero, negative, decayed below or
    still above each threshold, written after ``now_ms``."""
    import numpy as np

    from grudge_stream import ScoreSketch
    from grudge_stream.operators.saturation import _decayed_scores
    from grudge_stream.sketches.score_config import Exponential

    rng = np.random.default_rng(3)
    sk = ScoreSketch(levels=3, cells_per_level=2_000, decay=Exponential(0.5), lo=-1.0, hi=1.0)
    keys = [f"k{i}".encode() for i in range(1_500)]
    for i, k in enumerate(keys):
        sk.update(k, float(rng.uniform(-0.9, 0.9)), int(rng.integers(0, 70_000)))
    s = _decayed_scores(sk, now_ms, lam_per_ms)
    for hot_at, use_at in ((0.5, 0.005), (0.2, 0.2), (-0.3, 0.0), (0.0, -0.1)):
        hot, use = sk.saturation_counts(now_ms, lam_per_ms, hot_at, use_at)
        assert hot.tolist() == (s >= hot_at).sum(axis=1).tolist(), (hot_at, now_ms, lam_per_ms)
        assert use.tolist() == (s >= use_at).sum(axis=1).tolist(), (use_at, now_ms, lam_per_ms)
    raw = _decayed_scores(sk, None, 0.0)
    assert 0 < int((raw != 0).sum()) < raw.size  # the table is partly written: both branches ran


@pytest.mark.parametrize("now_ms", [None, 5_000, 60_000, 10_000_000])
@pytest.mark.parametrize("rate_per_s", [0.0, 0.5, 7.0, 1e6])
def test_the_kernels_token_bucket_counts_equal_the_arrays_they_replace(now_ms, rate_per_s) -> None:
    """``saturation_counts(..., refill_per_s, above=True)`` (a token bucket's debt refilled
    linearly, counted strictly above each threshold) counts what the copied arrays count:
    cells never written, zero, negative, refilled to 0 or still in debt, written after
    ``now_ms``, exactly at a threshold."""
    import numpy as np

    from grudge_stream import ScoreSketch
    from grudge_stream.operators.saturation import _bucket_counts, _cells_and_age
    from grudge_stream.sketches.score_config import NoDecay

    rng = np.random.default_rng(5)
    sk = ScoreSketch(levels=3, cells_per_level=2_000, decay=NoDecay(), lo=-5.0, hi=20.0)
    for i in range(1_500):
        sk.update(f"k{i}".encode(), float(rng.choice([rng.uniform(-3, 19), 1.0, 4.0])), int(rng.integers(0, 70_000)))
    debt, age = _cells_and_age(sk, now_ms)
    if rate_per_s > 0:
        debt = np.maximum(0.0, debt - rate_per_s * age / 1000.0)
    for full_above in (3.0, 0.0, -1.0, 18.5):
        full, use = sk.saturation_counts(now_ms, 0.0, full_above, 0.0, rate_per_s, True)
        assert full.tolist() == (debt > full_above).sum(axis=1).tolist(), (full_above, now_ms, rate_per_s)
        assert use.tolist() == (debt > 0.0).sum(axis=1).tolist(), (now_ms, rate_per_s)

    class Copied:  # a sketch without the kernel pass: the arrays, as before
        config = sk.config

        def _cells(self):
            return sk._cells()

    for full_above in (3.0, -1.0):
        kernel = _bucket_counts(sk, now_ms, rate_per_s, full_above)
        arrays = _bucket_counts(Copied(), now_ms, rate_per_s, full_above)
        assert [a.tolist() for a in kernel] == [a.tolist() for a in arrays]
