"""Every output carries a deterministic id: the same records give the same ids, in every path."""
from __future__ import annotations

import json
import random

from grudge_stream.operators import EventCodec, SourceRecord
from grudge_stream.operators.deadletters import dead_letter_record
from grudge_stream.operators.dedup import DedupOperator
from grudge_stream.operators.knownkeys import KnownKeyOperator
from grudge_stream.operators.records import ID_HEADER, output_id, with_id_header
from grudge_stream.operators.scores import FeedbackScoreOperator

TOPIC = "events"
SKETCH = {"levels": 3, "cells_per_level": 5_000, "decay": {"kind": "exponential", "lambda_per_s": 0.05},
          "lo": 0.0, "hi": 1.0, "aggregator": "min", "hasher": "siphash", "seed": 11}
BLOOM = {"capacity": 10_000, "fp_rate": 0.001, "period_ms": 60_000, "seed": 5}


def test_alert_ids_are_output_ids_and_kinds_and_keys_tell_outputs_apart() -> None:
    ids = {output_id("op", 3, 17, kind, key) for kind in ("score", "decision") for key in (b"a", b"b")}
    ids |= {output_id("op", p, o, "score", b"a") for p, o in ((3, 18), (4, 17))}
    assert len(ids) == 6 and all(len(i) == 32 for i in ids)


def test_with_id_header_replaces_an_upstream_id() -> None:
    assert with_id_header(None, "x") == [(ID_HEADER, b"x")]
    assert with_id_header([("trace", b"t"), (ID_HEADER, b"old")], "new") == [("trace", b"t"), (ID_HEADER, b"new")]


def test_dead_letter_ids() -> None:
    src = {"topic": "t", "partition": 2, "offset": 9, "timestamp_ms": 5}
    a = json.loads(dead_letter_record("op", "bad", src, b"k", b"v").value)
    assert a["id"] == output_id("op", 2, 9, "dead_letter", b"k")
    # An undeliverable output has no source: its id is a digest of what it carried.
    u1 = json.loads(dead_letter_record("op", "too big", None, b"k", b"v1").value)["id"]
    u2 = json.loads(dead_letter_record("op", "too big", None, b"k", b"v2").value)["id"]
    assert u1 != u2 and u1 == json.loads(dead_letter_record("op", "refused", None, b"k", b"v1").value)["id"]


def score_stream(n: int = 3000) -> list[SourceRecord]:
    rnd = random.Random(4)
    recs, t = [], 1_000_000
    for i in range(n):
        t += rnd.randint(0, 40)
        key = f"abuser-{rnd.randrange(3)}" if rnd.random() < 0.15 else f"user-{rnd.randrange(500)}"
        bad = rnd.random() < (0.9 if key.startswith("abuser") else 0.05)
        recs.append(SourceRecord(TOPIC, 0, i, t, key.encode(), b'{"outcome":"bad"}' if bad else b'{"outcome":"good"}'))
    return recs


def score_op(**kw) -> FeedbackScoreOperator:
    return FeedbackScoreOperator(operator_id="scores", source_topic=TOPIC, partition=0, sketch=SKETCH,
                                 codec=EventCodec(value_field="outcome", outcomes={"bad": 0.1, "good": -0.01}),
                                 raise_at=0.5, clear_at=0.2, sweep_interval_ms=2_000, **kw)


def test_score_ids_are_the_same_in_a_rerun_and_on_the_column_path() -> None:
    recs = score_stream()
    rows = lambda out: [json.loads(o.value) for o in out if o.role == "scores"]  # noqa: E731
    a = rows(score_op().process(recs))
    b = rows(score_op().process_columns(TOPIC, 0, [r.offset for r in recs], [r.timestamp_ms for r in recs],
                                        [r.key for r in recs], [r.value for r in recs]))
    assert a and a == b
    assert all(s["id"] == output_id("scores", 0, s["source"]["offset"], "score", s["key"].encode()) for s in a)
    every = rows(score_op(emit_scores="every").process(recs))
    assert len({s["id"] for s in every}) == len(recs)


def test_forwarded_records_carry_their_id_in_a_header() -> None:
    recs = [SourceRecord(TOPIC, 0, i, 1000 + i, f"id-{i % 7}".encode(), b"payload",
                         [("trace", b"t"), (ID_HEADER, b"upstream")]) for i in range(20)]

    def forwarded():
        op = DedupOperator(operator_id="dd", source_topic=TOPIC, partition=0, bloom=BLOOM)
        return [o for o in op.process(recs, processing_ms=10_000) if o.role == "forward"]

    out = forwarded()
    assert len(out) == 7
    assert [o.headers for o in out] == [o.headers for o in forwarded()]
    for o, r in zip(out, recs):
        assert o.headers == [("trace", b"t"), (ID_HEADER, output_id("dd", 0, r.offset, "forward", r.key).encode())]
    kk = KnownKeyOperator(operator_id="kk", source_topic=TOPIC, partition=0, bloom=BLOOM)
    (check,) = kk.process([SourceRecord(TOPIC, 0, 0, 1000, b"k", b'{"event":"seen"}', [(ID_HEADER, b"up")])],
                          processing_ms=10_000)
    assert check.headers == [(ID_HEADER, json.loads(check.value)["id"].encode())]
