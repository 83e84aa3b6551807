"""Faust (faust-streaming on aiokafka) against the real broker the session provides.

Produces 20,000 keyed records into a 4-partition topic with confluent-kafka,
then runs a Faust worker (in a subprocess, see faust_count_worker.py) that
consumes the topic with an agent and a changelog-backed table, and checks
that every produced (partition, offset) was consumed exactly once.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

pytestmark = pytest.mark.kafka

N_RECORDS = 20_000
N_PARTITIONS = 4
N_KEYS = 5_000  # each key written N_RECORDS / N_KEYS = 4 times
WORKER = Path(__file__).with_name("faust_count_worker.py")
WORKER_TIMEOUT_S = 75.0  # the worker reports and stops itself by then
HARD_TIMEOUT_S = WORKER_TIMEOUT_S + 30.0  # then the test kills it


def produce_keyed(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """Produce N_RECORDS keyed records; return every delivered (partition, offset)."""
    from confluent_kafka import Producer

    delivered: list[tuple[int, int]] = []
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered.append((msg.partition(), msg.offset()))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            # Kafka's Java-client partitioner, so keys land where Faust/aiokafka
            # would put them too.
            "partitioner": "murmur2_random",
            "logger": logging.getLogger("tests.kafka.client"),
        }
    )
    for i in range(N_RECORDS):
        key = f"key-{i % N_KEYS:05d}".encode()
        while True:
            try:
                producer.produce(topic, key=key, value=str(i).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records still undelivered after flush"
    assert not errors, errors[:5]
    return delivered


@pytest.fixture
def faust_app_id(kafka_admin):
    """A unique Faust app id; its consumer group and internal topics are deleted afterwards."""
    app_id = f"grudge-it-{uuid.uuid4().hex[:10]}"
    yield app_id
    internal = [t for t in kafka_admin.list_topics(timeout=10).topics if t.startswith(app_id + "-")]
    futures = dict(kafka_admin.delete_topics(internal, operation_timeout=10)) if internal else {}
    futures.update(kafka_admin.delete_consumer_groups([app_id], request_timeout=10))
    for name, future in futures.items():
        try:
            future.result(15)
        except (KafkaException, TimeoutError) as exc:  # best effort on a shared broker
            logging.getLogger("tests.kafka.client").warning("cleanup of %s: %s", name, exc)


def test_faust_worker_consumes_every_record_exactly_once(
    kafka_bootstrap, kafka_admin, make_topic, faust_app_id, tmp_path
):
    topic = make_topic(N_PARTITIONS, suffix="events")
    delivered = produce_keyed(kafka_bootstrap, topic)
    assert len(delivered) == N_RECORDS
    expected = set(delivered)
    assert len(expected) == N_RECORDS
    produced_per_partition = Counter(p for p, _ in delivered)
    assert set(produced_per_partition) == set(range(N_PARTITIONS)), "some partition got no records"

    out = tmp_path / "result.json"
    log = tmp_path / "worker.log"
    app_id = faust_app_id
    cmd = [
        sys.executable,
        str(WORKER),
        "--bootstrap",
        kafka_bootstrap,
        "--topic",
        topic,
        "--partitions",
        str(N_PARTITIONS),
        "--expected",
        str(N_RECORDS),
        "--app-id",
        app_id,
        "--out",
        str(out),
        "--timeout",
        str(WORKER_TIMEOUT_S),
    ]
    with open(log, "wb") as log_fh:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT
        )
        try:
            rc = proc.wait(HARD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            pytest.fail(f"Faust worker hung past {HARD_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")

    worker_log = log.read_text(errors="replace")
    assert out.exists(), f"worker wrote no result (rc={rc}):\n{worker_log[-4000:]}"
    result = json.loads(out.read_text())
    assert result["reason"] == "complete", (
        f"worker timed out with {result['distinct']}/{N_RECORDS} records:\n{worker_log[-4000:]}"
    )
    assert rc == 0, f"worker exited with {rc} after a clean run:\n{worker_log[-4000:]}"

    seen = {(p, o) for p, o in result["seen"]}
    assert seen == expected
    assert result["events"] == N_RECORDS, "some record was delivered to the agent twice"
    assert {int(p): n for p, n in result["per_partition"].items()} == dict(produced_per_partition)
    assert result["distinct_keys"] == N_KEYS
    # The changelog-backed table saw every event once, per key.
    assert result["table_keys"] == N_KEYS
    assert result["table_total"] == N_RECORDS

    # Faust declared its internal topics on the broker itself, co-partitioned.
    topics = kafka_admin.list_topics(timeout=10).topics
    changelog = topics.get(f"{app_id}-key-counts-changelog")
    assert changelog is not None and len(changelog.partitions) == N_PARTITIONS
    assert f"{app_id}-__assignor-__leader" in topics
