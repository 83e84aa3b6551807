"""The output publisher on the real broker: what cannot be delivered is dead-lettered, and a
flush that cannot finish says so instead of letting a snapshot cover lost outputs."""
from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from grudge_stream.exceptions import DeliveryError
from grudge_stream.operators.records import OutputRecord
from grudge_stream.outputs import OutputPublisher

pytestmark = [pytest.mark.kafka]

FAST_FAIL = {"topic.metadata.propagation.max.ms": 1000}


def make_topics(bs: str, **configs: dict) -> dict[str, str]:
    run = uuid.uuid4().hex[:8]
    names = {role: f"out-{run}-{role}" for role in configs}
    admin = AdminClient({"bootstrap.servers": bs})
    futs = admin.create_topics([NewTopic(names[r], 1, 1, config=c) for r, c in configs.items()])
    for f in futs.values():
        f.result(30)
    return names


def read(bs: str, topic: str) -> list:
    c = Consumer({"bootstrap.servers": bs, "group.id": uuid.uuid4().hex, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    out, deadline = [], time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                break
            out.append(m)
        return out
    finally:
        c.close()


def test_too_large_and_refused_outputs_become_dead_letters(kafka_bootstrap) -> None:
    names = make_topics(kafka_bootstrap, scores={"max.message.bytes": "2000"}, dead_letters={})
    topics = {**names, "alerts": names["scores"].replace("scores", "missing")}
    pub = OutputPublisher(kafka_bootstrap, topics, operator_id="op", config=FAST_FAIL)
    assert pub.limits[names["scores"]] == 2000
    pub.publish([OutputRecord("scores", b"small", b'{"ok":1}'),
                 OutputRecord("scores", b"k" * 1500, b"v" * 1500),
                 OutputRecord("alerts", b"k2", b'{"alert_id":"a1"}')])
    pub.flush(timeout_s=60)
    assert [m.key() for m in read(kafka_bootstrap, names["scores"])] == [b"small"]
    dead = [json.loads(m.value()) for m in read(kafka_bootstrap, names["dead_letters"])]
    by_role = {d["output"]["role"]: d for d in dead}
    assert set(by_role) == {"scores", "alerts"} and len(dead) == 2
    assert "max.message.bytes" in by_role["scores"]["reason"]
    assert base64.b64decode(by_role["scores"]["value_b64"]) == b"v" * 1500
    assert "Unknown topic" in by_role["alerts"]["reason"]
    assert pub.dead_lettered == {"scores": 1, "alerts": 1}


def test_flush_that_cannot_finish_raises_instead_of_covering_lost_outputs(kafka_bootstrap) -> None:
    names = make_topics(kafka_bootstrap, scores={})
    topics = {"scores": names["scores"] + "-missing", "dead_letters": names["scores"] + "-dlq-missing"}
    pub = OutputPublisher(kafka_bootstrap, topics, operator_id="op", config=FAST_FAIL)
    pub.publish([OutputRecord("scores", b"k", b"v")])
    t0 = time.monotonic()
    with pytest.raises(DeliveryError, match="undelivered"):
        pub.flush(should_stop=lambda: True, grace_s=3)
    assert time.monotonic() - t0 < 30
    with pytest.raises(DeliveryError):  # still undelivered: every later flush refuses too
        pub.flush(should_stop=lambda: True, grace_s=1)


def test_outputs_of_an_aborted_transaction_are_dropped_never_sent_again(kafka_bootstrap) -> None:
    """Exactly-once: after an abort the records of the transaction are gone (purged or aborted);
    ``drop_unfinished`` forgets them, so no flush re-sends one into the next transaction."""
    from confluent_kafka import Producer

    names = make_topics(kafka_bootstrap, scores={}, dead_letters={})
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": uuid.uuid4().hex,
                         "linger.ms": 5000})  # still queued when the transaction aborts: purged
    producer.init_transactions(30)
    pub = OutputPublisher(kafka_bootstrap, names, producer=producer, operator_id="op")
    producer.begin_transaction()
    pub.publish([OutputRecord("scores", f"aborted-{i}".encode(), b"{}") for i in range(3)])
    producer.abort_transaction(30)
    pub.drop_unfinished()
    producer.poll(0.5)  # the purged records' reports arrive, and are ignored
    assert not pub.has_failures() and pub.delivered_through(pub.mark())
    producer.begin_transaction()
    pub.publish([OutputRecord("scores", f"kept-{i}".encode(), b"{}") for i in range(2)])
    producer.commit_transaction(30)
    pub.flush(timeout_s=30)
    assert [m.key() for m in read(kafka_bootstrap, names["scores"])] == [b"kept-0", b"kept-1"]
    assert read(kafka_bootstrap, names["dead_letters"]) == []
