"""Global top-k: per-partition heavy-hitter reports merged into one record per interval."""
from __future__ import annotations

import json
import random
import zlib
from collections import Counter

import pytest

from grudge_stream.operators.globaltopk import GlobalTopKOperator
from grudge_stream.operators.heavy import MAX_CATCHUP_REPORTS, HeavyHitterOperator
from grudge_stream.operators.records import SourceRecord

SRC, REPORTS = "hh-requests", "hh-top"
P = 4
K = 10
INTERVAL = 1000
T0 = 1_700_000_000_000  # a multiple of INTERVAL
# No halving inside the test (an epoch of ~31 years): estimates are exact counts.
SKETCH = {"depth": 4, "width": 1 << 16, "epoch_ms": 10**12, "seed": 11}


def partition_of(key: bytes) -> int:
    return zlib.crc32(key) % P


def zipf_stream(n: int, keys: int = 2000, s: float = 1.2, seed: int = 1) -> list[tuple[bytes, int]]:
    """(key, timestamp) pairs, Zipf(s) over ``keys`` keys, ~4 events per ms."""
    rnd = random.Random(seed)
    weights = [1 / (r ** s) for r in range(1, keys + 1)]
    names = [f"10.0.{r // 250}.{r % 250}".encode() for r in range(keys)]
    picks = rnd.choices(names, weights, k=n)
    return [(k, T0 + i // 4) for i, k in enumerate(picks)]


def heavy_op(p: int) -> HeavyHitterOperator:
    op = HeavyHitterOperator(operator_id="hh", source_topic=SRC, partition=p, sketch=SKETCH,
                             raise_at=1e9, clear_at=1.0, top_k=K, report_interval_ms=INTERVAL)
    op.source_partition_count = P
    return op


def run_heavy(events, partition=partition_of, end_ms: int | None = None) -> list:
    """Each partition's operator over its events (plus one tick at ``end_ms`` so the last
    interval is reported); returns the reports as records of the reports topic, interleaved
    round-robin across partitions, the way several producers fill one partition."""
    by_p: dict[int, list] = {p: [] for p in range(P)}
    for key, ts in events:
        p = partition(key)
        by_p[p].append(SourceRecord(SRC, p, len(by_p[p]), ts, key, None))
    reports: dict[int, list] = {}
    for p in range(P):
        recs = by_p[p]
        if end_ms is not None:
            recs = recs + [SourceRecord(SRC, p, len(recs), end_ms, b"tick", None)]
        reports[p] = [o for o in heavy_op(p).process(recs) if o.role == "reports"]
    merged = []
    for i in range(max(len(v) for v in reports.values())):
        for p in range(P):
            if i < len(reports[p]):
                merged.append(reports[p][i])
    return merged


def as_source(outputs, start_offset: int = 0) -> list[SourceRecord]:
    return [SourceRecord(REPORTS, 0, start_offset + i, 0, o.key, o.value) for i, o in enumerate(outputs)]


def global_op(**kw) -> GlobalTopKOperator:
    return GlobalTopKOperator(operator_id="hg", source_topic=REPORTS, partition=0, **kw)


def exact_top(events, end: int, k: int = K) -> list[tuple[str, int]]:
    counts = Counter(key for key, ts in events if ts < end)
    return sorted(((key.decode(), c) for key, c in counts.items()), key=lambda kv: (-kv[1], kv[0]))[:k]


def records(out, role="global_reports") -> list[dict]:
    return [json.loads(o.value) for o in out if o.role == role]


def test_keyed_zipf_global_top_k_equals_the_exact_top_k() -> None:
    events = zipf_stream(24_000)  # 6 s of event time
    end = T0 + 6 * INTERVAL
    reps = run_heavy(events, end_ms=end)
    assert {json.loads(r.value)["partitions"] for r in reps} == {P}
    # All partitions' reports of one interval share a record key (the interval start).
    by_key: dict[bytes, set] = {}
    for r in reps:
        by_key.setdefault(r.key, set()).add(json.loads(r.value)["partition"])
    assert all(v == set(range(P)) for v in by_key.values()) and len(by_key) == 6
    out = global_op().process(as_source(reps))
    glob = records(out)
    assert [g["interval_end_ms"] for g in glob] == [T0 + i * INTERVAL for i in range(1, 7)]
    for g in glob:
        assert g["complete"] and g["exact"] and g["missing"] == [] and g["closed_by"] == "complete"
        want = exact_top(events, g["interval_end_ms"])
        got = [(e["key"], e["estimate"]) for e in g["top"]]
        assert [c for _, c in got] == [c for _, c in want]
        kth = want[-1][1]
        # Keys above the k-th count are the same; keys tied at it may differ.
        assert {kk for kk, c in got if c > kth} == {kk for kk, c in want if c > kth}
        assert g["k"] == K and g["interval_start_ms"] == g["interval_end_ms"] - INTERVAL


def test_global_record_is_emitted_at_the_last_partitions_report_and_only_once() -> None:
    events = zipf_stream(8_000, seed=2)
    reps = run_heavy(events, end_ms=T0 + 2 * INTERVAL)
    op = global_op()
    out = op.process(as_source(reps + reps))  # every report twice: an upstream restart's copies
    glob = records(out)
    assert len(glob) == 2
    assert op.counters["reports_duplicate"] == len(reps)
    # The record cites the report that completed it.
    last_of_first = max(i for i, r in enumerate(reps) if json.loads(r.value)["interval_end_ms"] == T0 + INTERVAL)
    assert glob[0]["source"]["offset"] == last_of_first


def test_a_silent_partition_is_reported_missing_after_the_grace() -> None:
    events = [(k, ts) for k, ts in zipf_stream(12_000, seed=3)]
    reps = [r for r in run_heavy(events, end_ms=T0 + 3 * INTERVAL) if json.loads(r.value)["partition"] != 2]
    op = global_op(grace_ms=1500)
    glob = records(op.process(as_source(reps)))
    # Watermark T0+3000: the interval ending at T0+1000 is past its grace, T0+2000 and T0+3000 are not.
    assert [g["interval_end_ms"] for g in glob] == [T0 + INTERVAL]
    g = glob[0]
    assert g["missing"] == [2] and not g["complete"] and not g["exact"] and g["closed_by"] == "grace"
    assert len(op.pending) == 2
    # Partition 2's report arriving after the grace is dropped, not merged into a second record.
    late = [r for r in run_heavy(events, end_ms=T0 + 3 * INTERVAL)
            if json.loads(r.value)["partition"] == 2 and json.loads(r.value)["interval_end_ms"] == T0 + INTERVAL]
    assert records(op.process(as_source(late, start_offset=len(reps)))) == []
    assert op.counters["reports_late"] == 1


def test_pending_intervals_are_capped() -> None:
    events = [(k, T0 + i * 37) for i, (k, _) in enumerate(zipf_stream(6_000, seed=4))]  # ~222 intervals
    reps = [r for r in run_heavy(events) if json.loads(r.value)["partition"] != 1]
    op = global_op(grace_ms=10**9, max_open_intervals=8)
    src = as_source(reps)
    seen = 0
    for i in range(0, len(src), 7):
        seen += len(records(op.process(src[i:i + 7])))
        assert len(op.pending) <= 8 and len(op.closed) <= 8
    glob = records(global_op(grace_ms=10**9, max_open_intervals=8).process(src))
    assert len(glob) == seen
    assert glob and all(g["closed_by"] == "capacity" and g["missing"] == [1] for g in glob)
    ends = [g["interval_end_ms"] for g in glob]
    assert ends == sorted(ends) and len(ends) == len(set(ends))


def test_split_keys_are_flagged_with_a_bound_that_holds() -> None:
    """A stream not keyed by the counted key: a key's count is spread over partitions."""
    events = zipf_stream(24_000, seed=5)
    end = T0 + 6 * INTERVAL
    spread = {}

    def random_partition(key: bytes) -> int:
        spread[key] = spread.get(key, 0) + 1
        return (zlib.crc32(key) + spread[key]) % P  # round-robin per key

    reps = run_heavy(events, partition=random_partition, end_ms=end)
    for keyed in (True, False):
        glob = records(global_op(keyed=keyed).process(as_source(reps)))
        g = glob[-1]
        assert not g["exact"] and g["complete"]
        exact = dict(exact_top(events, g["interval_end_ms"], k=10**6))
        assert any(e.get("split") for e in g["top"])
        for e in g["top"]:
            assert e["estimate"] <= exact[e["key"]] <= e["estimate_max"]
        assert g["unlisted_max"] >= 0
        listed = {e["key"] for e in g["top"]}
        # Every key the record leaves out is bounded by the k-th entry's upper bound or by
        # the floors: none is heavier than the record's heaviest upper bound.
        assert all(c <= g["top"][0]["estimate_max"] for kk, c in exact.items() if kk not in listed)


def test_global_state_round_trips_and_a_restart_reemits_the_same_ids() -> None:
    events = zipf_stream(12_000, seed=6)
    reps = as_source(run_heavy(events, end_ms=T0 + 3 * INTERVAL))
    whole = global_op(grace_ms=5000).process(reps)
    cut = len(reps) // 2 + 1
    first = global_op(grace_ms=5000)
    a = first.process(reps[:cut])
    blob = first.snapshot()
    second = global_op(grace_ms=5000)
    second.restore(blob)
    assert second.snapshot() == blob
    b = second.process(reps)  # re-delivered from offset 0: the snapshot's part is skipped
    assert [o.value for o in a + b] == [o.value for o in whole]
    assert all(g["id"] for g in records(whole))


def test_heavy_report_ids_are_stable_across_a_rerun() -> None:
    events = zipf_stream(6_000, seed=7)
    one = run_heavy(events, end_ms=T0 + 2 * INTERVAL)
    two = run_heavy(events, end_ms=T0 + 2 * INTERVAL)
    ids = [json.loads(r.value)["id"] for r in one]
    assert ids == [json.loads(r.value)["id"] for r in two]
    assert len(set(ids)) == len(ids)


def test_a_watermark_jump_reports_every_crossed_interval_at_its_end() -> None:
    op = heavy_op(0)
    recs = [SourceRecord(SRC, 0, i, T0 + i, b"a" if i % 3 else b"b", None) for i in range(900)]
    recs.append(SourceRecord(SRC, 0, 900, T0 + 4 * INTERVAL + 5, b"c", None))
    reps = records(op.process(recs), "reports")
    assert [r["interval_end_ms"] for r in reps] == [T0 + i * INTERVAL for i in range(1, 5)]
    assert all(r["event_time_ms"] == r["interval_end_ms"] for r in reps)
    assert all(r["top"] == reps[0]["top"] for r in reps)  # no decay, nothing new: the same top
    assert {r["source"]["offset"] for r in reps} == {900}
    # A jump over more intervals than MAX_CATCHUP_REPORTS reports only the latest ones.
    far = records(op.process([SourceRecord(SRC, 0, 901, T0 + 1000 * INTERVAL, b"c", None)]), "reports")
    assert len(far) == MAX_CATCHUP_REPORTS and far[-1]["interval_end_ms"] == T0 + 1000 * INTERVAL


@pytest.mark.parametrize("value, reason", [
    (b"junk", "not JSON"),
    (b'{"operator":"hh","partition":0,"partitions":4,"interval_start_ms":0,"interval_end_ms":1000,"k":1,'
     b'"top":[{"key":"a","estimate":1},{"key":"b","estimate":2}]}', "at most k=1"),
    (b'{"operator":"hh","partition":5,"partitions":4,"interval_start_ms":0,"interval_end_ms":1000,"k":1,'
     b'"top":[]}', "out of range"),
    (b'{"operator":"hh","partition":0,"interval_start_ms":0,"interval_end_ms":1000,"k":1,"top":[]}',
     "source_partitions"),
    (b'{"operator":"hh","partition":0,"partitions":4,"interval_start_ms":1000,"interval_end_ms":1000,"k":1,'
     b'"top":[]}', "interval_end_ms"),
    (b'{"operator":"hh","partition":0,"partitions":4,"interval_start_ms":0,"interval_end_ms":1000,"k":2,'
     b'"top":[{"key":"a","estimate":1},{"key":"b","estimate":2}]}', "sorted"),
])
def test_malformed_reports_are_dead_letters(value: bytes, reason: str) -> None:
    op = global_op()
    out = op.process([SourceRecord(REPORTS, 0, 0, 0, b"0", value)], processing_ms=10_000)
    assert [o.role for o in out] == ["dead_letters"]
    body = json.loads(out[0].value)
    assert reason in body["reason"] and body["id"]
    assert op.counters["dead_letters"] == 1 and op.counters["events"] == 0 and not op.pending


def test_source_partitions_setting_fills_reports_without_a_count() -> None:
    def rep(p: int) -> bytes:
        return json.dumps({"operator": "hh", "partition": p, "partitions": None, "interval_start_ms": 0,
                           "interval_end_ms": 1000, "k": 1, "top": [{"key": f"k{p}", "estimate": 5 + p}]}).encode()

    op = global_op(source_partitions=2)
    glob = records(op.process([SourceRecord(REPORTS, 0, p, 0, b"0", rep(p)) for p in range(2)],
                              processing_ms=10_000))
    assert len(glob) == 1 and glob[0]["exact"] and glob[0]["top"] == [{"key": "k1", "estimate": 6}]
