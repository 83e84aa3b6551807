"""Publishing operator outputs with a dedicated, idempotent confluent-kafka producer.

Outputs are at-least-once, and no snapshot ever covers an output that was not
delivered. The publisher keeps that promise on hostile input:

- **Sizes**: each output topic's ``max.message.bytes`` is read from the broker
  at start. An output that would not fit (a forwarded record at the broker's
  limit, say) is not sent; a dead letter describing it, cut to fit the
  dead-letter topic, goes instead (``grudge_outputs_dead_lettered_total``).
- **Refusals**: an output the broker refuses for good (topic missing, record
  invalid, not authorized) is dead-lettered the same way, once ``flush`` sees
  the delivery report.
- **Outages**: the producer retries without a deadline
  (``message.timeout.ms=0``, order kept by idempotence), so a broker outage
  only delays outputs. ``flush`` — which every checkpoint round calls before it
  writes a snapshot — returns only when every output is delivered or
  dead-lettered; it logs why it waits, and when the worker is stopping it gives
  up after a grace period by raising ``DeliveryError``: the snapshot is then
  not written, and the partition's next owner replays from the previous one.
"""
from __future__ import annotations

import logging
import time
from functools import partial
from typing import Callable, Iterable

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from grudge_stream.exceptions import DeliveryError
from grudge_stream.kafkaconf import producer_config
from grudge_stream.operators.deadletters import DEFAULT_DEAD_LETTER_LIMIT, dead_letter_record
from grudge_stream.operators.records import OutputRecord

log = logging.getLogger("grudge_stream.outputs")

# Bytes a record batch of one record needs beyond its key and value (batch header 61,
# record framing ~20, headers, compression not counted on): the broker checks a batch.
RECORD_OVERHEAD = 512
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


def topic_message_limits(admin_config: dict, topics: Iterable[str], timeout_s: float = 15.0) -> dict[str, int]:
    """``max.message.bytes`` of each topic as the broker reports it (Kafka's default where
    the topic is missing or its config cannot be read)."""
    names = sorted(set(topics))
    limits = {t: KAFKA_DEFAULT_MAX_MESSAGE_BYTES for t in names}
    if not names:
        return limits
    admin = AdminClient({**admin_config, "log_level": 3})
    try:
        futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in names],
                                         request_timeout=timeout_s)
        for res, fut in futures.items():
            try:
                entry = fut.result(timeout=timeout_s).get("max.message.bytes")
                if entry is not None and entry.value:
                    limits[res.name] = int(entry.value)
            except (KafkaException, ValueError) as exc:
                log.warning("cannot read max.message.bytes of %s (%s); assuming Kafka's default %d",
                            res.name, exc, KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
    except KafkaException as exc:
        log.warning("cannot read topic configs (%s); assuming max.message.bytes %d", exc,
                    KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
    return limits


class _RateLimitedLog:
    """One log line per kind per interval, with the count of the suppressed ones."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval = interval_s
        self.last: dict[str, tuple[float, int]] = {}

    def __call__(self, level: int, kind: str, msg: str, *args) -> None:
        now = time.monotonic()
        t, n = self.last.get(kind, (0.0, 0))
        if now - t >= self.interval:
            log.log(level, msg + (f" (and {n} more like it)" if n else ""), *args)
            self.last[kind] = (now, 0)
        else:
            self.last[kind] = (t, n + 1)


class OutputPublisher:
    """Maps output roles to topics and produces records; ``flush()`` makes them durable.

    ``operator_id`` names the dead letters it makes for undeliverable outputs;
    ``metrics`` (a ``grudge_stream.metrics.Metrics``) counts them.
    """

    def __init__(self, bootstrap_servers: str, topics: dict[str, str], *, config: dict | None = None,
                 producer: Producer | None = None, operator_id: str = "", metrics=None,
                 client_config: dict | None = None) -> None:
        self.topics = dict(topics)
        self.operator_id = operator_id
        self.metrics = metrics
        self.dead_letter_topic = self.topics.get("dead_letters")
        admin_conf = {"bootstrap.servers": bootstrap_servers, **(client_config or {})}
        self.limits = topic_message_limits(admin_conf, self.topics.values())
        self._room = {t: max(0, n - RECORD_OVERHEAD) for t, n in self.limits.items()}
        self._failed: list[tuple] = []
        self._log = _RateLimitedLog()
        # A caller's producer (e.g. a transactional one shared with the checkpoint store) or our own.
        self.producer = producer if producer is not None else Producer(producer_config(
            client_config or {}, bootstrap_servers=bootstrap_servers,
            max_message_bytes=max([KAFKA_DEFAULT_MAX_MESSAGE_BYTES, *self.limits.values()]) + 4096,
            # Never fail an output for taking long: an outage only delays it (in order).
            extra={"message.timeout.ms": 0, **(config or {})}))
        self.sent: dict[str, int] = {}
        self._counted: dict[str, int] = {}
        self.dead_lettered: dict[str, int] = {}
        # Why a publish() failed half way, if one did: its outputs are lost, so no flush
        # may succeed (and no snapshot be written) after it.
        self.broken: str | None = None
        # Records handed to the client (a sequence number each), and those without a delivery
        # report yet: ``delivered_through(mark)`` says whether every record produced before
        # ``mark`` is durable, without waiting (reports of different partitions come in any
        # order).
        self.produced = 0
        self._inflight: set[int] = set()
        # Records before this sequence number belong to an aborted transaction: their reports
        # (a purge, a fenced producer's error) are ignored, never re-sent (``drop_unfinished``).
        self._void_below = 0

    def dead_letter_limit(self) -> int:
        """Bytes a dead letter (key + value) may take on the dead-letter topic."""
        if self.dead_letter_topic is None:
            return DEFAULT_DEAD_LETTER_LIMIT
        return min(DEFAULT_DEAD_LETTER_LIMIT, self._room[self.dead_letter_topic])

    def mark(self) -> int:
        """A position in the output stream: ``delivered_through(mark)`` later says whether
        everything produced before it is delivered."""
        return self.produced

    def delivered_through(self, mark: int) -> bool:
        """Whether every output produced before ``mark`` is delivered, without waiting.

        Failed deliveries are re-sent or dead-lettered only by ``flush`` (so while one is
        pending this says no, and after ``flush`` returns every re-sent record is delivered).
        """
        if self.broken is not None:
            return False
        self.producer.poll(0)
        return not self._failed and not any(seq < mark for seq in self._inflight)

    def drop_unfinished(self, producer: Producer | None = None) -> None:
        """Exactly-once, after an aborted transaction: the records produced so far are gone
        with it, so neither their pending reports nor their refusals count any more (a
        purged record re-sent would land in the next transaction, on top of the replay that
        produces it again). ``producer`` replaces a fenced one."""
        self._void_below = self.produced
        self._inflight.clear()
        self._failed.clear()
        if producer is not None:
            self.producer = producer

    def has_failures(self) -> bool:
        """Whether refused outputs wait for ``flush`` to re-send or dead-letter them."""
        return bool(self._failed)

    def _on_delivery(self, err, msg, seq: int = -1) -> None:
        if 0 <= seq < self._void_below:
            return
        self._inflight.discard(seq)
        if err is not None:
            ts_type, ts = msg.timestamp()
            self._failed.append((err, msg.topic(), msg.key(), msg.value(), msg.headers(),
                                 ts if ts_type == 1 else None))  # 1: a timestamp the record was given

    def _undeliverable(self, role: str, topic: str, key: bytes | None, value: bytes | None,
                       reason: str) -> OutputRecord:
        self.dead_lettered[role] = self.dead_lettered.get(role, 0) + 1
        if self.metrics is not None:
            self.metrics.outputs_dead_lettered.labels(self.operator_id, role).inc()
        self._log(logging.ERROR, "undeliverable:" + topic, "output to %s dead-lettered: %s", topic, reason)
        return dead_letter_record(self.operator_id, reason, None, key, value, self.dead_letter_limit(),
                                  extra={"output": {"role": role, "topic": topic}})

    def _produce(self, topic: str, key: bytes | None, value: bytes | None, headers=None,
                 timestamp_ms: int | None = None) -> None:
        """Produce, or note the client's refusal as a failure that ``flush`` handles."""
        extra = {}
        if headers:
            extra["headers"] = headers
        if timestamp_ms is not None:
            extra["timestamp"] = timestamp_ms
        while True:
            try:
                seq = self.produced
                self._inflight.add(seq)
                self.producer.produce(topic, value=value, key=key, on_delivery=partial(self._on_delivery, seq=seq),
                                      **extra)
                self.produced = seq + 1
                return
            except BufferError:
                self._inflight.discard(seq)
                self.producer.poll(0.05)
            except KafkaException as exc:  # refused by the client itself (unknown topic, size, ...)
                self._inflight.discard(seq)
                self._failed.append((exc.args[0], topic, key, value, headers, timestamp_ms))
                return

    def _send(self, role: str, topic: str, key: bytes | None, value: bytes | None, headers=None,
              timestamp_ms: int | None = None) -> None:
        size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        if headers:
            size += sum(len(k) + len(v or b"") for k, v in headers)
        room = self._room.get(topic)
        if room is not None and size > room:
            if topic == self.dead_letter_topic:
                raise AssertionError("dead letters are cut to fit their topic")  # pragma: no cover
            dl = self._undeliverable(role, topic, key, value,
                                     f"output of {size} bytes exceeds {topic}'s max.message.bytes "
                                     f"({self.limits[topic]})")
            topic, key, value, headers, timestamp_ms = self.dead_letter_topic, dl.key, dl.value, None, None
        self._produce(topic, key, value, headers, timestamp_ms)

    def publish(self, records: Iterable[OutputRecord]) -> int:
        n = 0
        topics = self.topics
        try:
            for rec in records:
                topic = topics.get(rec.role)
                if topic is None:
                    continue  # the topology does not publish this role
                self._send(rec.role, topic, rec.key, rec.value, rec.headers, rec.timestamp_ms)
                self.sent[rec.role] = self.sent.get(rec.role, 0) + 1
                n += 1
        except BaseException as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            raise
        self.producer.poll(0)
        if self.metrics is not None and n:
            self._count_outputs()
        return n

    def _count_outputs(self) -> None:
        counted = self._counted
        for role, total in self.sent.items():
            d = total - counted.get(role, 0)
            if d:
                self.metrics.outputs.labels(self.operator_id, role).inc(d)
                counted[role] = total

    def _role_of(self, topic: str) -> str:
        for role, t in self.topics.items():
            if t == topic:
                return role
        return "unknown"

    def _handle_failures(self) -> int:
        """Re-send or dead-letter what the broker refused; returns how many were handled."""
        failed, self._failed = self._failed, []
        for err, topic, key, value, headers, ts in failed:
            if topic == self.dead_letter_topic:
                # The dead letter itself was refused: try again (the snapshot waits meanwhile).
                self._log(logging.ERROR, "dlq:" + topic, "dead letter to %s not delivered (%s); retrying", topic, err)
                self._produce(topic, key, value)
            elif err.retriable() or self.dead_letter_topic is None:
                self._produce(topic, key, value, headers, ts)
            else:
                dl = self._undeliverable(self._role_of(topic), topic, key, value,
                                         f"output to {topic} failed: {err.str()}")
                self._produce(self.dead_letter_topic, dl.key, dl.value)
        return len(failed)

    def flush(self, timeout_s: float | None = None, should_stop: Callable[[], bool] | None = None,
              grace_s: float = 10.0) -> None:
        """Return once every output so far is delivered or dead-lettered.

        Waits as long as that takes (logging why), unless ``timeout_s`` passes or
        ``should_stop()`` turns true and ``grace_s`` more seconds pass: then
        ``DeliveryError``, and the caller must not write a snapshot.
        """
        t0 = time.monotonic()
        stop_at: float | None = None
        while True:
            if self.broken is not None:
                raise DeliveryError(f"outputs were lost when publishing failed ({self.broken})")
            remaining = self.producer.flush(1.0)
            handled = self._handle_failures() if self._failed else 0
            if self._failed and not remaining:
                time.sleep(0.5)  # refused again at once (a topic still missing): do not spin
            if remaining == 0 and handled == 0 and not self._failed:
                return
            now = time.monotonic()
            pending = remaining + handled
            if should_stop is not None and should_stop():
                stop_at = stop_at or now + grace_s
            if (timeout_s is not None and now - t0 > timeout_s) or (stop_at is not None and now > stop_at):
                raise DeliveryError(
                    f"{pending} output records undelivered after {now - t0:.0f}s; no snapshot covers them")
            self._log(logging.WARNING, "flush", "%d output records not delivered yet after %.0fs; the "
                      "snapshot waits for them (broker unreachable?)", pending, now - t0)
