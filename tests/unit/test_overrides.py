"""Overrides and the alert state output, in-process (no broker)."""
from __future__ import annotations

import json
import random

import pytest

from grudge_stream.exceptions import ConfigError
from grudge_stream.operators import EventCodec, SourceRecord
from grudge_stream.operators.alerts import AlertLatch
from grudge_stream.overrides import OverrideTable, decode_override, encode_override, parse_duration
from tests.unit.test_operators import TOPIC, score_op, stream


def ev(offset: int, key: bytes, outcome: str, ts: int) -> SourceRecord:
    return SourceRecord(TOPIC, 0, offset, ts, key, json.dumps({"outcome": outcome}).encode())


def table(**entries) -> OverrideTable:
    t = OverrideTable()
    for key, (action, created, expires) in entries.items():
        body = json.loads(encode_override(action, now_ms=created,
                                          for_ms=None if expires is None else expires - created))
        t.apply(key.encode(), json.dumps(body).encode())
    return t


def raised_from_state(outputs) -> set[bytes]:
    """The raised set a compacted alert_state topic ends with: last value per key."""
    last: dict[bytes, bytes | None] = {}
    for o in outputs:
        if o.role == "alert_state":
            last[o.key] = o.value
    return {k for k, v in last.items() if v is not None}


def test_parse_duration_and_encoding() -> None:
    assert parse_duration("90s") == 90_000
    assert parse_duration("15m") == 900_000
    assert parse_duration("1h") == 3_600_000
    assert parse_duration("2d") == 172_800_000
    assert parse_duration("250ms") == 250
    assert parse_duration("30") == 30_000
    for bad in ("", "abc", "-1h", "0s", "nanh"):
        with pytest.raises(ConfigError):
            parse_duration(bad)
    o = decode_override(encode_override("deny", now_ms=1000, for_ms=500, reason="r", by="me"))
    assert (o.action, o.created_ms, o.expires_ms, o.reason, o.by) == ("deny", 1000, 1500, "r", "me")
    assert o.active(1000) and o.active(1499) and not o.active(1500) and not o.active(999)
    with pytest.raises(ConfigError):
        encode_override("ban")
    for bad in (b"[]", b'{"action":"ban"}', b'{"action":"deny","created_ms":"x"}'):
        with pytest.raises(ValueError):
            decode_override(bad)


def test_override_table_applies_entries_tombstones_and_ignores_junk() -> None:
    t = OverrideTable()
    assert t.apply(b"k", encode_override("deny", now_ms=10)) is not None
    assert t.action(b"k", 10) == "deny" and t.action(b"k", 9) is None
    assert t.denied(20) == [b"k"]
    t.apply(b"k", encode_override("allow", now_ms=10))
    assert t.action(b"k", 11) == "allow" and t.denied(20) == []
    assert t.apply(b"k", b"not json") is None and t.ignored == 1
    assert t.action(b"k", 11) == "allow"  # junk does not replace an entry
    assert t.apply(b"k", None) is not None and t.action(b"k", 11) is None and len(t) == 0
    assert t.apply(b"gone", None) is None
    assert t.apply(None, encode_override("deny")) is None


def test_latch_force_remove_and_eviction_list() -> None:
    latch = AlertLatch(0.5, 0.2, capacity=10)
    assert latch.force(b"d", 0.0) == "raised" and b"d" in latch
    assert latch.force(b"d", 0.1) is None
    assert latch.remove(b"d") and not latch.remove(b"d")
    for i in range(10):
        latch.observe(f"k{i}".encode(), 0.6 + i / 100)
    assert latch.force(b"d", 0.0) == "raised"  # overflow: the forced key itself is kept
    assert b"d" in latch and latch.evicted and b"d" not in latch.evicted
    assert all(k not in latch for k in latch.evicted)
    assert latch.sweep(lambda k: 0.0, keep=lambda k: k == b"d") and list(latch.keys()) == [b"d"]


def test_deny_raises_and_allow_clears_at_the_next_event_with_state_records() -> None:
    t0 = 1_000_000
    op = score_op()
    op.overrides = table(**{"user-1": ("deny", t0 + 1000, None), "abuser": ("allow", t0 + 5000, t0 + 9000)})
    out = op.process([ev(0, b"user-1", "good", t0)])  # before the entry was made: not applied
    assert not [o for o in out if o.role == "alerts"]
    out = op.process([ev(1, b"user-1", "good", t0 + 1000)])
    alerts = [json.loads(o.value) for o in out if o.role == "alerts"]
    assert [(a["key"], a["state"], a.get("override")) for a in alerts] == [("user-1", "raised", "deny")]
    assert raised_from_state(out) == {b"user-1"}
    # The abuser raises by score, is cleared by the allow entry, and cannot raise while it holds.
    recs = [ev(2 + i, b"abuser", "bad", t0 + 2000 + i) for i in range(10)]
    out = op.process(recs)
    assert b"abuser" in op.latch
    out = op.process([ev(20, b"abuser", "bad", t0 + 5000)])
    states = [(o.key, json.loads(o.value)["state"], json.loads(o.value).get("override"))
              for o in out if o.role == "alerts"]
    assert states == [(b"abuser", "cleared", "allow")]
    assert [o.value for o in out if o.role == "alert_state"] == [None]
    out = op.process([ev(21 + i, b"abuser", "bad", t0 + 5001 + i) for i in range(20)])
    assert b"abuser" not in op.latch and not [o for o in out if o.role == "alerts"]
    # The allow entry expires: the next event judges by score again.
    out = op.process([ev(50, b"abuser", "bad", t0 + 9000)])
    assert [json.loads(o.value)["state"] for o in out if o.role == "alerts"] == ["raised"]
    # A denied key is not cleared by the sweep however low its score.
    out = op.process([ev(51, b"user-2", "good", t0 + 60_000)])
    assert b"user-1" in op.latch
    assert b"abuser" not in op.latch  # decayed and swept


def test_sweep_clears_an_allowed_key_without_an_event_for_it() -> None:
    t0 = 1_000_000
    op = score_op()
    op.overrides = OverrideTable()
    op.process([ev(i, b"abuser", "bad", t0 + i) for i in range(10)])
    assert b"abuser" in op.latch
    op.overrides.apply(b"abuser", encode_override("allow", now_ms=t0 + 100))
    out = op.process([ev(10, b"other", "good", t0 + 2_500)])  # crosses a sweep (every 2 s)
    alerts = [json.loads(o.value) for o in out if o.role == "alerts"]
    assert [(a["key"], a["state"], a.get("override")) for a in alerts] == [("abuser", "cleared", "allow")]
    assert b"abuser" not in op.latch


@pytest.mark.parametrize("seed", [1, 2])
def test_column_path_equals_record_path_with_overrides_and_state_records(seed: int) -> None:
    rnd = random.Random(seed)
    recs = stream(n=4000, seed=seed, jitter_ms=500)
    t_mid = recs[len(recs) // 3].timestamp_ms
    entries = {"user-7": ("deny", t_mid, None), "user-9": ("deny", recs[0].timestamp_ms, t_mid),
               **{f"abuser-{i}": ("allow", t_mid, t_mid + 20_000) for i in range(3)}}
    codec = EventCodec(value_field="outcome", outcomes={"bad": 0.1, "good": -0.01}, allow_numbers=False)
    slow, fast = score_op(codec=codec, latch_capacity=3), score_op(codec=codec, latch_capacity=3)
    slow.overrides, fast.overrides = table(**entries), table(**entries)
    ref = slow.process(recs)
    out = []
    pos = 0
    while pos < len(recs):
        n = rnd.randint(1, 700)
        chunk = recs[pos:pos + n]
        out += fast.process_columns(TOPIC, 0, [r.offset for r in chunk], [r.timestamp_ms for r in chunk],
                                    [r.key for r in chunk], [r.value for r in chunk])
        pos += n
    assert out == ref
    overridden = {json.loads(o.value).get("override") for o in ref if o.role == "alerts"}
    assert {"allow", "deny"} <= overridden
    # The alert state records end in exactly the latch's raised set (evictions included).
    assert raised_from_state(ref) == set(slow.latch.keys())
    assert any(o.role == "alert_state" and o.value is None for o in ref)


def test_rate_limit_overrides_decide_before_the_bucket_and_spend_nothing() -> None:
    from grudge_stream.operators.ratelimit import RateLimitOperator

    op = RateLimitOperator(operator_id="rl", source_topic=TOPIC, partition=0, rate_per_s=10.0, burst=2.0,
                           cells_per_level=1000, seed=1)
    op.overrides = table(**{"partner": ("allow", 1000, None), "fraud": ("deny", 1000, 1500)})

    def decide(offset, key, ts):
        out = op.process([SourceRecord(TOPIC, 0, offset, ts, key, b'{"cost": 1}')])
        return json.loads(out[0].value)

    got = [decide(i, b"partner", 1000) for i in range(5)]
    assert all(d["allowed"] and d["override"] == "allow" for d in got)
    d = decide(5, b"fraud", 1200)
    assert (d["allowed"], d["retry_after_ms"], d["override"]) == (False, 300, "deny")
    # After the deny expires the bucket decides, untouched by the denied requests.
    got = [decide(6 + i, b"fraud", 1500) for i in range(3)]
    assert [g["allowed"] for g in got] == [True, True, False] and "override" not in got[0]
    # The allowed key's bucket was never charged.
    op.overrides = None
    assert [decide(10 + i, b"partner", 1000)["allowed"] for i in range(3)] == [True, True, False]
