"""Rate-limit decisions echo the request id, and every request gets a decision or a dead letter."""
from __future__ import annotations

import json
import secrets

import pytest

from grudge_stream.operators.ratelimit import MAX_REQUEST_ID_BYTES, RateLimitOperator
from grudge_stream.operators.records import SourceRecord
from grudge_stream.topology import Settings, load_topology

TOPIC = "requests"


def op_(**kw) -> RateLimitOperator:
    return RateLimitOperator(operator_id="rl", source_topic=TOPIC, partition=0, rate_per_s=10.0, burst=5.0,
                             cells_per_level=1000, **kw)


def rec(i: int, value: bytes | None, headers=None, key: bytes = b"tenant-1") -> SourceRecord:
    return SourceRecord(TOPIC, 0, i, 1_000 + i, key, value, headers)


def run(op, recs) -> list[tuple[str, dict]]:
    return [(o.role, json.loads(o.value)) for o in op.process(recs, processing_ms=10_000)]


def test_request_id_comes_from_the_header_then_the_field_else_null() -> None:
    out = run(op_(), [
        rec(0, b'{"cost":1,"request_id":"from-field"}', [("request-id", b"from-header")]),
        rec(1, b'{"cost":1,"request_id":"from-field"}', [("other", b"x")]),
        rec(2, b'{"cost":1,"request_id":42}'),
        rec(3, b'{"cost":1}'),
        rec(4, b'{"cost":1}', [("request-id", b"\xff\xfe")]),
        rec(5, b'{"cost":1}', [("request-id", b"r" * (MAX_REQUEST_ID_BYTES + 1))]),
    ])
    assert [r for r, _ in out] == ["decisions"] * 6
    d = [b for _, b in out]
    assert [x["request_id"] for x in d] == ["from-header", "from-field", 42, None, None, None]
    assert d[4]["request_id_b64"] == "//4="
    assert d[5]["request_id_bytes"] == MAX_REQUEST_ID_BYTES + 1 and len(d[5]["request_id_sha256"]) == 64


def test_request_id_settings_rename_or_turn_off_the_sources() -> None:
    op = op_(request_id_header="x-req", request_id_field="rid")
    out = run(op, [rec(0, b'{"rid":"a","request_id":"no"}', [("request-id", b"no")]),
                   rec(1, b'{"rid":"a"}', [("x-req", b"b")])])
    assert [b["request_id"] for _, b in out] == ["a", "b"]
    off = op_(request_id_header=None, request_id_field=None)
    assert not off.needs_headers
    out = run(off, [rec(0, b'{"request_id":"a"}', [("request-id", b"b")])])
    assert out[0][1]["request_id"] is None


def test_a_missing_cost_is_the_default_cost_and_an_invalid_one_a_dead_letter() -> None:
    op = op_(default_cost=2.0)
    out = run(op, [rec(0, b'{"request_id":"a"}'), rec(1, b'{}'), rec(2, b'{"cost":null}'),
                   rec(3, b'{"cost":"x"}'), rec(4, b'{"cost":-1}'), rec(5, b'{"cost":3}'),
                   rec(6, b'{"cost":1,"request_id":{"nested":1}}'), rec(7, b'[1]')])
    roles = [r for r, _ in out]
    assert roles == ["decisions", "decisions", "dead_letters", "dead_letters", "dead_letters", "decisions",
                     "dead_letters", "dead_letters"]
    assert [b["cost"] for r, b in out if r == "decisions"] == [2.0, 2.0, 3.0]
    # 5 tokens: 2 + 2 allowed, then 3 is denied.
    assert [b["allowed"] for r, b in out if r == "decisions"] == [True, True, False]
    assert "request id field" in out[6][1]["reason"]
    assert op.counters["events"] + op.counters["dead_letters"] == 8


def test_decision_and_dead_letter_ids_are_stable_across_a_rerun() -> None:
    recs = [rec(i, b'{"cost":1}' if i % 5 else b'{"cost":"bad"}', key=b"k%d" % (i % 3)) for i in range(40)]
    a, b = op_().process(recs, processing_ms=10_000), op_().process(recs, processing_ms=10_000)
    ids = [json.loads(o.value)["id"] for o in a]
    assert ids == [json.loads(o.value)["id"] for o in b]
    assert len(set(ids)) == 40


def test_rate_limit_topology_reads_the_request_settings() -> None:
    topo = load_topology("rate_limit", Settings({"cells_per_level": "1000", "seed": secrets.token_hex(16),
                                                 "default_cost": "0.5", "request_id_field": "rid"}, environ={}))
    op = topo.make_operator(0)
    assert op.needs_headers and op.default_cost == 0.5
    assert topo.make_operator(1).codec is op.codec  # one payload cache for all partitions
    (d,) = [json.loads(o.value) for o in op.process([SourceRecord(topo.source_topic, 0, 0, 1_000, b"k",
                                                                  b'{"rid":"z"}')], processing_ms=10_000)]
    assert d["cost"] == 0.5 and d["request_id"] == "z"


def test_default_cost_is_checked() -> None:
    from grudge_stream import ConfigError

    with pytest.raises(ConfigError):
        op_(default_cost=-1.0)
