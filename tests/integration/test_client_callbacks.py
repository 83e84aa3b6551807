"""confluent-kafka keeps a per-thread call state per client while one of its calls serves
callbacks (consume, poll, flush, list_topics, ...). A client method of that kind called from
inside one of the same client's callbacks clears it, and the next callback of the outer call
aborts the process in C (``CallState_get: Assertion 'cs != NULL' failed``, SIGABRT): the
exactly-once worker died that way right after restoring partitions during broker bounces,
because the batch worker asked its own consumer for the partition count inside on_assign."""
from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = [pytest.mark.kafka]


def test_batch_worker_restores_inside_on_assign_while_the_consumer_logs(harness) -> None:
    # librdkafka's consumer-group debug logs reach the worker's logger callback all through
    # the consume() that runs on_assign, as broker bounces make them do in production.
    h = harness(partitions=2, runtime="batch", exactly_once="true", transaction_timeout_s=10)
    h.produce(h.make_events(2000, seed=9))
    w = h.start_worker(**{"kafka.debug": "cgrp,topic"})
    h.wait_caught_up(timeout=90)
    assert w.proc.poll() is None, w.log()[-3000:]
    assert w.stop() == 0, w.log()[-3000:]
    assert "CallState_get" not in w.log()


def test_the_abort_needs_a_callback_serving_call_inside_a_callback(kafka_bootstrap) -> None:
    """The mechanism, shown on a bare consumer: asking the partition count of anything but the
    consumer itself inside on_assign is safe (what the worker does now)."""
    topic = f"cb-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(20)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(10):
        p.produce(topic, b"x")
    assert p.flush(10) == 0
    quiet = logging.getLogger("grudge_stream.test.callbacks")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic, "auto.offset.reset": "earliest",
                  "logger": quiet, "debug": "cgrp,fetch"})
    counts = []

    def on_assign(consumer, partitions):
        counts.append(len(admin.list_topics(topic, timeout=10).topics[topic].partitions))
        consumer.assign(partitions)

    c.subscribe([topic], on_assign=on_assign)
    got = 0
    for _ in range(40):
        got += len(c.consume(100, timeout=0.1))
    c.close()
    assert counts == [2] and got == 10
