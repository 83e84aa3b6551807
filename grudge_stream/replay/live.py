"""The live batch runtime: a confluent-kafka consumer-group member running a topology.

`grudge-stream worker <topology> --runtime batch`. Same operators, same
snapshot topic and the same guarantees as the Faust worker, without Faust's
per-record machinery: ``consume()`` returns thousands of records at a time and
they go to the operators in one call per partition.

- **Assignment**: every newly assigned partition is restored from its newest
  usable snapshot (``grudge_stream.partitions``) inside the assignment
  callback, before the partition is fetched, and assigned at the snapshot's
  ``next_offset`` (its earliest retained offset for a fresh or replayed one).
- **Checkpoints**: every ``checkpoint_interval_s``, on revocation and on
  shutdown: outputs flushed (every output delivered or dead-lettered),
  snapshot written, then the snapshot's offset committed for the group
  (commits never run ahead of durable state). A failed round is logged and
  retried at the next interval; the previous snapshot stays current. After an
  unexpected error no snapshot is written at all (the state may be ahead of
  its outputs): the next owner replays from the last good one.
- **Exactly-once outputs** (``exactly_once=true``): a transactional producer
  carries the outputs, the snapshot chunks and manifest, and the source
  offsets (``send_offsets_to_transaction``) of each checkpoint interval in one
  transaction; a ``read_committed`` consumer of the alert topic then sees each
  alert exactly once across crashes. Outputs become visible at commit, so the
  alert latency grows by up to one checkpoint interval. Give each worker a
  stable ``group_instance_id`` (it names the transactional id), so a
  restarted worker aborts its predecessor's open transaction at once instead
  of waiting for the transaction timeout.
- **Health**: ``/ready``, ``/live`` and ``/metrics`` on ``web_host:web_port``; ``/live``
  fails when the consume loop made no progress for ``liveness_timeout_s``
  (``grudge_stream.liveness``).
- **Live score queries**: ``/v1/score`` and ``/v1/scores`` on the same server
  (``grudge_stream.serving``): a partition held here is read under its slot's lock,
  which the loop holds while it processes a batch of that partition; others are
  forwarded once to the owner the members directory names.
- **Shutdown**: SIGTERM / SIGINT finish the current batch, write final
  snapshots, commit, and leave the group.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from grudge_stream._cyext._ingest import group_messages
from grudge_stream.checkpoint import (BROKER_ABORT_CHECK_INTERVAL_S, OPEN_TRANSACTION_MARGIN_S,
                                      CheckpointStore, watermarks)
from grudge_stream.exceptions import CheckpointError, ConfigError, DeliveryError
from grudge_stream.health import AssignmentWatch, BrokerProbe, readiness
from grudge_stream.kafkaconf import client_config
from grudge_stream.liveness import Liveness
from grudge_stream.metrics import Metrics
from grudge_stream.outputs import OutputPublisher
from grudge_stream.partitions import PartitionSlot, checkpoint_slots, restore_partition
from grudge_stream.replay.runner import FAST_CONSUMER, group_source_records
from grudge_stream.serving import MembersDirectory, ScoreQueries, advertised_url
from grudge_stream.topology import Settings, Topology

log = logging.getLogger("grudge_stream.batch")


class BatchWorker:
    def __init__(self, topology: Topology, settings: Settings) -> None:
        self.topology = topology
        self.settings = settings
        self.bootstrap = settings.bootstrap_servers
        # Security and pass-through client properties, for every client below (docs/security.md).
        self.client_config = client_config(settings)
        self.topic = topology.source_topic
        self.app_id = topology.app_id
        self.instance_id = settings.get("group_instance_id", "")
        self.exactly_once = settings.get("exactly_once", False)
        # Small batches keep the messages and columns of one batch in cache: 2,000 measured
        # ~30% faster than 10,000 (benchmarks/bench_batch.py).
        self.batch_size = settings.get("batch_size", 2000)
        # consume() returns once it has batch_size records or this wait has passed: under
        # load batches fill at once; on a quiet topic this bounds the latency it adds (with
        # a 200 ms wait alerts took p50 150 ms at 3,000 events/s, with 10 ms p50 ~40 ms).
        self.batch_max_wait_ms = settings.get("batch_max_wait_ms", 10)
        if self.batch_size < 1 or self.batch_max_wait_ms < 1:
            raise ConfigError("batch_size and batch_max_wait_ms must be at least 1")
        self.metrics = Metrics()
        self.liveness = Liveness.from_settings(settings)
        self.slots: dict[int, PartitionSlot] = {}
        self.assigned: set[int] = set()
        self.partition_count: int | None = None
        self.stopping = threading.Event()
        self.last_checkpoint = time.monotonic()
        self.in_txn = False
        # Set when the loop dies of an unexpected error, or outputs could not be delivered on
        # the way out: no snapshot is written after that (it could cover lost outputs).
        self.no_more_snapshots = False
        self._last_failure_log = 0.0
        conf = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.app_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": int(settings.get("session_timeout_s", 30.0) * 1000),
            "heartbeat.interval.ms": int(settings.get("heartbeat_interval_s", 3.0) * 1000),
            "max.poll.interval.ms": 300_000,
            **FAST_CONSUMER,
            **self.client_config,
        }
        if self.instance_id:
            conf["group.instance.id"] = self.instance_id
        self.consumer = Consumer(conf)
        self.producer: Producer | None = None
        txn_timeout_s = settings.get("transaction_timeout_s", 60.0)
        if self.exactly_once:
            if not self.instance_id:
                log.warning("exactly_once without group_instance_id: the transactional id changes with "
                            "every restart, so a crashed worker's open transaction is not aborted at once "
                            "and a takeover may wait up to transaction_timeout_s + %g s",
                            BROKER_ABORT_CHECK_INTERVAL_S)
            txn_id = f"{self.app_id}-{self.instance_id or socket.gethostname() + '-' + str(os.getpid())}"
            self.producer = Producer({
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 5,
                "compression.type": "lz4",
                "message.max.bytes": 1024 * 1024 + 4096,
                **self.client_config,
                "transactional.id": txn_id,
                "enable.idempotence": True,
                "acks": "all",
                "transaction.timeout.ms": int(txn_timeout_s * 1000),
            })
            self.producer.init_transactions(60)
        self.publisher = OutputPublisher(self.bootstrap, topology.outputs, producer=self.producer,
                                         operator_id=topology.operator_id, metrics=self.metrics,
                                         client_config=self.client_config)
        self.store = CheckpointStore(self.bootstrap, topology.snapshot_topic, client_config=self.client_config,
                                     chunk_bytes=settings.get("snapshot_chunk_bytes", 512 * 1024),
                                     chunk_delay_s=settings.get("snapshot_chunk_delay_s", 0.0),
                                     producer=self.producer,
                                     # Wait out a dead worker's open transaction on the snapshot
                                     # topic: the broker aborts it after its timeout (that of the
                                     # fleet, assumed equal to ours) plus its abort-check interval.
                                     open_transaction_wait_s=settings.get("open_transaction_wait_s")
                                     or txn_timeout_s + BROKER_ABORT_CHECK_INTERVAL_S
                                     + OPEN_TRANSACTION_MARGIN_S)
        self._http: ThreadingHTTPServer | None = None
        self.broker = BrokerProbe(self.client_config, self.topic)
        self.waiting = AssignmentWatch(settings.get("session_timeout_s", 30.0), bool(self.instance_id))
        self._lag_checked = 0.0
        # Live score queries (grudge_stream.serving): answered from a restored slot under its
        # lock, or forwarded to the owner the members directory names (started by run()).
        self.members: MembersDirectory | None = None
        self.queries = ScoreQueries.from_settings(settings, self._query_slot, lambda: self.partition_count, None)

    # -- group membership ------------------------------------------------------------------------

    def _count(self) -> int:
        if self.partition_count is None:
            md = self.consumer.list_topics(self.topic, timeout=30)
            self.partition_count = len(md.topics[self.topic].partitions)
        return self.partition_count

    def _low(self, p: int) -> int:
        return watermarks(self.consumer, TopicPartition(self.topic, p))[0]

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Every partition of the assignment counts as assigned before any is restored, so /ready
        # says 503 until the last one is.
        self.assigned.update(tp.partition for tp in partitions if tp.topic == self.topic)
        self.metrics.assigned.set(len(self.assigned))
        for tp in partitions:
            if tp.topic != self.topic:
                continue
            self.liveness.beat()  # restores run in consume(): each partition counts as progress
            outcome = restore_partition(self.topology, self.store, tp.partition, self._count(),
                                        lambda p=tp.partition: self._low(p), self.metrics)
            self.slots[tp.partition] = PartitionSlot(self.topology, tp.partition, outcome, self._count(),
                                                     self.metrics, self.publisher.dead_letter_limit())
            start = outcome.operator.next_offset
            tp.offset = start if start is not None else OFFSET_BEGINNING
            self.assigned.add(tp.partition)
        consumer.assign(partitions)
        self.metrics.assigned.set(len(self.assigned))
        self.metrics.restored.set(len(self.slots))
        self._publish_members()

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = [tp.partition for tp in partitions if tp.topic == self.topic]
        try:
            if not self.no_more_snapshots:
                self.checkpoint([p for p in revoked if p in self.slots])
        except DeliveryError as exc:
            log.error("no snapshot on revocation: %s; the next owner replays from the last snapshot", exc)
        except Exception:  # the partitions are gone either way; the next owner replays from the last snapshot
            log.exception("checkpoint on revocation failed")
        for p in revoked:
            self.slots.pop(p, None)
            self.assigned.discard(p)
            self.store.forget(self.topology.operator_id, p)
        consumer.unassign()
        self.metrics.assigned.set(len(self.assigned))
        self.metrics.restored.set(len(self.slots))
        self._publish_members()

    # -- live score queries ----------------------------------------------------------------------

    def _query_slot(self, partition: int) -> PartitionSlot | None:
        """The slot of ``partition`` if this worker holds it restored (called from HTTP threads)."""
        slot = self.slots.get(partition)
        return slot if slot is not None and partition in self.assigned else None

    def _start_members(self) -> None:
        url = advertised_url(self.settings)
        try:
            self.members = MembersDirectory(self.bootstrap, self.app_id, self.instance_id or url, url,
                                            client_config=self.client_config, runtime="batch",
                                            source_topic=self.topic).start()
        except Exception as exc:  # noqa: BLE001 - queries then answer for local partitions only
            log.error("members directory %s-members unavailable (%s): score queries answer for this "
                      "worker's partitions only", self.app_id, exc)
            return
        self.queries.directory = self.members
        self._publish_members()

    def _publish_members(self) -> None:
        if self.members is not None:
            self.members.publish([p for p in self.slots if p in self.assigned], self.partition_count)

    # -- checkpoints -----------------------------------------------------------------------------

    def _begin(self) -> None:
        if self.exactly_once and not self.in_txn:
            assert self.producer is not None
            self.producer.begin_transaction()
            self.in_txn = True

    def checkpoint(self, partitions: list[int] | None = None) -> None:
        if self.no_more_snapshots:
            return
        parts = sorted(self.slots) if partitions is None else partitions
        dirty = [p for p in parts if p in self.slots and self.slots[p].dirty]
        if self.exactly_once:
            if not self.in_txn and not dirty:
                return
            self._begin()
        checkpoint_slots([self.slots[p] for p in dirty], self.store, None if self.exactly_once else self.publisher,
                         self.liveness.beating(self.stopping.is_set))
        offsets = [TopicPartition(self.topic, p, self.slots[p].snapshotted_offset) for p in dirty
                   if self.slots[p].snapshotted_offset is not None]
        if self.exactly_once:
            assert self.producer is not None
            if offsets:
                self.producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), 60)
            self.producer.commit_transaction(60)
            self.in_txn = False
        elif offsets:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        self.last_checkpoint = time.monotonic()

    # -- main loop -------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Every assigned partition restored, and the cluster answering."""
        return readiness(self.assigned, self.slots, self.broker)[0] == 200

    def _record_lag(self) -> None:
        """Consumer lag per partition from the log ends librdkafka learned with its fetches."""
        now = time.monotonic()
        if now - self._lag_checked < 1.0:
            return
        self._lag_checked = now
        for p, slot in self.slots.items():
            try:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
            except Exception:  # noqa: BLE001 - no fetch yet for a just-assigned partition
                continue
            slot.set_log_end(high)

    def run(self) -> int:
        self._start_http()
        self._start_members()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        self.consumer.subscribe([self.topic], on_assign=self.on_assign, on_revoke=self.on_revoke)
        interval = self.topology.checkpoint_interval_s
        batch_wait = self.batch_max_wait_ms / 1000.0
        topic = self.topic
        # Forwarding operators read headers: the record path (no columns) for them only.
        with_headers = self.topology.make_operator(0).needs_headers
        clean = False
        try:
            while not self.stopping.is_set():
                self.liveness.beat()
                msgs = self.consumer.consume(self.batch_size, timeout=batch_wait)
                if msgs and with_headers:
                    self._process_records(msgs)
                elif msgs:
                    groups, errors = group_messages(msgs)
                    for m in errors:
                        if m.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("consume error: %s", m.error())
                    for p, (offs, tss, keys, vals) in groups.items():
                        slot = self.slots.get(p)
                        if slot is None:
                            continue
                        with slot.lock:  # a live query never reads a batch half applied
                            out = slot.process_columns(topic, offs, tss, keys, vals)
                        if out:
                            self._begin()
                            self.publisher.publish(out)
                if time.monotonic() - self.last_checkpoint >= interval:
                    self._periodic_checkpoint()
                self.waiting.tick(len(self.assigned))
                self._record_lag()
            log.info("stopping: final snapshots for partitions %s", sorted(self.slots))
            try:
                self.checkpoint()
            except DeliveryError as exc:
                log.error("final snapshots not written: %s; the next owner replays from the last snapshot", exc)
                self.no_more_snapshots = True
            clean = True
            return 0
        finally:
            if not clean:
                self.no_more_snapshots = True
            self.stopping.set()
            self.consumer.close()
            if self.members is not None:
                self.members.close(clean=clean)
            if self._http is not None:
                self._http.shutdown()
            self.store.close()

    def _process_records(self, msgs: list) -> None:
        """One batch as SourceRecords with headers (operators with ``needs_headers``)."""
        groups, errors = group_source_records(self.topic, msgs)
        for m in errors:
            if m.error().code() != KafkaError._PARTITION_EOF:
                log.warning("consume error: %s", m.error())
        for p, records in groups.items():
            slot = self.slots.get(p)
            if slot is None:
                continue
            with slot.lock:
                out = slot.process(records)
            if out:
                self._begin()
                self.publisher.publish(out)

    def _periodic_checkpoint(self) -> None:
        """A checkpoint round whose failure (a broker outage, say) is logged, not fatal: the
        previous snapshot stays current and the next interval tries again."""
        try:
            self.checkpoint()
        except (CheckpointError, DeliveryError) as exc:
            if self.exactly_once:
                raise
            if isinstance(exc, DeliveryError) and self.stopping.is_set():
                log.error("no snapshot: %s; the next owner replays from the last snapshot", exc)
                self.no_more_snapshots = True
                return
            self.last_checkpoint = time.monotonic()
            if time.monotonic() - self._last_failure_log > 10:
                self._last_failure_log = time.monotonic()
                log.error("checkpoint failed (%s); the previous snapshot stays current, retrying at the "
                          "next interval", exc)

    def _start_http(self) -> None:
        worker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/ready"):
                    status, ready = readiness(worker.assigned, worker.slots, worker.broker)
                    self._send(status, json.dumps(ready).encode(), "application/json")
                elif self.path.startswith("/live"):
                    status, live = worker.liveness.status()
                    self._send(status, json.dumps(live).encode(), "application/json")
                elif self.path.startswith("/metrics"):
                    self._send(200, worker.metrics.render(), "text/plain; version=0.0.4")
                elif self.path.startswith("/v1/score"):
                    self._score(b"")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def do_POST(self) -> None:  # noqa: N802
                if self.path.startswith("/v1/scores"):
                    length = int(self.headers.get("Content-Length") or 0)
                    self._score(self.rfile.read(min(length, 1 << 20)))
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _score(self, body: bytes) -> None:
                path, _, query = self.path.partition("?")
                status, doc, headers = worker.queries.handle(self.command, path, query, body, self.headers)
                self._send(status, json.dumps(doc).encode(), "application/json", headers)

            def _send(self, status: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        host = self.settings.get("web_host", "127.0.0.1")
        port = self.settings.get("web_port", 6066)
        self._http = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=self._http.serve_forever, name="grudge-http", daemon=True).start()


def run_batch_worker(topology: Topology, settings: Settings) -> int:
    from grudge_stream.repartition import start_stage

    worker = BatchWorker(topology, settings)
    # A topology keyed by a field: its repartition stage feeds the topic the worker reads.
    stage = start_stage(topology, settings, metrics=worker.metrics, liveness=worker.liveness,
                        client_config=worker.client_config)
    try:
        return worker.run()
    except CheckpointError as exc:
        log.error("%s", exc)
        return 2
    finally:
        if stage is not None:
            stage.stop()
