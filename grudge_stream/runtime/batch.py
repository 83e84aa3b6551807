"""The live batch runtime: a confluent-kafka consumer-group member running a topology.

`grudge-stream worker <topology> --runtime batch`. Same operators, same
snapshot topic and the same guarantees as the Faust worker, without Faust's
per-record machinery: ``consume()`` returns thousands of records at a time and
they go to the operators in one call per partition.

- **Assignment**: every newly assigned partition is restored from its newest
  usable snapshot (``WorkerCore.restore``, rules in ``grudge_stream.partitions``)
  inside the assignment callback, before the partition is fetched, and assigned
  at the snapshot's ``next_offset`` (its earliest retained offset for a fresh or
  replayed one).
- **Commits apart from snapshots** (docs/runtime.md, "Commits and snapshots"):
  offsets are committed every ``commit_interval_s`` once the outputs before them
  are delivered; a partition is snapshotted when a restore would replay more than
  ``snapshot_replay_budget_s`` of work, or after ``snapshot_max_age_s``, and on
  revocation and shutdown. Due partitions are copied at a batch boundary and
  written by a ``SnapshotWriter`` thread; its manifests wait until every output
  before the copy is delivered. A restore replays from the snapshot up to the
  committed offset with its outputs dropped. A failed round is logged and
  retried; after an unexpected error no snapshot and no commit is written (the
  state may be ahead of its outputs).
- **Exactly-once outputs** (``exactly_once=true``): a transactional producer
  carries the outputs and the source offsets (``send_offsets_to_transaction``)
  of each ``commit_interval_s`` in one transaction. Periodic snapshots are
  written in the background by a plain producer, and a manifest only once a
  transaction holding every output before its copy has committed (a snapshot
  never covers an output that may still abort); the snapshots of revocation and
  shutdown go into the transaction. A ``read_committed`` consumer of the alert topic then sees each
  alert exactly once across crashes. Give each worker a stable
  ``group_instance_id`` (it names the transactional id), so a restarted worker
  aborts its predecessor's open transaction at once instead of waiting for the
  transaction timeout.
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

import logging
import signal
import sys
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from grudge_stream.exceptions import EXIT_FAULT, CheckpointError, ConfigError, DeliveryError, WorkerFault, exit_code
from grudge_stream.serving import QueryGate
from grudge_stream.serving.http import WorkerHTTP
from grudge_stream.serving.server import WebServer
from grudge_stream.kafkaconf import FAST_CONSUMER
from grudge_stream.runtime.batch_commits import BatchCommits
from grudge_stream.runtime.batch_renewal import (  # noqa: F401 - the renewal limits importable from here too
    CONSUMER_CLOSE_LIMIT_S, CONSUMER_RENEWALS_MAX, CONSUMER_RENEWALS_WINDOW_S, ClientRenewal, ConsumerFatal, _fatal,
)
from grudge_stream.runtime.core import Transaction, TransactionStuck, WorkerCore
from grudge_stream.runtime.loop import COLUMNS, RECORDS, Batch, ConsumeLoop
from grudge_stream.runtime.native import assign, cooperative, open_reader, unassign
from grudge_stream.sections import Checkpointing, Group
from grudge_stream.topology import Settings, Topology
from grudge_stream.webauth import server_tls

log = logging.getLogger("grudge_stream.batch")


# How often the interpreter hands its lock to a waiting thread while the web port is open
# (Python's default: every 5 ms); see BatchWorker._start_http.
QUERY_SWITCH_INTERVAL_S = 0.0005


class BatchWorker(BatchCommits, ClientRenewal):
    """The batch runtime's worker: it holds the worker's ``WorkerCore`` (``core``) and runs
    the consume loop, group membership and the HTTP server here; commits, transactions and
    checkpoints in ``BatchCommits`` (``grudge_stream.runtime.batch_commits``), clients that
    failed for good replaced by ``ClientRenewal`` (``grudge_stream.runtime.batch_renewal``)."""

    def __init__(self, topology: Topology, settings: Settings) -> None:
        group = Group.of(settings)  # the core reads every section again, once, below
        self.exactly_once = Checkpointing.of(settings).exactly_once
        # On the python path small batches keep the messages and columns of one batch in cache: 2,000 measured
        # ~30% faster than 10,000 (benchmarks/bench_batch.py).
        self.batch_size = group.batch_size
        # consume() returns once it has batch_size records or this wait has passed: under
        # load batches fill at once; on a quiet topic this bounds the latency it adds (with
        # a 200 ms wait alerts took p50 150 ms at 3,000 events/s, with 10 ms p50 ~40 ms).
        self.batch_max_wait_ms = group.batch_max_wait_ms
        # Reading a backlog on the native path, per-batch costs weigh on batches of batch_size
        # (docs/benchmarks.md, "Batches while reading a backlog"): after a full batch the next
        # one may take this many times as many of the records already fetched, without waiting.
        self.batch_backlog_factor = group.batch_backlog_factor
        # How records are read (grudge_stream.runtime.native): the reader, None on today's path.
        self.ingest = group.ingest
        self.native = None
        if self.batch_size < 1 or self.batch_max_wait_ms < 1:
            raise ConfigError("batch_size and batch_max_wait_ms must be at least 1")
        self.stopping = threading.Event()
        self.settings = settings
        self.topic = topology.source_topic
        self.core = WorkerCore(topology, settings, runtime="batch", log=log, is_stopping=self.is_stopping,
                               commit_offsets=self.commit_offsets, yield_to_queries=self.yield_to_queries,
                               exactly_once=self.exactly_once)
        # Commits apart from snapshots (docs/checkpoints.md, "Commits and snapshots"): offsets
        # are committed every commit_interval_s once the outputs before them are delivered (or
        # in the exactly-once transaction); a partition is snapshotted only when its replay
        # budget or its snapshot_max_age_s is spent.
        self.committed: dict[int, int] = {}
        self._pending_commit: tuple[int, dict[int, int]] | None = None
        conf = {
            "bootstrap.servers": self.core.bootstrap,
            "group.id": self.core.app_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": int(group.session_timeout_s * 1000),
            "heartbeat.interval.ms": int(group.heartbeat_interval_s * 1000),
            "max.poll.interval.ms": 300_000,
            **FAST_CONSUMER,
            **self.core.client_config,
        }
        if self.core.instance_id:
            conf["group.instance.id"] = self.core.instance_id
        # partition.assignment.strategy=cooperative-sticky (a pass-through property): incremental
        # rebalances, where the partitions that stay keep flowing while others move.
        self.cooperative = cooperative(conf)
        self._consumer_conf = conf
        self.consumer = Consumer(conf)
        self._consumer_renewals: list[float] = []
        self._open_native()
        if self.exactly_once:
            txns = self.core.transactions
            txns.transaction = Transaction(txns.producer, self.consumer.consumer_group_metadata)
        self._http: WebServer | None = None
        # Live queries ahead of processing, within a share of the loop's time (serving.QueryGate).
        self.query_gate = QueryGate(self.core.sections.serving.query_priority_share, self.core.metrics)

    # -- the core's hooks -------------------------------------------------------------------------

    # The source's partition count comes from the core's own admin client, never from
    # self.consumer: restores run inside the rebalance callback, and a consumer method that
    # serves callbacks (list_topics, poll, consume, close) called there clears the consumer's
    # per-thread call state; the next log or error callback of the same consume() then hits
    # confluent-kafka's C assertion (CallState_get: cs != NULL) and aborts the process.
    # Callbacks call only assign/unassign and commit on the consumer; the low watermark of a
    # replay from the start is asked with the core's own client too (watermarks() refreshes
    # the metadata of the consumer it is given).

    def is_stopping(self) -> bool:
        return self.stopping.is_set()

    # -- group membership ------------------------------------------------------------------------

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:  # a replaced consumer's last callback
            return
        # Every partition of the assignment counts as assigned before any is restored, so /ready
        # says 503 until the last one is.
        self.core.assigned.update(tp.partition for tp in partitions if tp.topic == self.topic)
        self.core.in_group = True
        self.core.metrics.assigned.set(len(self.core.assigned))
        self.core.finish_writer(wait=True)
        ours = [tp.partition for tp in partitions if tp.topic == self.topic]
        # The core's admin client, never the consumer inside its own rebalance callback.
        committed = self.core.group_committed(ours)
        for tp in partitions:
            if tp.topic == self.topic:
                tp.offset = self._restore_slot(tp.partition, committed.get(tp.partition))
        # Split into the native reader before the assignment (their records then stay off the
        # consumer queue); cooperative: added to what it already holds.
        assign(consumer, self.native, partitions, self.cooperative)
        self.core.record_assignment()

    def _restore_slot(self, partition: int, committed: int | None) -> int:
        """``partition`` restored from its newest usable snapshot into a slot, silent up to
        the group's ``committed`` offset; the offset to consume it from."""
        self.core.liveness.beat()  # restores run in consume(): each partition counts as progress
        outcome = self.core.restart_point(partition, self.core.restore(partition), committed)
        slot = self.core.resume(partition, outcome, committed)
        self.committed[partition] = committed if committed is not None else -1
        start = slot.operator.next_offset
        return start if start is not None else OFFSET_BEGINNING

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            # A replaced consumer's revocation while it closes: its partitions were released
            # with it, unsnapshotted (``_replace_consumer``).
            return
        revoked = [tp.partition for tp in partitions if tp.topic == self.topic]
        self.core.finish_writer(wait=True)
        self._pending_commit = None
        # Eager: every partition goes and a new assignment follows. Cooperative: only these go,
        # and the member stays in the group.
        self.core.in_group = self.cooperative and self.core.in_group
        try:
            self.checkpoint([p for p in revoked if p in self.core.slots])
        except DeliveryError as exc:
            log.error("no snapshot on revocation: %s; the next owner replays from the last snapshot", exc)
        except ConsumerFatal as exc:  # the commit after the snapshots: the loop replaces the consumer
            log.error("offsets not committed on revocation: the consumer failed for good (%s)", exc)
        except (KafkaException, TransactionStuck) as exc:
            if self.core.transactions.transaction is None:
                if isinstance(exc, KafkaException) and _fatal(exc.args[0]):
                    log.error("checkpoint on revocation failed: the consumer failed for good (%s)",
                              exc.args[0].str())
                else:
                    log.exception("checkpoint on revocation failed")
            else:
                # (The member fell out of the group, typically: its partitions are lost.)
                self.abort_transaction(exc)
        except Exception:  # the partitions are gone either way; the next owner replays from the last snapshot
            log.exception("checkpoint on revocation failed")
        self.core.release(revoked)
        for p in revoked:
            self.committed.pop(p, None)
        unassign(consumer, self.native, partitions, self.cooperative)  # then released from the native reader
        self.core.record_assignment()

    # -- main loop -------------------------------------------------------------------------------

    def run(self) -> int:
        self._start_http()
        self.core.start_members()
        def on_signal(signum: int, _frame: object) -> None:
            if not self.stopping.is_set():
                # At once: the loop may be inside a checkpoint round that a broker quota slows.
                log.info("%s: stopping after the current batch, then final snapshots of %d partitions",
                         signal.Signals(signum).name, len(self.core.slots))
            self.stopping.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        self.core.count()  # asked before any rebalance callback can need it
        self.consumer.subscribe([self.topic], on_assign=self.on_assign, on_revoke=self.on_revoke)
        shape = RECORDS if self.core.needs_headers else COLUMNS
        loop = ConsumeLoop(self.consumer, self.topic, batch_size=self.batch_size,
                           wait_s=self.batch_max_wait_ms / 1000.0, shape=shape,
                           on_error=self._consume_error, beat=self._beat, native=self.native)
        clean = False
        try:
            while True:
                try:
                    loop.run(self._step, until=self.stopping.is_set)
                    break
                except ConsumerFatal as exc:
                    self._replace_consumer(exc)
                    loop.consumer, loop.native = self.consumer, self.native
            log.info("stopping: final snapshots for partitions %s", sorted(self.core.slots))
            try:
                with self.core.shutdown_progress("final snapshots"):
                    self.core.finish_writer(wait=True)
                    self.checkpoint()
            except (DeliveryError, TransactionStuck) as exc:
                log.error("final snapshots not written: %s; the next owner replays from the last snapshot", exc)
                self.core.checkpointer.no_more_snapshots = True
            clean = True
            return 0
        finally:
            if not clean:
                self.core.checkpointer.no_more_snapshots = True
            self.stopping.set()
            self._close_native()  # its handles go before the consumer they belong to
            self.consumer.close()
            if self.core.membership.directory is not None:
                self.core.membership.directory.close(clean=clean)
            if self._http is not None:
                self._http.shutdown()
            self.core.store.close()
            self.core.ticks.close()
            if self.core.checkpointer.background is not None:
                self.core.checkpointer.background.close()
            self.core.checkpointer.close()

    def yield_to_queries(self) -> None:
        self.query_gate.yield_to_queries()

    def _beat(self) -> None:
        """Each turn of the consume loop: progress for ``/live``, and for the watch of a member
        that holds nothing while its group stands still (``health.GroupProgress``)."""
        core = self.core
        core.liveness.beat()
        core.group_progress.tick(bool(core.assigned))

    def _consume_error(self, err: KafkaError) -> None:
        if _fatal(err):
            raise ConsumerFatal(err)
        log.warning("consume error: %s", err)

    # -- the ingest path (grudge_stream.runtime.native) ----------------------------------------------

    def _open_native(self) -> None:
        """The native reader of ``self.consumer`` as the ``ingest`` setting asks (None: today's
        path); said once per worker, not per renewed consumer."""
        # Operators that read headers (needs_headers) take records: the reader builds them from
        # its headed columns (the headers and timestamp types read through librdkafka too).
        self.native = open_reader(self.ingest, self.consumer, self.topic, self.batch_size, quiet=self._ingest_said,
                                  arrays=True, backlog_factor=self.batch_backlog_factor)
        self._ingest_said = True
        self.core.metrics.ingest_native.set(1 if self.native is not None else 0)

    def _close_native(self) -> None:
        if self.native is not None:
            self.native.close()

    def ready_status(self) -> tuple[int, dict]:
        status, body = self.core.ready_status()
        body["ingest"] = "native" if self.native is not None else "python"
        return status, body

    def _log_end(self, p: int) -> int:
        """The log end offset librdkafka learned with its fetches."""
        return self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)[1]

    def _step(self, batch: Batch) -> None:
        """One consumed batch: processed and published by partition, then what is due of
        commits, transactions and snapshots, and the loop's gauges."""
        core = self.core
        groups = batch.groups
        if self.reset_pending:  # a transaction aborted in this consume's rebalance callback
            for p in self.reset_held():
                groups.pop(p, None)
        if groups:
            core.process_groups(groups, core.needs_headers)
            if batch.count >= self.batch_size:  # a backlog: the speed a replay reads and applies at
                core.budget.rate.observe(batch.count, time.perf_counter() - batch.started)
        t1 = time.perf_counter()
        if core.transactions.transaction is None:
            self._commit_if_due()
        elif core.limits.cadence.due():
            self._transaction_round()
        core.finish_writer()
        core.snapshot_next()
        if core.checkpointer.cadence.due():
            core.snapshot_round()
        core.metrics.checkpoint_paused(time.perf_counter() - t1)
        core.waiting.tick(len(core.assigned))
        core.record_lag(self._log_end)
        core.record_replay()
        core.ticks.check(core.slots)

    native = None  # the native ingest reader (grudge_stream.runtime.native), None on today's path
    _ingest_said = False

    def _start_http(self) -> None:
        api = WorkerHTTP(self.core, gate=getattr(self, "query_gate", None), ready_status=self.ready_status)
        if sys.getswitchinterval() > QUERY_SWITCH_INTERVAL_S:
            # The request threads share the interpreter with the consume loop: at the default
            # 5 ms, each of the dozen points where a query waits for the interpreter lock (a
            # socket read or write, a forward, a slot lock) can cost 5 ms on a busy worker.
            # Switching matters only while a second thread waits, so an idle API costs nothing.
            sys.setswitchinterval(QUERY_SWITCH_INTERVAL_S)
        host = self.core.sections.serving.web_host
        port = self.core.sections.serving.web_port
        self._http = WebServer((host, port), lambda path: (api, path), server_tls(self.core.sections.serving)).start()


def run_batch_worker(topology: Topology, settings: Settings, *, create_topics: bool = True,
                     partitions: int | None = None, create_source: bool = False) -> int:
    """Run ``topology`` on the batch runtime until SIGTERM/SIGINT; the exit status.

    The start-up rules come first (``grudge_stream.runtime.start``): the refusals, the topics
    (``create_topics``; ``partitions`` and ``create_source`` as in ``grudge-stream topics``)
    and the overrides follower. A refusal raises ``ConfigError`` before anything is written."""
    from grudge_stream.repartition import start_stage
    from grudge_stream.runtime.start import start_checks

    start_checks(topology, settings, "batch", create_topics=create_topics, partitions=partitions,
                 create_source=create_source)
    worker = BatchWorker(topology, settings)
    # A topology keyed by a field: its repartition stage feeds the topic the worker reads.
    stage = start_stage(topology, settings, metrics=worker.core.metrics, liveness=worker.core.liveness,
                        client_config=worker.core.client_config)
    try:
        return worker.run()
    except (CheckpointError, DeliveryError, WorkerFault) as exc:  # stopped without a snapshot past it
        log.error("%s", exc)
        return exit_code(exc)
    except KafkaException as exc:  # the cluster's answer at run time: a fault, restart
        log.error("the worker stopped on a Kafka error: %s", exc.args[0].str() if exc.args else exc)
        return EXIT_FAULT
    finally:
        if stage is not None:
            stage.stop()
