"""Typed output records: each kind is an immutable named tuple whose bytes are the JSON the
operators sent before (pinned here and in test_config_pins.py)."""
from __future__ import annotations

import json

import pytest

from grudge_stream.operators import SourceRecord
from grudge_stream.operators.alerts import AlertLatch
from grudge_stream.operators.deadletters import dead_letter_record
from grudge_stream.operators.globaltopk import GlobalTopKOperator
from grudge_stream.operators.ratelimit import RateLimitOperator, request_id_fields, request_id_of
from grudge_stream.operators.records import (
    Alert,
    CutBytes,
    DeadLetter,
    GlobalTopKEntry,
    GlobalTopKReport,
    KeyCheck,
    MergedTopK,
    OutputRecord,
    RateDecision,
    RequestId,
    ScoreUpdate,
    Source,
    TopKEntry,
    TopKReport,
    key_fields,
    output_id,
)

SRC = Source("t", 2, 7)
SRC_JSON = '"source":{"topic":"t","partition":2,"offset":7}'


@pytest.mark.parametrize("record, role, wire", [
    (Alert("a1", "op", b"k", "raised", 0.75, 0.5, 100, SRC),
     "alerts", '{"alert_id":"a1","operator":"op","key":"k","state":"raised","score":0.75,"threshold":0.5,'
               '"event_time_ms":100,' + SRC_JSON + '}'),
    (Alert("a1", "op", b"\xff", "cleared", 0.1, 0.25, 100, SRC, "allow"),
     "alerts", '{"alert_id":"a1","operator":"op","key":null,"key_b64":"/w==","state":"cleared","score":0.1,'
               '"threshold":0.25,"event_time_ms":100,' + SRC_JSON + ',"override":"allow"}'),
    (ScoreUpdate("s1", "op", b"k", 0.5, 9, SRC),
     "scores", '{"id":"s1","operator":"op","key":"k","score":0.5,"event_time_ms":9,' + SRC_JSON + '}'),
    (ScoreUpdate("s1", "op", b"k", 0.5, 9, SRC, "raised"),
     "scores", '{"id":"s1","operator":"op","key":"k","score":0.5,"event_time_ms":9,' + SRC_JSON
               + ',"crossing":"raised"}'),
    (RateDecision("d1", "op", b"k", RequestId(7), False, None, 2, 9, SRC, "deny"),
     "decisions", '{"id":"d1","operator":"op","key":"k","request_id":7,"allowed":false,"retry_after_ms":null,'
                  '"cost":2,"event_time_ms":9,' + SRC_JSON + ',"override":"deny"}'),
    (KeyCheck("c1", "op", b"k", 9, SRC),
     "checks", '{"id":"c1","operator":"op","key":"k","event_time_ms":9,' + SRC_JSON + '}'),
    (TopKReport("r1", "op", 1, None, 0, 10, 10, 2, (TopKEntry(b"a", 3), TopKEntry(b"\xfe", 1)), SRC),
     "reports", '{"id":"r1","operator":"op","partition":1,"partitions":null,"interval_start_ms":0,'
                '"interval_end_ms":10,"event_time_ms":10,"k":2,"top":[{"key":"a","estimate":3},'
                '{"key":null,"key_b64":"/g==","estimate":1}],' + SRC_JSON + '}'),
    (GlobalTopKReport("g1", "op", "hh", 0, 10, "complete",
                      MergedTopK(1, 2, (), True, True, (GlobalTopKEntry(b"a", 3),)), 10, SRC),
     "global_reports", '{"id":"g1","operator":"op","source_operator":"hh","interval_start_ms":0,"interval_end_ms":10,'
                       '"closed_by":"complete","k":1,"partitions":2,"missing":[],"complete":true,"exact":true,'
                       '"top":[{"key":"a","estimate":3}],"event_time_ms":10,' + SRC_JSON + '}'),
])
def test_typed_records_produce_the_wire_bytes(record, role, wire: str) -> None:
    assert record.to_bytes() == wire.encode()
    assert record.role == role
    assert record.output(b"key") == OutputRecord(role, b"key", wire.encode())
    assert list(record.body()) == list(json.loads(wire))  # the field order is the wire order
    with pytest.raises(AttributeError):
        record.operator = "other"  # type: ignore[misc]  # immutable


def test_the_latch_builds_typed_alerts() -> None:
    latch = AlertLatch(0.5, 0.25)
    alert = latch.alert(operator_id="op", key=b"k", state="raised", score=0.6, event_time_ms=5, source=SRC)
    assert isinstance(alert, Alert) and alert.threshold == 0.5
    assert alert.alert_id == output_id("op", SRC.partition, SRC.offset, "raised", b"k")
    assert key_fields(b"\xff") == {"key": None, "key_b64": "/w=="}


def test_request_ids_keep_their_fields() -> None:
    assert request_id_fields("abc") == {"request_id": "abc"}
    assert request_id_fields(b"\xff\xfe") == {"request_id": None, "request_id_b64": "//4="}
    long = request_id_of(b"x" * 2000)
    assert long.request_id is None and long.request_id_bytes == 2000
    assert list(long.body()) == ["request_id", "request_id_sha256", "request_id_bytes"]


# Computed with the operators before the typed records (the same bytes must come out).
PINNED_GLOBAL = [('global_reports',
  b'0',
  b'{"id":"84d1fda507f0f863536662bb3bbe7d8c","operator":"g","source_operator":"hh","interval_start_ms":0,"in'
  b'terval_end_ms":1000,"closed_by":"complete","k":2,"partitions":2,"missing":[],"complete":true,"exact":fal'
  b'se,"top":[{"key":"b","estimate":7,"estimate_max":7,"partitions":[0,1],"split":true},{"key":"a","estimate'
  b'":5,"estimate_max":6,"partitions":[0]}],"unlisted_max":5,"event_time_ms":1000,"source":{"topic":"t","par'
  b'tition":0,"offset":1}}'),
 ('global_reports',
  b'1000',
  b'{"id":"30f9c6e07eba9d0e093c823e2ec513d1","operator":"g","source_operator":"hh","interval_start_ms":1000,'
  b'"interval_end_ms":2000,"closed_by":"grace","k":1,"partitions":3,"missing":[1,2],"complete":false,"exact"'
  b':false,"top":[{"key":"a","estimate":5,"estimate_max":5,"partitions":[0]}],"unlisted_max":5,"event_time_m'
  b's":6000,"source":{"topic":"t","partition":0,"offset":3}}')]
PINNED_DECISIONS = [('decisions',
  b'k',
  b'{"id":"f83c8675e591773b45b1a48911ea737c","operator":"rl","key":"k","request_id":null,"request_id_b64":"/'
  b'/4=","allowed":true,"retry_after_ms":0,"cost":1.0,"event_time_ms":1000,"source":{"topic":"t","partition"'
  b':0,"offset":0}}'),
 ('decisions',
  b'k',
  b'{"id":"05a7391ae0fd2afb6d2dedc32d4b2a38","operator":"rl","key":"k","request_id":null,"request_id_sha256"'
  b':"5c0e0ea421571c300b5df6aec0a118b5c3dc02e0683a546341d5efc689df2f58","request_id_bytes":2000,"allowed":fa'
  b'lse,"retry_after_ms":1000,"cost":1.0,"event_time_ms":1000,"source":{"topic":"t","partition":0,"offset":1'
  b'}}'),
 ('decisions',
  b'\xfa',
  b'{"id":"cf4c0b92d796e4e144867b1899082b2f","operator":"rl","key":null,"key_b64":"+g==","request_id":"q","a'
  b'llowed":false,"retry_after_ms":null,"cost":2.0,"event_time_ms":1000,"source":{"topic":"t","partition":0,'
  b'"offset":2}}')]


def test_unkeyed_global_reports_and_request_id_forms_are_the_same_bytes() -> None:
    op = GlobalTopKOperator(operator_id="g", source_topic="t", partition=0, keyed=False, grace_ms=500, top_k=3)
    vals = [
        b'{"operator":"hh","partition":0,"partitions":2,"interval_start_ms":0,"interval_end_ms":1000,"k":2,'
        b'"top":[{"key":"a","estimate":5},{"key":"b","estimate":4}]}',
        b'{"operator":"hh","partition":1,"partitions":2,"interval_start_ms":0,"interval_end_ms":1000,"k":2,'
        b'"top":[{"key":"b","estimate":3},{"key_b64":"/w==","estimate":1}]}',
        b'{"operator":"hh","partition":0,"partitions":3,"interval_start_ms":1000,"interval_end_ms":2000,"k":1,'
        b'"top":[{"key":"a","estimate":5}]}',
        b'{"operator":"hh","partition":0,"partitions":3,"interval_start_ms":5000,"interval_end_ms":6000,"k":1,'
        b'"top":[]}',
    ]
    out = op.process([SourceRecord("t", 0, i, 0, b"0", v) for i, v in enumerate(vals)], processing_ms=10_000)
    assert [(o.role, o.key, o.value) for o in out] == PINNED_GLOBAL

    rl = RateLimitOperator(operator_id="rl", source_topic="t", partition=0, rate_per_s=1, burst=1)
    recs = [SourceRecord("t", 0, 0, 1000, b"k", b'{"cost":1}', [("request-id", b"\xff\xfe")]),
            SourceRecord("t", 0, 1, 1000, b"k", b'{"cost":1}', [("request-id", b"x" * 2000)]),
            SourceRecord("t", 0, 2, 1000, b"\xfa", b'{"cost":2,"request_id":"q"}')]
    out = rl.process(recs, processing_ms=1000)
    assert [(o.role, o.key, o.value) for o in out] == PINNED_DECISIONS


DEAD_LETTER_CASES = [
    ("op", "bad json", {"topic": "t", "partition": 1, "offset": 2, "timestamp_ms": 3}, b"k", b"v" * 10, 1000, None),
    ("op", "r" * 3000, {"topic": "t", "partition": 1, "offset": 2, "timestamp_ms": 3}, b"k" * 5000, b"v" * 90000,
     4000, None),
    ("op", "undeliverable", None, None, b"\xff" * 700, 1200, {"output": {"role": "alerts", "topic": "a"}}),
    ("op", "x", None, b"kk", None, 1000, {"stage": "repartition"}),
]
# Computed with dead_letter_record before DeadLetter existed (a cut key and value included).
PINNED_DEAD_LETTERS = [('dead_letters',
  b'k',
  b'{"id":"67b58e7c194c66037a7f0122c7be6a0e","reason":"bad json","operator":"op","source":{"topic":"t","part'
  b'ition":1,"offset":2,"timestamp_ms":3},"key_b64":"aw==","value_b64":"dnZ2dnZ2dnZ2dg=="}'),
 ('dead_letters',
  b'sha256:622b8b1d5094d382aa519349554c0ea84a43c90b4aad7ddfae8f338690c7f7ea',
  b'{"id":"553771e4f641252a49a4c292df19e0d7","reason":"rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr'
  b'rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr...","operator":"op","source"'
  b':{"topic":"t","partition":1,"offset":2,"timestamp_ms":3},"key_b64":"a2tra2tra2tra2tra2tra2tra2tra2tra2tr'
  b'a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tr'
  b'a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tr'
  b'a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tr'
  b'a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tr'
  b'a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tr'
  b'a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2tr'
  b'a2tra2tra2tra2tra2tra2tra2tra2tra2tr","key_bytes":5000,"key_sha256":"622b8b1d5094d382aa519349554c0ea84a4'
  b'3c90b4aad7ddfae8f338690c7f7ea","key_truncated":true,"value_b64":"dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ'
  b'2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ'
  b'2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ'
  b'2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ'
  b'2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ'
  b'2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2","'
  b'value_bytes":90000,"value_sha256":"68f767290cf5a376831ed2f055d1ef6f194a7d232042b9ddfa7065dc1367507e","va'
  b'lue_truncated":true}'),
 ('dead_letters',
  None,
  b'{"id":"96f51203fcc199e15b5d91fa88024f70","reason":"undeliverable","operator":"op","source":null,"output"'
  b':{"role":"alerts","topic":"a"},"key_b64":null,"value_b64":"/////////////////////////////////////////////'
  b'////////////////////////////////////////////////////////////////////////////////////////////////////////'
  b'////////////////////////////////////////////////////////////////////////////////////////////////////////'
  b'////////////////////////////////////////////////////////////////////////////////////////////////////////'
  b'////////////////////////////////////////////////////////////////////////////////////////////////////////'
  b'////////////////////////////////////////////////////////////////////////////////////////////////////////'
  b'///////////////////////////////////////////////////////////////////////////////////////////////","value_'
  b'bytes":700,"value_sha256":"77e7fe2d3aa648f268d4a74851f11806e18283aa8c4988cb5a6b89b120d51616","value_trun'
  b'cated":true}'),
 ('dead_letters',
  b'kk',
  b'{"id":"4ab71ff18e31838c9191ac64324bc840","reason":"x","operator":"op","source":null,"stage":"repartition'
  b'","key_b64":"a2s=","value_b64":null}')]


def test_dead_letters_are_the_same_bytes() -> None:
    got = [dead_letter_record(*c[:6], extra=c[6]) for c in DEAD_LETTER_CASES]
    assert [(o.role, o.key, o.value) for o in got] == PINNED_DEAD_LETTERS
    cut = json.loads(got[1].value)
    assert cut["key_truncated"] is True and cut["value_bytes"] == 90000
    assert len(got[1].key) + len(got[1].value) <= 4000
    dl = DeadLetter("i", "why", "op", None, None, CutBytes("aw=="), CutBytes(None))
    assert dl.to_bytes() == b'{"id":"i","reason":"why","operator":"op","source":null,"key_b64":"aw==","value_b64":null}'
