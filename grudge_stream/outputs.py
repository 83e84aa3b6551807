"""Publishing operator outputs with a dedicated, idempotent confluent-kafka producer."""
from __future__ import annotations

import logging
from typing import Iterable

from confluent_kafka import Producer

from grudge_stream.exceptions import CheckpointError
from grudge_stream.operators.records import OutputRecord

log = logging.getLogger("grudge_stream.outputs")


class OutputPublisher:
    """Maps output roles to topics and produces records; ``flush()`` makes them durable.

    Outputs are at-least-once: the runtime flushes before every snapshot, so a
    snapshot never covers an output that was not delivered.
    """

    def __init__(self, bootstrap_servers: str, topics: dict[str, str], *, config: dict | None = None,
                 producer: Producer | None = None) -> None:
        self.topics = dict(topics)
        self._errors: list[str] = []
        # A caller's producer (e.g. a transactional one shared with the checkpoint store) or our own.
        self.producer = producer if producer is not None else Producer({
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            **(config or {}),
        })
        self.sent: dict[str, int] = {}

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err}")

    def publish(self, records: Iterable[OutputRecord]) -> int:
        n = 0
        produce = self.producer.produce
        for rec in records:
            topic = self.topics.get(rec.role)
            if topic is None:
                continue  # the topology does not publish this role
            while True:
                try:
                    produce(topic, value=rec.value, key=rec.key, on_delivery=self._on_delivery)
                    break
                except BufferError:
                    self.producer.poll(0.05)
            self.sent[rec.role] = self.sent.get(rec.role, 0) + 1
            n += 1
        self.producer.poll(0)
        return n

    def flush(self, timeout_s: float = 60.0) -> None:
        remaining = self.producer.flush(timeout_s)
        if remaining:
            raise CheckpointError(f"{remaining} output records undelivered after {timeout_s}s")
        if self._errors:
            errors, self._errors = self._errors, []
            raise CheckpointError(f"output records failed delivery: {errors[:5]}")
