"""Operator unit tests: no broker, the real sketches."""
from __future__ import annotations

import json
import math
import random

import pytest

from grudge_stream import MismatchError, SnapshotError
from grudge_stream.operators import EventCodec, SourceRecord
from grudge_stream.operators.alerts import AlertLatch
from grudge_stream.operators.records import TICK_KEY, output_id
from grudge_stream.operators.dedup import DedupOperator
from grudge_stream.operators.heavy import HeavyHitterOperator
from grudge_stream.operators.scores import FeedbackScoreOperator

TOPIC = "events"
SKETCH = {"levels": 3, "cells_per_level": 5_000, "decay": {"kind": "exponential", "lambda_per_s": 0.05},
          "lo": 0.0, "hi": 1.0, "aggregator": "min", "hasher": "siphash", "seed": 11}
CODEC = EventCodec(value_field="outcome", outcomes={"bad": 0.1, "good": -0.01}, allow_numbers=False)


def score_op(partition: int = 0, **kw) -> FeedbackScoreOperator:
    args = dict(operator_id="scores", source_topic=TOPIC, partition=partition, sketch=SKETCH, codec=CODEC,
                raise_at=0.5, clear_at=0.2, sweep_interval_ms=2_000, emit_scores="crossings")
    args.update(kw)
    return FeedbackScoreOperator(**args)


def stream(n: int = 3000, seed: int = 1, partition: int = 0, abusers: int = 3, start_offset: int = 0,
           jitter_ms: int = 0) -> list[SourceRecord]:
    rnd = random.Random(seed)
    out = []
    t = 1_000_000
    for i in range(n):
        t += rnd.randint(0, 40)
        if rnd.random() < 0.15:
            key, bad = f"abuser-{rnd.randrange(abusers)}", rnd.random() < 0.9
        else:
            key, bad = f"user-{rnd.randrange(500)}", rnd.random() < 0.05
        ts = t - (rnd.randint(0, jitter_ms) if jitter_ms else 0)
        out.append(SourceRecord(TOPIC, partition, start_offset + i, ts, key.encode(),
                                json.dumps({"outcome": "bad" if bad else "good"}).encode()))
    return out


def run(op, records, splits=None):
    outs = []
    if splits is None:
        outs.extend(op.process(records))
    else:
        pos = 0
        for s in splits:
            outs.extend(op.process(records[pos:pos + s]))
            pos += s
        outs.extend(op.process(records[pos:]))
    return outs


def test_processing_is_split_invariant_and_raises_alerts() -> None:
    recs = stream()
    ref_op = score_op()
    ref = run(ref_op, recs)
    alerts = [json.loads(o.value) for o in ref if o.role == "alerts"]
    assert {a["key"] for a in alerts if a["state"] == "raised"} >= {"abuser-0", "abuser-1", "abuser-2"}
    rnd = random.Random(5)
    for _ in range(5):
        op = score_op()
        splits = [rnd.randint(0, 400) for _ in range(12)]
        assert run(op, recs, splits) == ref
        assert op.snapshot() == ref_op.snapshot()


def test_snapshot_restore_continues_exactly() -> None:
    recs = stream(seed=2)
    ref_op = score_op()
    ref = run(ref_op, recs)
    for cut in (0, 1, 777, 2999, 3000):
        a = score_op()
        out = a.process(recs[:cut])
        b = score_op()
        b.restore(a.snapshot())
        # Replaying from the start skips what the snapshot already reflects.
        out += b.process(recs)
        assert out == ref
        assert b.snapshot() == ref_op.snapshot()
        assert b.next_offset == 3000


def test_alerts_follow_hysteresis_and_ids_are_deterministic() -> None:
    op = score_op()
    key = b"k"
    recs = [SourceRecord(TOPIC, 0, i, 10_000 + i, key, b'{"outcome":"bad"}') for i in range(6)]
    out = op.process(recs)
    alerts = [json.loads(o.value) for o in out if o.role == "alerts"]
    assert [a["state"] for a in alerts] == ["raised"]
    a = alerts[0]
    assert a["score"] >= 0.5 and a["threshold"] == 0.5 and a["key"] == "k"
    assert a["alert_id"] == output_id("scores", 0, a["source"]["offset"], "raised", key)
    assert set(a) >= {"alert_id", "operator", "key", "state", "score", "threshold", "event_time_ms", "source"}
    # Forgiveness alone does not clear before the score falls to clear_at ...
    out = op.process([SourceRecord(TOPIC, 0, 6, 10_010, key, b'{"outcome":"good"}')])
    assert not [o for o in out if o.role == "alerts"]
    # ... but decay does, found by the sweep when event time moves on (another key's event).
    later = 10_010 + int(1000 * math.log(0.6 / 0.2) / 0.05) + 2_000
    out = op.process([SourceRecord(TOPIC, 0, 7, later, b"other", b'{"outcome":"good"}')])
    cleared = [json.loads(o.value) for o in out if o.role == "alerts"]
    assert [(c["key"], c["state"]) for c in cleared] == [("k", "cleared")]
    assert cleared[0]["score"] <= 0.2 and cleared[0]["threshold"] == 0.2


BAD_VALUES = [
    b"{not json", b"\xff\xfe", b"[]", b'"bad"', b"{}", b'{"outcome": "terrible"}', b'{"outcome": 3}',
    b'{"outcome": null}', b'{"outcome": NaN}', b"", None,
]


def test_bad_records_are_dead_lettered_and_touch_nothing() -> None:
    clean = stream(n=1500, seed=3)
    mixed: list[SourceRecord] = []
    rnd = random.Random(9)
    offset = 0
    bad_count = 0
    for r in clean:
        if rnd.random() < 0.3:
            kind = rnd.randrange(len(BAD_VALUES) + 3)
            if kind < len(BAD_VALUES):
                bad = SourceRecord(TOPIC, 0, offset, r.timestamp_ms, b"x", BAD_VALUES[kind])
            elif kind == len(BAD_VALUES):
                bad = SourceRecord(TOPIC, 0, offset, r.timestamp_ms, None, b'{"outcome": "bad"}')
            elif kind == len(BAD_VALUES) + 1:
                bad = SourceRecord(TOPIC, 0, offset, -5, b"x", b'{"outcome": "bad"}')
            else:
                bad = SourceRecord(TOPIC, 0, offset, 2**60, b"x", b'{"outcome": "bad"}')
            mixed.append(bad)
            bad_count += 1
            offset += 1
        mixed.append(SourceRecord(TOPIC, 0, offset, r.timestamp_ms, r.key, r.value))
        offset += 1
    ref_op, op = score_op(), score_op()
    ref_out = ref_op.process(clean)
    out = op.process(mixed)
    dead = [json.loads(o.value) for o in out if o.role == "dead_letters"]
    assert len(dead) == bad_count == op.counters["dead_letters"]
    assert all(d["reason"] and d["source"]["topic"] == TOPIC for d in dead)
    assert op.sketch_bytes() == ref_op.sketch_bytes()
    # Reason classes for the metrics, outside the counters a snapshot carries.
    from grudge_stream.operators.deadletters import reason_class

    classes: dict[str, int] = {}
    for d in dead:
        classes[reason_class(d["reason"])] = classes.get(reason_class(d["reason"]), 0) + 1
    assert op.dead_letter_reasons == classes and sum(classes.values()) == bad_count
    assert set(op.counters) == set(ref_op.counters)
    strip = lambda outs: [(o.role, o.key, {k: v for k, v in json.loads(o.value).items()  # noqa: E731
                                          if k not in ("alert_id", "id", "source")}) for o in outs if o.role != "dead_letters"]
    assert strip(out) == strip(ref_out)


def test_future_records_do_not_fast_forward_the_clock() -> None:
    codec = EventCodec(value_field="outcome", outcomes={"bad": 0.1}, time_field="ts")
    recs = [
        SourceRecord(TOPIC, 0, 0, 1_000_000, b"a", b'{"outcome":"bad","ts":1000000}'),
        SourceRecord(TOPIC, 0, 1, 1_000_100, b"a", b'{"outcome":"bad","ts":99000000}'),
        SourceRecord(TOPIC, 0, 2, 1_000_200, b"a", b'{"outcome":"bad","ts":1000150}'),
    ]
    # dead_letter policy: the record is refused with its reason
    op = score_op(codec=codec, max_future_ms=60_000, future_policy="dead_letter")
    out = op.process(recs, processing_ms=1_000_200)
    dead = [json.loads(o.value) for o in out if o.role == "dead_letters"]
    assert len(dead) == 1 and "ahead" in dead[0]["reason"] and dead[0]["source"]["offset"] == 1
    assert op.watermark == 1_000_150
    # clamp policy (the default): applied at the bound, counted
    op = score_op(codec=codec, max_future_ms=60_000)
    out = op.process(recs, processing_ms=1_000_200)
    assert not [o for o in out if o.role == "dead_letters"]
    assert op.watermark == 1_000_150 and op.counters["future_clamped"] == 1


def test_late_events_are_preweighted_so_order_does_not_matter() -> None:
    # Without clamping, a cell is a sum of exp-weighted deltas: arrival order only changes rounding.
    wide = {**SKETCH, "lo": -1000.0, "hi": 1000.0}
    recs = stream(n=2000, seed=4, jitter_ms=3000)
    a, b = score_op(sketch=wide), score_op(sketch=wide)
    a.process(recs)
    assert a.counters["late"] > 500
    in_order = sorted(recs, key=lambda r: (r.timestamp_ms, r.offset))
    b.process([SourceRecord(r.topic, r.partition, i, r.timestamp_ms, r.key, r.value)
               for i, r in enumerate(in_order)])
    assert a.watermark == b.watermark
    for k in [b"abuser-0", b"abuser-1", b"abuser-2", b"user-3", b"user-77"]:
        qa = a.sketch.query(k, now_ms=a.watermark)
        qb = b.sketch.query(k, now_ms=b.watermark)
        assert qa == pytest.approx(qb, rel=1e-9, abs=1e-12)


def test_restore_refuses_corrupt_and_mismatched_snapshots_and_keeps_state() -> None:
    op = score_op()
    op.process(stream(n=300, seed=6))
    blob = op.snapshot()
    target = score_op()
    before = target.snapshot()
    for i in range(0, len(blob), max(1, len(blob) // 300)):
        bad = bytearray(blob)
        bad[i] ^= 0x10
        with pytest.raises(SnapshotError):
            target.restore(bytes(bad))
    with pytest.raises(SnapshotError):
        target.restore(blob[:-1])
    assert target.snapshot() == before
    other = score_op(sketch={**SKETCH, "cells_per_level": 4_000})
    with pytest.raises(MismatchError, match=r"cells_per_level: 5000 in the snapshot, 4000 now"):
        other.restore(blob)
    # Policy settings are no part of the state: a new threshold keeps it.
    policy = score_op(raise_at=0.6, clear_at=0.1, emit_scores="every", sweep_interval_ms=500)
    policy.restore(blob)
    assert policy.sketch_bytes() == op.sketch_bytes() and policy.latch.raise_at == 0.6
    other_seed = score_op(sketch={**SKETCH, "seed": 12})
    with pytest.raises(MismatchError):
        other_seed.restore(blob)
    with pytest.raises(MismatchError):
        score_op(partition=1).restore(blob)


def test_alert_latch_is_bounded_under_a_flood_of_raises() -> None:
    latch = AlertLatch(0.5, 0.2, capacity=1000)
    for i in range(50_000):
        latch.observe(f"k{i}".encode(), 0.5 + (i % 97) / 1000)
        assert len(latch) <= 1000
    assert latch.evictions > 0
    restored = AlertLatch(0.5, 0.2, capacity=1000)
    restored.load(latch.to_bytes())
    assert list(restored.keys()) == list(latch.keys())


def test_heavy_hitter_operator_alerts_and_reports() -> None:
    op = HeavyHitterOperator(operator_id="hh", source_topic=TOPIC, partition=0,
                             sketch={"depth": 4, "width": 4096, "epoch_ms": 1000, "seed": 3},
                             raise_at=200, clear_at=50, top_k=10, report_interval_ms=1000)
    rnd = random.Random(1)
    recs = []
    for i in range(20_000):
        key = b"10.0.0.66" if rnd.random() < 0.2 else f"10.1.{rnd.randrange(200)}.{rnd.randrange(250)}".encode()
        recs.append(SourceRecord(TOPIC, 0, i, 5_000 + i // 4, key, None))
    out = op.process(recs)
    raised = [json.loads(o.value) for o in out if o.role == "alerts"]
    assert [a["key"] for a in raised if a["state"] == "raised"] == ["10.0.0.66"]
    reports = [json.loads(o.value) for o in out if o.role == "reports"]
    assert reports and reports[-1]["top"][0]["key"] == "10.0.0.66"
    clone = HeavyHitterOperator(operator_id="hh", source_topic=TOPIC, partition=0,
                                sketch={"depth": 4, "width": 4096, "epoch_ms": 1000, "seed": 3},
                                raise_at=200, clear_at=50, top_k=10, report_interval_ms=1000)
    clone.restore(op.snapshot())
    assert clone.snapshot() == op.snapshot()


def test_dedup_operator_forwards_first_sightings_only() -> None:
    op = DedupOperator(operator_id="dd", source_topic=TOPIC, partition=0,
                       bloom={"capacity": 10_000, "fp_rate": 0.001, "period_ms": 60_000, "seed": 5})
    recs = [SourceRecord(TOPIC, 0, i, 1000 + i, f"id-{i % 700}".encode(), f"payload-{i}".encode())
            for i in range(2000)]
    out = op.process(recs)
    fwd = [o for o in out if o.role == "forward"]
    assert [o.key for o in fwd] == [f"id-{i}".encode() for i in range(700)]
    assert fwd[3].value == b"payload-3"
    assert op.counters["duplicates"] == 1300


def test_rate_limit_operator_decides_every_request_with_exact_retry_after() -> None:
    from grudge_stream.operators.ratelimit import RateLimitOperator

    op = RateLimitOperator(operator_id="rl", source_topic=TOPIC, partition=0, rate_per_s=10.0, burst=5.0,
                           cells_per_level=1000, seed=1)
    recs = [SourceRecord(TOPIC, 0, i, 1000, b"tenant", b'{"cost": 1}') for i in range(7)]
    out = [json.loads(o.value) for o in op.process(recs)]
    assert [d["allowed"] for d in out] == [True] * 5 + [False] * 2
    retry = out[5]["retry_after_ms"]
    assert retry == 100  # one token refills in 100 ms at 10/s
    more = op.process([SourceRecord(TOPIC, 0, 7, 1000 + retry - 1, b"tenant", b'{"cost": 1}'),
                       SourceRecord(TOPIC, 0, 8, 1000 + retry, b"tenant", b'{"cost": 1}')])
    assert [json.loads(o.value)["allowed"] for o in more] == [False, True]
    bad = op.process([SourceRecord(TOPIC, 0, 9, 2000, b"tenant", b'{"cost": -1}')])
    assert bad[0].role == "dead_letters"
    clone = RateLimitOperator(operator_id="rl", source_topic=TOPIC, partition=0, rate_per_s=10.0, burst=5.0,
                              cells_per_level=1000, seed=1)
    clone.restore(op.snapshot())
    assert clone.snapshot() == op.snapshot()


def test_known_key_operator_checks_unknown_keys_and_caches_only_accepted_ones() -> None:
    from grudge_stream.operators.knownkeys import KnownKeyOperator

    op = KnownKeyOperator(operator_id="kk", source_topic=TOPIC, partition=0,
                          bloom={"capacity": 1000, "fp_rate": 0.001, "period_ms": 10_000, "seed": 2})
    ev = lambda i, key, kind, t=1000: SourceRecord(TOPIC, 0, i, t, key, json.dumps({"event": kind}).encode())  # noqa: E731
    out = op.process([ev(0, b"a", "seen"), ev(1, b"a", "accepted"), ev(2, b"a", "seen"),
                      ev(3, b"b", "seen"), ev(4, b"b", "rejected"), ev(5, b"b", "seen")])
    assert [(o.role, o.key) for o in out] == [("checks", b"a"), ("checks", b"b"), ("checks", b"b")]
    # Forgotten after two rotations: checked again.
    out = op.process([ev(6, b"a", "seen", 1000 + 25_000)])
    assert [(o.role, o.key) for o in out] == [("checks", b"a")]


@pytest.mark.parametrize("mode", ["single", "split"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_column_batch_path_equals_the_record_path(seed: int, mode: str) -> None:
    rnd = random.Random(seed)
    recs = stream(n=4000, seed=seed, jitter_ms=2500)
    # Bad records of every kind the batch path handles itself.
    mixed = []
    for r in recs:
        mixed.append(r)
        if rnd.random() < 0.05:
            bad = rnd.choice([(b"k", b"{nope"), (None, b'{"outcome":"bad"}'), (b"k", None),
                              (b"k", b'{"outcome":"meh"}'), (b"x" * 2000, b'{"outcome":"bad"}')])
            mixed.append(SourceRecord(TOPIC, 0, 0, r.timestamp_ms, bad[0], bad[1]))
    mixed = [SourceRecord(TOPIC, 0, i, r.timestamp_ms, r.key, r.value) for i, r in enumerate(mixed)]
    codec = EventCodec(value_field="outcome", outcomes={"bad": 0.1, "good": -0.01}, allow_numbers=False,
                       max_key_bytes=1000)
    slow = score_op(codec=codec, latch_capacity=2, score_mode=mode)
    fast = score_op(codec=codec, latch_capacity=2, score_mode=mode)
    ref = slow.process(mixed)
    out = []
    pos = 0
    while pos < len(mixed):
        n = rnd.randint(1, 700)
        chunk = mixed[max(0, pos - rnd.randint(0, 5)):pos + n]  # some re-delivered records too
        out += fast.process_columns(TOPIC, 0, [r.offset for r in chunk], [r.timestamp_ms for r in chunk],
                                    [r.key for r in chunk], [r.value for r in chunk])
        pos += n
    assert out == ref
    assert fast.snapshot() == slow.snapshot()
    assert any(o.role == "alerts" for o in ref) and any(o.role == "dead_letters" for o in ref)


@pytest.mark.parametrize("overload", ["shrink_window", "raise_fp"])
def test_dedup_operator_window_holds_at_capacity_and_overload_goes_the_chosen_way(overload: str) -> None:
    """New ids at `load` x capacity per period, each re-sent once at a random delay inside
    the window (one period, two generations): at capacity no id is forwarded twice in
    either mode; at 3x shrink_window forwards some re-sends and raise_fp none."""
    def run(load: float) -> tuple[DedupOperator, int, float]:
        rnd = random.Random(7)
        cap, period = 300, 10_000
        n = int(4 * load * cap)
        events = []
        for i in range(n):
            t = 1_000 + int(i * period / (load * cap))
            events += [(t, 0, i), (t + rnd.randrange(period), 1, i)]
        events.sort()
        op = DedupOperator(operator_id="dd", source_topic=TOPIC, partition=0,
                           bloom={"capacity": cap, "fp_rate": 1e-4, "period_ms": period, "seed": 5,
                                  "overload": overload})
        recs = [SourceRecord(TOPIC, 0, off, t, b"id-%d" % i, b"x") for off, (t, _, i) in enumerate(events)]
        half = len(recs) // 2
        out = op.process(recs[:half])
        fp_midway = op.bloom.fp_rate_estimate()
        fwd = [o.key for o in out + op.process(recs[half:]) if o.role == "forward"]
        return op, len(fwd) - len(set(fwd)), fp_midway

    op, twice, _ = run(1.0)
    assert twice == 0
    assert op.bloom.overload == overload and op.bloom.effective_window_ms == 10_000
    op, twice, fp_midway = run(3.0)
    if overload == "shrink_window":
        assert twice > 0 and op.bloom.overloads > 0 and fp_midway <= 1.05e-4
    else:
        assert twice == 0 and op.bloom.overloads > 0 and fp_midway > 1e-3
    clone = DedupOperator(operator_id="dd", source_topic=TOPIC, partition=0,
                          bloom={"capacity": 300, "fp_rate": 1e-4, "period_ms": 10_000, "seed": 5,
                                 "overload": overload})
    clone.restore(op.snapshot())
    assert clone.snapshot() == op.snapshot() and clone.bloom.overloads == op.bloom.overloads
    # the default overload leaves the state fingerprint as it was before the setting existed
    plain = DedupOperator(operator_id="dd", source_topic=TOPIC, partition=0,
                          bloom={"capacity": 300, "fp_rate": 1e-4, "period_ms": 10_000, "seed": 5})
    assert (plain.fingerprint == clone.fingerprint) == (overload == "shrink_window")


def test_dead_letter_reasons_fall_into_few_classes() -> None:
    from grudge_stream.operators.deadletters import REASON_CLASSES, reason_class

    cases = {
        "event time 5 is 9000 ms behind the partition's watermark 9005 (limit max_late_ms=100)": "late",
        "event time 99 is 50 ms ahead of processing time (limit max_future_ms=10)": "future",
        "missing time field 'ts'": "time",
        "time field 'ts' must be a number of ms, got str": "time",
        "missing key field 'user'": "key",
        "key is 300 bytes, more than max_key_bytes=256": "key",
        "value field 'outcome' must be an outcome string": "value",
        "the record is not JSON": "value",
        "raw record has neither key nor value": "key",
        "something else entirely": "other",
    }
    for reason, cls in cases.items():
        assert reason_class(reason) == cls, reason
    assert set(cases.values()) == set(REASON_CLASSES)


@pytest.mark.parametrize("name", ["abuse_scores", "rate_limit", "heavy_hitters", "dedup", "known_keys"])
def test_a_snapshot_taken_now_and_made_later_is_the_state_at_the_take(name) -> None:
    """Background snapshots: the copy at the take, serialized after more records changed
    the live state, is byte for byte the snapshot an eager call would have written then."""
    from grudge_stream.topology import Settings, load_topology

    topo = load_topology(name, Settings({"insecure_public_seed": "true"}, environ={}))
    value = {"abuse_scores": b'{"outcome":"bad"}', "rate_limit": b'{"cost": 1}', "heavy_hitters": b"1",
             "dedup": b"x", "known_keys": b'{"event": "accepted"}'}[name]
    op = topo.make_operator(0)
    t = 1_700_000_000_000
    recs = [SourceRecord(topo.source_topic, 0, i, t + i * 10, b"k%d" % (i % 37), value) for i in range(600)]
    op.process(recs[:300])
    later = op.snapshot_taken()
    eager = op.snapshot()
    op.process(recs[300:])
    assert op.snapshot() != eager  # the live state moved on
    assert later() == eager
    back = topo.make_operator(0)
    back.restore(later())
    assert back.snapshot() == eager


def tick(offset: int, ts: int) -> SourceRecord:
    return SourceRecord(TOPIC, 0, offset, ts, TICK_KEY, None)


def test_a_tick_moves_a_quiet_partitions_time_so_its_bans_clear() -> None:
    op = score_op()
    bad = json.dumps({"outcome": "bad"}).encode()
    recs = [SourceRecord(TOPIC, 0, i, 1_000_000 + i, b"mallory", bad) for i in range(8)]
    out = op.process(recs)
    assert [json.loads(o.value)["state"] for o in out if o.role == "alerts"] == ["raised"]
    assert op.wants_tick()
    wm = op.watermark
    # Behind the watermark, or before any event: nothing moves, nothing is dead-lettered.
    assert op.process([tick(8, wm - 5)]) == [] and op.watermark == wm
    fresh = score_op()
    assert fresh.process([tick(0, 5_000_000)]) == [] and fresh.watermark is None
    # A minute later (lambda 0.05/s: the score decays far below clear_at): cleared, by the tick.
    out = op.process([tick(9, wm + 60_000)])
    assert op.watermark == wm + 60_000
    cleared = [json.loads(o.value) for o in out if o.role == "alerts"]
    assert [a["state"] for a in cleared] == ["cleared"] and cleared[0]["source"]["offset"] == 9
    assert not op.wants_tick() and op.counters["ticks"] == 2 and op.counters["dead_letters"] == 0
    # A tick ahead of the future bound is not trusted.
    assert op.process([tick(10, 2**50)]) == [] and op.watermark == wm + 60_000


@pytest.mark.parametrize("mode", ["single", "split"])
def test_ticks_among_records_take_the_same_place_on_the_column_path(mode: str) -> None:
    recs = stream(n=3000, seed=5)
    mixed = []
    for i, r in enumerate(recs):
        mixed.append(r)
        if i % 400 == 399:  # a tick far ahead: sweeps, then later events are late
            mixed.append(tick(0, r.timestamp_ms + 30_000))
    mixed = [r._replace(offset=i) for i, r in enumerate(mixed)]
    slow, fast = score_op(score_mode=mode), score_op(score_mode=mode)
    ref = slow.process(mixed)
    out = []
    for pos in range(0, len(mixed), 333):
        chunk = mixed[pos:pos + 333]
        out += fast.process_columns(TOPIC, 0, [r.offset for r in chunk], [r.timestamp_ms for r in chunk],
                                    [r.key for r in chunk], [r.value for r in chunk])
    assert out == ref
    assert fast.snapshot() == slow.snapshot()
    assert slow.counters["ticks"] == 7
    # The ticks moved the clock: the events after each were behind it.
    assert slow.counters["late"] + slow.counters["late_dropped"] > 0


@pytest.mark.parametrize("make", [
    lambda: DedupOperator(operator_id="d", source_topic=TOPIC, partition=0,
                          bloom={"capacity": 1000, "fp_rate": 0.01, "period_ms": 60_000, "hasher": "siphash",
                                 "seed": 1}, codec=EventCodec(encoding="raw")),
    lambda: HeavyHitterOperator(operator_id="h", source_topic=TOPIC, partition=0,
                                sketch={"depth": 3, "width": 1000, "epoch_ms": 60_000, "hasher": "siphash",
                                        "seed": 1},
                                codec=EventCodec(value_field="count"), raise_at=100, clear_at=10),
])
def test_every_operator_takes_a_tick_as_time_not_as_a_bad_record(make) -> None:
    op = make()
    out = op.process([SourceRecord(TOPIC, 0, 0, 1000, b"k", b"{}" if op.kind != "dedup" else b"x"),
                      tick(1, 2000)])
    assert not [o for o in out if o.role == "dead_letters" and o.key == TICK_KEY]
    assert op.counters["ticks"] == 1 and op.next_offset == 2
