"""Keying by a field: a worker-managed repartition topic (Kafka Streams' selectKey + through).

A stateful operator keyed by a JSON field (``key_field`` of dedup, known_keys,
heavy_hitters) must see every record of one field value in one partition: on a
source keyed by something else the same id lands in several partitions, and
each partition's sketch counts it (dedup forwarded 165 records for 100 ids).
The worker therefore runs a stateless **repartition stage** next to the
operators (``repartition=auto|on|off``; ``auto``: on whenever ``key_field`` is
set):

- it consumes the source topic in its own consumer group ``<app_id>-repartition``
  (its own confluent-kafka consumer and producer, in a background thread of the
  worker process, whatever the runtime);
- extracts the field exactly as the operator's codec would (a string, or an
  integer written in decimal; ``max_key_bytes`` and ``allow_empty_keys`` apply);
  a record without a usable field becomes a dead letter on the topology's
  dead-letter topic (operator ``<operator_id>-repartition``, ``"stage":
  "repartition"``, counted) and never stops it;
- produces every other record to ``<app_id>-repartition`` (created by the worker
  with the source's partition count) keyed by the field value, with the
  source's value, headers and timestamp;
- reads the source through the native ingest path where the ``ingest`` setting allows it
  (docs/runtime.md, "Ingest paths"): the records with their headers and timestamp types,
  no confluent-kafka ``Message`` per record; each assigned partition split into its reader
  before the assignment and released after the revocation, as the batch worker does;
- commits its source offsets only once the produced records are delivered
  (at-least-once: after a crash a record can be produced twice, a duplicate the
  dedup Bloom drops), or, with ``exactly_once=true``, in the transaction that
  carries the produced records (consume-transform-produce).

The operators then consume the repartition topic, whose key IS the field, so
their codec reads the record key (``Topology.source_topic`` is the repartition
topic; ``grudge-stream replay`` reads it too). Because the swap moves every key
to another partition, ``key_field`` and ``repartition`` shape the state.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from grudge_stream.exceptions import ConfigError
from grudge_stream.kafkaconf import FAST_CONSUMER, producer_config
from grudge_stream.liveness import Liveness
from grudge_stream.operators.deadletters import DEFAULT_DEAD_LETTER_LIMIT, dead_letter_record
from grudge_stream.operators.codec import BadRecord, EventCodec
from grudge_stream.record_checks import MAX_TIMESTAMP_MS
from grudge_stream.kafka.transactions import Transaction, TransactionStuck
from grudge_stream.sections import Sections, sections
# The plan is part of the topology's spec; named here too, where the stage that runs it lives.
from grudge_stream.topology import REPARTITION_MODES as MODES  # noqa: F401
from grudge_stream.topology import REPARTITION_SETTING as SETTING  # noqa: F401
from grudge_stream.topology import RepartitionPlan  # noqa: F401
from grudge_stream.topology import repartition_plan as plan  # noqa: F401
from grudge_stream.topics import ensure_repartition_topic  # noqa: F401  (its home is topics)

log = logging.getLogger("grudge_stream.repartition")

# Delivery errors that no retry cures: the record itself is refused. They are dead-lettered;
# every other failure (an outage, a timeout) re-sends the batch.
_RECORD_ERRORS = ("MSG_SIZE_TOO_LARGE", "INVALID_RECORD", "INVALID_TIMESTAMP", "CORRUPT_MESSAGE",
                  "RECORD_LIST_TOO_LARGE")
_BACKOFF_MAX_S = 30.0


_json_decode = json.JSONDecoder().decode


def extract_key(codec: EventCodec, key: bytes | None, value: bytes | None, timestamp_ms: int) -> bytes:
    """The field value as the new record key, or ``BadRecord`` (the dead-letter reason).

    The common case (a JSON object with a non-empty string field within ``max_key_bytes``,
    a timestamp in range) skips the codec's general path: decoding the text first spares
    ``json.loads`` its encoding detection, about a third of the stage's CPU. Anything else
    goes through ``codec.decode``, which gives the very reason the operator would."""
    if value is not None and 0 <= timestamp_ms <= MAX_TIMESTAMP_MS:
        try:
            obj = _json_decode(value.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError included: the codec says which
            obj = None
        if type(obj) is dict:
            kv = obj.get(codec.key_field)
            if type(kv) is str:
                k = kv.encode("utf-8")
                if k and (not codec.max_key_bytes or len(k) <= codec.max_key_bytes):
                    return k
    return codec.decode(key, value, timestamp_ms).key


class Repartitioner:
    """The repartition stage: source -> ``<app_id>-repartition`` keyed by the field.

    ``handle`` handles one consumed batch (``run_once`` consumes one and handles it; tests
    drive the stage with it); ``start`` runs the consume loop in a daemon thread until
    ``stop``. Counters: ``records`` (consumed), ``forwarded``,
    ``dead_letters``, ``retries`` (batches re-sent after a failed delivery or transaction),
    ``errors`` (unexpected failures; the stage rebuilds its clients and goes on)."""

    def __init__(self, plan_: RepartitionPlan, settings: Any, *, metrics: Any = None,
                 liveness: Liveness | None = None, client_config: dict | None = None) -> None:
        cfg = settings if isinstance(settings, Sections) else sections(settings)  # or a Settings
        self.plan = plan_
        self.bootstrap = cfg.kafka.bootstrap_servers
        self.client_config = dict(client_config or {})
        self.exactly_once = bool(cfg.checkpointing.exactly_once)
        self.instance_id = cfg.group.group_instance_id
        self.batch_size = cfg.group.batch_size
        self.session_timeout_ms = int(cfg.group.session_timeout_s * 1000)
        self.heartbeat_ms = int(cfg.group.heartbeat_interval_s * 1000)
        self.txn_timeout_ms = int(cfg.checkpointing.transaction_timeout_s * 1000)
        self.ingest = cfg.group.ingest
        self.native: Any = None  # its NativeReader (grudge_stream.runtime.native), None on today's path
        self.cooperative = False
        self._ingest_said = False
        self.codec = plan_.codec()
        self.stage_id = f"{plan_.operator_id}-repartition"
        self.liveness = Liveness(liveness.timeout_s if liveness is not None else 60.0)
        if liveness is not None:
            liveness.watch("repartition", self.liveness)
        self.counters = {"records": 0, "forwarded": 0, "dead_letters": 0, "retries": 0, "errors": 0}
        self._metrics = _StageMetrics(metrics, plan_.operator_id) if metrics is not None else None
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.consumer: Any = None
        self.producer: Any = None
        self._failed: list = []
        self._lag_checked = 0.0
        self._backoff = 0.5  # before the clients are rebuilt after a failure; doubles up to 30 s

    # -- clients ---------------------------------------------------------------------------------

    def _open(self) -> None:
        from confluent_kafka import Consumer, Producer

        conf = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.plan.group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": self.session_timeout_ms,
            "heartbeat.interval.ms": self.heartbeat_ms,
            **FAST_CONSUMER,
            **self.client_config,
        }
        if self.instance_id:
            conf["group.instance.id"] = f"{self.instance_id}-repartition"
        # The Java client's partitioner (the same key lands where a Kafka Streams application,
        # or any Java producer, would put it), before the client properties: a pass-through
        # ``kafka.partitioner`` overrides it, as it overrides every other choice made here.
        pconf = producer_config({"partitioner": "murmur2_random", **self.client_config},
                                bootstrap_servers=self.bootstrap, extra={
            # Delivery callbacks only for failures: a Python call per record less; success is
            # the queue draining (flush) without one.
            "delivery.report.only.error": True,
        })
        if self.exactly_once:
            who = self.instance_id or f"{socket.gethostname()}-{os.getpid()}"
            pconf["transactional.id"] = f"{self.plan.app_id}-repartition-{who}"
            pconf["transaction.timeout.ms"] = self.txn_timeout_ms
        self.producer = Producer(pconf)
        if self.exactly_once:
            self.producer.init_transactions(60)
        from grudge_stream.runtime.native import cooperative, open_reader

        self.cooperative = cooperative(conf)
        self.consumer = Consumer(conf)
        self.native = open_reader(self.ingest, self.consumer, self.plan.source_topic, self.batch_size,
                                  quiet=self._ingest_said, what="repartition stage ingest")
        self._ingest_said = True  # said once per stage, not per rebuilt consumer
        if self._metrics is not None:
            self._metrics.ingest(self.native is not None)
        self.consumer.subscribe([self.plan.source_topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    # The batch worker's rebalance steps (grudge_stream.runtime.native.assign/unassign): each
    # partition split into the native reader before it is assigned, released after it is
    # revoked (or lost: confluent-kafka calls on_revoke then).

    def _on_assign(self, consumer: Any, partitions: list) -> None:
        from grudge_stream.runtime.native import assign

        if consumer is self.consumer:
            assign(consumer, self.native, partitions, self.cooperative)

    def _on_revoke(self, consumer: Any, partitions: list) -> None:
        from grudge_stream.runtime.native import unassign

        if consumer is self.consumer:
            unassign(consumer, self.native, partitions, self.cooperative)

    def _close(self) -> None:
        consumer, producer, self.consumer, self.producer = self.consumer, self.producer, None, None
        native, self.native = self.native, None
        if native is not None:
            native.close()  # its handles go before the consumer they belong to
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - closing a broken client
                log.debug("closing the repartition consumer failed", exc_info=True)
        if producer is not None:
            producer.flush(5)

    # -- the loop --------------------------------------------------------------------------------

    def start(self) -> "Repartitioner":
        self._thread = threading.Thread(target=self.run, name="grudge-repartition", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the batch in hand (delivered and committed), then leave the group."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self, wait_s: float = 0.1):
        """The consume loop over the current consumer (grudge_stream.runtime.loop)."""
        from grudge_stream.runtime.loop import ConsumeLoop

        def on_error(err) -> None:
            log.warning("repartition consume error: %s", err)

        return ConsumeLoop(self.consumer, self.plan.source_topic, batch_size=self.batch_size, wait_s=wait_s,
                           shape=self._shape(), on_error=on_error, beat=self.liveness.beat, native=self.native)

    def _shape(self) -> str:
        """Messages on today's path; the native path's headed columns (the same fields)."""
        from grudge_stream.runtime.loop import HEADED, MESSAGES

        return HEADED if self.native is not None else MESSAGES

    def run(self) -> None:
        log.info("repartition stage: %s -> %s keyed by %r (group %s, %s)", self.plan.source_topic,
                 self.plan.topic, self.plan.key_field, self.plan.group,
                 "exactly once" if self.exactly_once else "at least once")
        while not self.stopping.is_set():  # a supervisor: each failure rebuilds the clients
            try:
                if self.consumer is None:
                    self._open()
                self._loop().run(self._step, until=self.stopping.is_set)
            except Exception as exc:  # noqa: BLE001 - the stage must outlive any one failure
                self._count("errors", type(exc).__name__)
                log.exception("repartition stage failed; reopening its clients in %.1fs", self._backoff)
                self._abandon(stuck=isinstance(exc, TransactionStuck))
                self.stopping.wait(self._backoff)
                self._backoff = min(_BACKOFF_MAX_S, self._backoff * 2)
        self._close()

    def _step(self, batch) -> None:
        if self.handle(batch):
            self._backoff = 0.5
        self._record_lag()

    def _record_lag(self) -> None:
        """Source records not re-keyed yet, per assigned partition (log end - position), from
        the log ends the consumer learned with its fetches; at most once a second."""
        now = time.monotonic()
        if self._metrics is None or now - self._lag_checked < 1.0:
            return
        self._lag_checked = now
        try:
            for tp in self.consumer.position(self.consumer.assignment()):
                _, high = self.consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    self._metrics.lag(tp.partition, max(0, high - tp.offset))
        except Exception:  # noqa: BLE001 - no fetch yet, or a rebalance under way
            pass

    def _abandon(self, stuck: bool = False) -> None:
        """Drop the clients without committing: the next ones resume at the committed offsets.
        A producer whose transactional call blocked (``stuck``) is left as it is: asking it
        to abort would block again."""
        if stuck:
            self.producer = None
        elif self.exactly_once and self.producer is not None:
            try:
                self.producer.abort_transaction(10)
            except Exception:  # noqa: BLE001 - none open, or the producer is fenced
                pass
        self._close()

    def run_once(self, timeout_s: float = 0.1) -> int:
        """Consume one batch and handle it (tests drive the stage with it)."""
        return self.handle(self._loop(timeout_s).read())

    def handle(self, batch) -> int:
        """Re-key and produce one consumed batch, wait for its delivery, commit its offsets
        (in the transaction with exactly-once). Returns the number of records handled (0:
        nothing came, or the batch is re-sent next time)."""
        from confluent_kafka import KafkaException

        if not batch.count:
            return 0
        shape = self._shape()
        firsts, nexts = {}, {}
        for p in batch.groups:
            offs = batch.offsets(p, shape)
            firsts[p], nexts[p] = offs[0], offs[-1] + 1
        txn = Transaction(self.producer, self.consumer.consumer_group_metadata) if self.exactly_once else None
        if txn is not None:
            txn.begin()
        forwarded, dead = self._produce(_rows(batch.groups, shape))
        if not self._delivered():
            return self._retry(firsts, "delivery failed")
        topic = self.plan.source_topic
        if txn is not None:
            try:
                txn.commit(topic, nexts)  # offsets and records together, bounded (runtime.core)
            except KafkaException as exc:
                if exc.args[0].fatal():
                    raise
                return self._retry(firsts, f"transaction failed: {exc}")
        else:
            from confluent_kafka import TopicPartition

            try:
                self.consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in nexts.items()],
                                     asynchronous=False)
            except Exception as exc:  # noqa: BLE001 - a rebalance took the partitions
                # Delivered but not committed: the next owner re-sends them (duplicates the
                # operators' state absorbs), nothing is lost.
                self._count("errors", "commit")
                log.warning("repartition commit failed (%s); the next owner re-sends those records", exc)
        self.counters["records"] += batch.count
        self.counters["forwarded"] += forwarded
        self.counters["dead_letters"] += dead
        if self._metrics is not None:
            self._metrics.records(forwarded, dead)
        return batch.count

    def _produce(self, rows: Any) -> tuple[int, int]:
        """Produce each ``(partition, offset, timestamp type, timestamp, key, value, headers)``
        re-keyed, or its dead letter."""
        produce = self.producer.produce
        poll = self.producer.poll
        codec, topic, dlq = self.codec, self.plan.topic, self.plan.dead_letter_topic
        forwarded = dead = 0
        self._failed = []
        on_delivery = self._on_delivery
        for p, offset, ts_type, ts, key, value, headers in rows:
            try:
                new_key = extract_key(codec, key, value, ts)
            except BadRecord as exc:
                dl = self._dead_letter(p, offset, ts, key, value, str(exc))
                out = (dlq, dl.key, dl.value, None, None)
                dead += 1
            else:
                out = (topic, new_key, value, headers, ts if ts_type != 0 else None)
                forwarded += 1
            kw = {"headers": out[3]} if out[3] else {}
            if out[4] is not None:
                kw["timestamp"] = out[4]
            while True:
                try:
                    produce(out[0], key=out[1], value=out[2], on_delivery=on_delivery, **kw)
                    break
                except BufferError:
                    poll(0.05)
                    self.liveness.beat()
        return forwarded, dead

    def _dead_letter(self, partition: int, offset: int, ts: int, key: bytes | None, value: bytes | None,
                     reason: str):
        # Named "<operator_id>-repartition": its output ids (source partition and offset) then
        # never collide with the operators' dead letters (repartition topic coordinates).
        return dead_letter_record(self.stage_id, reason,
                                  {"topic": self.plan.source_topic, "partition": partition, "offset": offset,
                                   "timestamp_ms": ts},
                                  key, value, DEFAULT_DEAD_LETTER_LIMIT, extra={"stage": "repartition"})

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self._failed.append((err, msg))

    def _delivered(self) -> bool:
        """Wait until every produced record is acknowledged; dead-letter the ones the broker
        refuses for good. False when some could not be delivered (the batch is re-sent)."""
        while True:
            while len(self.producer) > 0 and not self.stopping.is_set():
                self.producer.flush(1.0)
                self.liveness.beat()
            if len(self.producer) > 0:
                self.producer.flush(30)
                if len(self.producer) > 0:
                    return False
            failed, self._failed = self._failed, []
            if not failed:
                return True
            for err, msg in failed:
                if err.name() not in _RECORD_ERRORS or msg.topic() == self.plan.dead_letter_topic:
                    log.warning("repartition delivery failed: %s", err)
                    return False
                dl = dead_letter_record(self.stage_id, f"repartition topic refused it: {err.str()}",
                                        None, msg.key(), msg.value(), DEFAULT_DEAD_LETTER_LIMIT,
                                        extra={"stage": "repartition"})
                self.producer.produce(self.plan.dead_letter_topic, key=dl.key, value=dl.value,
                                      on_delivery=self._on_delivery)
                self.counters["dead_letters"] += 1

    def _retry(self, firsts: dict[int, int], why: str) -> int:
        """Undo a batch: abort its transaction (exactly once) and seek back to its first offsets."""
        from confluent_kafka import TopicPartition

        self.counters["retries"] += 1
        self._count("errors", "retry")
        log.warning("repartition batch re-sent: %s", why)
        if self.exactly_once:
            self.producer.abort_transaction(30)  # a fatal state raises: run() reopens the clients
        for p, o in firsts.items():
            try:
                self.consumer.seek(TopicPartition(self.plan.source_topic, p, o))
            except Exception:  # noqa: BLE001 - revoked meanwhile: its new owner resumes it
                pass
        self.stopping.wait(0.5)
        return 0

    def _count(self, name: str, kind: str) -> None:
        if name == "errors":
            self.counters["errors"] += 1
        if self._metrics is not None:
            self._metrics.error(kind)


def _rows(groups: dict, shape: str):
    """A batch's records, partition by partition in offset order, as ``(partition, offset,
    timestamp type, timestamp, key, value, headers)``: from confluent-kafka messages (today's
    path) or from the native path's headed columns."""
    from grudge_stream.runtime.loop import MESSAGES

    if shape == MESSAGES:
        for msgs in groups.values():
            for m in msgs:
                ts_type, ts = m.timestamp()
                yield m.partition(), m.offset(), ts_type, ts, m.key(), m.value(), m.headers()
    else:
        for p, (offs, tss, keys, vals, hdrs, types) in groups.items():
            for o, tt, ts, k, v, h in zip(offs, types, tss, keys, vals, hdrs):
                yield p, o, tt, ts, k, v, h


class _StageMetrics:
    """The stage's series on the worker's registry (``grudge_repartition_*``)."""

    def __init__(self, metrics: Any, operator_id: str) -> None:
        from prometheus_client import Counter, Gauge

        r = metrics.registry
        self.op = operator_id
        self._records = Counter("grudge_repartition_records_total",
                                "Source records the repartition stage handled, by outcome "
                                "(forwarded to the repartition topic, or dead_letter)",
                                ["operator", "outcome"], registry=r)
        self._errors = Counter("grudge_repartition_errors_total",
                               "Repartition stage failures (retry: a batch re-sent; commit; other: the "
                               "exception type, after which the stage reopens its clients)",
                               ["operator", "kind"], registry=r)
        self._lag = Gauge("grudge_repartition_lag_records",
                          "Source records the repartition stage has not re-keyed yet (log end - position)",
                          ["operator", "partition"], registry=r)
        self._native = Gauge("grudge_repartition_ingest_native",
                             "1 when the repartition stage reads its source on the native ingest path "
                             "(setting ingest), 0 on confluent-kafka messages", ["operator"], registry=r)
        self._fwd = self._records.labels(operator_id, "forwarded")
        self._dead = self._records.labels(operator_id, "dead_letter")

    def ingest(self, native: bool) -> None:
        self._native.labels(self.op).set(1 if native else 0)

    def lag(self, partition: int, records: int) -> None:
        self._lag.labels(self.op, str(partition)).set(records)

    def records(self, forwarded: int, dead: int) -> None:
        if forwarded:
            self._fwd.inc(forwarded)
        if dead:
            self._dead.inc(dead)

    def error(self, kind: str) -> None:
        self._errors.labels(self.op, kind).inc()


def start_stage(topology: Any, settings: Any, *, metrics: Any = None, liveness: Liveness | None = None,
                client_config: dict | None = None) -> Repartitioner | None:
    """Start the topology's repartition stage, if it has one (both runtimes' entry points).

    Checks its topics first, in the caller's thread: a missing or mis-sized one is a
    ``ConfigError`` (one line, exit 2), not a background thread retrying for ever."""
    plan_ = topology.repartition
    if plan_ is None:
        return None
    cfg = settings if isinstance(settings, Sections) else sections(settings)  # or a Settings
    ensure_repartition_topic(plan_, cfg.kafka.bootstrap_servers, client_config=client_config, create=False)
    if cfg.group.ingest == "native":  # refused here, once, not by the stage's thread at each rebuild
        from grudge_stream.runtime.native import unavailable

        why = unavailable()
        if why is not None:
            raise ConfigError(f"ingest=native: the repartition stage's native ingest path cannot run: {why}")
    stage = Repartitioner(plan_, cfg, metrics=metrics, liveness=liveness, client_config=client_config)
    return stage.start()
