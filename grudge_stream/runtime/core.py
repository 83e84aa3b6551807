"""The runtime-neutral worker core: what both runtimes do the same way.

The two adapters (``grudge_stream.runtime.batch``, the confluent-kafka consumer loop,
and ``grudge_stream.runtime.faust.worker``, the Faust app) differ in how records arrive and
how the group is joined; everything else is here, once:

- **settings**: ``setting(settings, name)`` (from ``grudge_stream.settings``) reads a
  runtime setting with the default declared for it in ``COMMON`` (so an unbound
  ``Settings``, as in tests, gets the same defaults as a topology's bound one);
- **partitions**: one ``PartitionSlot`` per assigned source partition; ``restore``
  (blocking) loads the newest usable snapshot (rules in ``grudge_stream.partitions``),
  ``adopt`` makes it a slot, ``release`` lets revoked partitions go;
- **the checkpoint cadence**: one ``CheckpointCadence`` both runtimes ask "is a round
  due?" — every ``checkpoint_interval_s``;
- **the checkpoint round**: outputs flushed (or, with exactly-once, carried by the
  same transaction), every changed partition snapshotted, then the offsets the
  snapshots cover committed — through the transaction (``Transaction``), the
  consumer, or, for Faust, as **commit limits** its consumer never commits past; a
  failed periodic round is logged and retried at the next interval;
- **readiness, lag, health and metrics**: ``/ready`` (``ready_status``), ``/live``
  (``Liveness``), ``/metrics`` (``Metrics``), consumer lag per partition, the members
  directory of live score queries;
- client configuration comes from ``grudge_stream.kafkaconf`` (``producer_config`` for
  every producer, ``FAST_CONSUMER`` for every batched confluent-kafka consumer), and
  consumed messages become records through ``grudge_stream.operators.records``.

Exactly-once (``exactly_once=true``) is a batch-runtime feature: the core's round runs
inside a ``Transaction`` when the adapter gives it one. The Faust runtime refuses the
setting — see ``grudge_stream.runtime.faust.worker`` for the reason.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Iterator

from grudge_stream.checkpoint import (
    BROKER_ABORT_CHECK_INTERVAL_S,
    OPEN_TRANSACTION_MARGIN_S,
    CheckpointStore,
    watermarks,
)
from grudge_stream.exceptions import CheckpointError, ConfigError, DeliveryError
from grudge_stream.health import AssignmentWatch, BrokerProbe, readiness
from grudge_stream.kafka.transactions import TXN_CALL_LIMIT_S, TXN_CALL_TIMEOUT_S, Transaction, TransactionStuck
from grudge_stream.kafka.transactions import resume as _resume
from grudge_stream.kafkaconf import FAST_CONSUMER, client_config, producer_config
from grudge_stream.liveness import GroupProgress, Liveness
from grudge_stream.metrics import Metrics
from grudge_stream.operators.records import group_source_records
from grudge_stream.outputs import OutputPublisher
from grudge_stream.runtime.ticks import IdleTicks
from grudge_stream.partitions import (PartitionSlot, RestoreOutcome, checkpoint_slots, restore_partition,
                                      snapshot_write, snapshots_written)
from grudge_stream.serving import MembersDirectory, PartitionerCheck, ScoreQueries, advertised_url
from grudge_stream.settings import setting
from grudge_stream.signing import SigningKeys
from grudge_stream.topology import Settings, Topology

__all__ = ["FAST_CONSUMER", "CheckpointCadence", "Transaction", "TransactionStuck", "TXN_CALL_LIMIT_S",
           "WorkerCore", "group_source_records"]

# A failed periodic checkpoint round is logged at most this often.
FAILURE_LOG_INTERVAL_S = 10.0
# How often a worker republishes its members record (with its partitions' watermarks) from
# its loop; assignment changes publish at once.
MEMBERS_REFRESH_S = 10.0
# A shutdown whose final snapshots take longer logs its progress this often.
SHUTDOWN_PROGRESS_S = 10.0
# Consumer lag is recorded at most this often.
LAG_INTERVAL_S = 1.0

def open_transaction_wait(settings) -> float:
    """How long a restore waits out another producer's open transaction on the snapshot
    topic: ``open_transaction_wait_s`` (0: not at all), by default the time the broker
    takes to abort a dead worker's transaction — its timeout (that of the fleet, assumed
    equal to ours) plus the broker's abort-check interval and a margin."""
    wait = setting(settings, "open_transaction_wait_s")
    if wait is None:
        wait = (setting(settings, "transaction_timeout_s") + BROKER_ABORT_CHECK_INTERVAL_S
                + OPEN_TRANSACTION_MARGIN_S)
    return wait


class CheckpointCadence:
    """When the next periodic checkpoint round is due: ``interval_s`` after the last one
    (successful or failed). Both runtimes ask ``due()`` and report ``done()``."""

    __slots__ = ("interval_s", "last", "_clock")

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self.last = clock()

    def due(self) -> bool:
        return self._clock() - self.last >= self.interval_s

    def done(self) -> None:
        self.last = self._clock()


class ProcessingRate:
    """Records per second a worker reads and processes with a backlog (an exponentially
    weighted mean over full batches): what a restore's replay of ``n`` records costs,
    ``n / rate``. Until measured, a conservative guess."""

    __slots__ = ("per_s",)
    INITIAL = 100_000.0
    WEIGHT = 0.05

    def __init__(self) -> None:
        self.per_s = self.INITIAL

    def observe(self, records: int, seconds: float) -> None:
        if records >= 100 and seconds > 0:  # tiny batches measure call overhead, not replay speed
            self.per_s += self.WEIGHT * (records / seconds - self.per_s)


class SnapshotWriter:
    """One background snapshot round, written off the consume loop.

    The loop copies the due partition's state at a batch boundary (``snapshot_write``
    deferred: a memcpy of its tables) and notes the output stream's position; this thread
    serializes the copy (the envelopes and their checksums), produces every
    chunk and waits for their acknowledgements while processing goes on; the loop then
    ``release``s the manifests once every output produced before the copy is delivered
    (exactly-once: committed), so a snapshot never covers an undelivered output; the thread
    writes them, and the loop does the bookkeeping when ``done``.
    """

    def __init__(self, store, slots: list[PartitionSlot], writes: list, mark: int) -> None:
        self.store = store
        self.slots = slots
        self.writes = writes
        self.sizes: list[int] = []
        self.mark = mark
        self.t0 = time.perf_counter()
        self.chunks_done = threading.Event()
        self.release = threading.Event()
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.refs: list | None = None
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, name="grudge-snapshot-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            # Serialized here, off the loop: the loop only copied the state.
            writes, self.writes = [w.serialized() for w in self.writes], []
            self.sizes = [len(w.blob) for w in writes]
            pending = self.store.write_chunks(writes)
            del writes
            self.chunks_done.set()
            while not self.release.wait(0.05):
                if self.cancelled.is_set():
                    raise CheckpointError("snapshot round cancelled: outputs it covers were not delivered")
            self.refs = self.store.write_manifests(pending)
        except Exception as exc:  # noqa: BLE001 - the loop reports it as a failed round
            self.error = exc
        finally:
            self.done.set()


class WorkerCore:
    """The state and bookkeeping of one worker, whichever runtime feeds it.

    An adapter subclasses it and may override ``_topic_partition_count()`` and
    ``_low_watermark(partition)`` (blocking; by default asked with clients of their own),
    ``commit_offsets`` (a consumer commit) and ``is_stopping``. ``log`` is the adapter's
    logger.
    """

    # The group gave this member an assignment (maybe empty) since its last revocation: an
    # adapter sets it in its rebalance callbacks.
    in_group: bool = False

    runtime = ""
    log = logging.getLogger("grudge_stream.runtime")

    def __init__(self, topology: Topology, settings: Settings, *, exactly_once: bool = False,
                 bootstrap_servers: str | None = None, client_properties: dict | None = None) -> None:
        self.topology = topology
        self.settings = settings
        self.bootstrap = bootstrap_servers or settings.bootstrap_servers
        # Security and pass-through client properties, for every client (docs/security.md).
        self.client_config = {**client_config(settings, self.bootstrap), **(client_properties or {})}
        self.topic = topology.source_topic
        # Forwarding operators read headers: the record path (no columns) for them only.
        self.needs_headers = bool(topology.needs_headers)
        self.app_id = topology.app_id
        self.instance_id = setting(settings, "group_instance_id")
        self.metrics = Metrics()
        self.liveness = Liveness.from_settings(settings)
        # /live also fails when this member holds nothing while the group stands still and
        # records arrive (a member the group forgot: liveness.GroupProgress).
        self.group_progress = GroupProgress(self.liveness.timeout_s, self.group_position)
        self.liveness.watch("group", self.group_progress)
        self.slots: dict[int, PartitionSlot] = {}
        self.assigned: set[int] = set()
        # Per source partition, the offset a durable snapshot covers: the group's committed
        # offset never runs ahead of it.
        self.commit_limits: dict[int, int] = {}
        self.partition_count: int | None = None
        self.cadence = CheckpointCadence(topology.checkpoint_interval_s)
        # A partition's snapshot is due when a restore would replay more than the budget
        # (docs/checkpoints.md): records since its snapshot at the measured processing rate.
        self.replay_budget_s = setting(settings, "snapshot_replay_budget_s")
        self.snapshot_max_age_s = setting(settings, "snapshot_max_age_s")
        self.rate = ProcessingRate()
        # The at-least-once background snapshot in flight, and the due partitions waiting
        # for their copy (one per batch boundary): snapshot_round / snapshot_next / finish_writer.
        self.writer: SnapshotWriter | None = None
        self._snapshot_queue: list[int] = []
        self._background_store: CheckpointStore | None = None
        self._replay_recorded = 0.0
        # Offsets commit every commit_interval_s, apart from snapshots.
        self.commits = CheckpointCadence(setting(settings, "commit_interval_s"))
        self._pending_limits: tuple[int, dict[int, int]] | None = None
        # Set when processing died of an unexpected error, or outputs could not be delivered
        # on the way out: no snapshot is written after that (the state may be ahead of its
        # outputs; the next owner replays from the last good one).
        self.no_more_snapshots = False
        self._last_failure_log = 0.0
        self._lag_checked = 0.0
        self.producer = None
        self._stuck_producers: list = []
        self.transaction: Transaction | None = None
        if exactly_once:
            self.producer = self._transactional_producer()
        self.publisher = OutputPublisher(self.bootstrap, topology.outputs, producer=self.producer,
                                         operator_id=topology.operator_id, metrics=self.metrics,
                                         client_config=self.client_config)
        self.store = CheckpointStore(self.bootstrap, topology.snapshot_topic, client_config=self.client_config,
                                     chunk_bytes=setting(settings, "snapshot_chunk_bytes"),
                                     chunk_delay_s=setting(settings, "snapshot_chunk_delay_s"),
                                     producer=self.producer, open_transaction_wait_s=open_transaction_wait(settings))
        self.broker = BrokerProbe(self.client_config, self.topic)
        # Ticks into quiet partitions that hold raised keys (grudge_stream.runtime.ticks).
        self.ticks = IdleTicks(self.topic, setting(settings, "idle_tick_s"), self.client_config,
                               self.metrics.idle_ticks.labels(topology.operator_id))
        self.waiting = AssignmentWatch(setting(settings, "session_timeout_s"), bool(self.instance_id))
        # Live score queries (grudge_stream.serving): answered from a restored slot, or
        # forwarded to the owner the members directory names (``start_members``).
        self.members: MembersDirectory | None = None
        self._members_published = 0.0  # monotonic time of the last members record
        self._published_marks: dict[int, int | None] = {}  # the watermarks it carried
        self.partitioner_check = PartitionerCheck(settings.get("key_partitioner", "murmur2"), self.topic,
                                                  self.metrics)
        self.signing = SigningKeys.from_settings(settings)  # signed members records (grudge_stream.signing)
        table = topology.overrides
        if table is not None:  # the overrides follower started before the worker: count from here on
            overrides_rejected = self.metrics.entries_rejected.labels("overrides")
            overrides_rejected.inc(table.rejected)
            table.on_reject = overrides_rejected.inc
        self.queries = ScoreQueries.from_settings(settings, self.query_slot, lambda: self.partition_count, None,
                                                  self.metrics)
        self.queries.partitioner_check = self.partitioner_check

    def _transactional_producer(self, renewal: bool = False):
        from confluent_kafka import Producer

        txn_timeout_s = setting(self.settings, "transaction_timeout_s")
        if not self.instance_id and not renewal:
            self.log.warning("exactly_once without group_instance_id: the transactional id changes with "
                             "every restart, so a crashed worker's open transaction is not aborted at once "
                             "and a takeover may wait up to transaction_timeout_s + %g s",
                             BROKER_ABORT_CHECK_INTERVAL_S)
        txn_id = f"{self.app_id}-{self.instance_id or socket.gethostname() + '-' + str(os.getpid())}"
        producer = Producer(producer_config(self.client_config, bootstrap_servers=self.bootstrap, extra={
            "transactional.id": txn_id, "transaction.timeout.ms": int(txn_timeout_s * 1000)}))
        _resume(lambda: producer.init_transactions(TXN_CALL_TIMEOUT_S))  # a cluster just back may be slow
        return producer

    def renew_producer(self, stuck: bool = False) -> None:
        """Exactly-once: replace a producer fenced for good by a new one under the same
        transactional id, as Kafka Streams does after a ``ProducerFencedException``. It
        happens when the cluster was away longer than ``transaction_timeout_s``: the broker
        aborted the open transaction and bumped the producer's epoch. The old producer's
        unsent records are purged and forgotten; the caller resets the partitions it holds.
        A ``stuck`` producer (a call still blocked inside it) is set aside, never destroyed
        under that call; the new one fences it."""
        old = self.producer
        if stuck:
            self._stuck_producers.append(old)
        else:
            try:
                old.purge()
            except Exception:  # a fenced producer may refuse even that; it is dropped either way
                pass
        self.producer = self._transactional_producer(renewal=True)
        if self.transaction is not None:
            self.transaction.producer = self.producer
            self.transaction.open = False
        self.publisher.drop_unfinished(self.producer)
        self.store.use_producer(self.producer)

    # -- adapter hooks ----------------------------------------------------------------------------

    def _topic_partition_count(self) -> int:
        """The source's partition count, asked with a client of its own (the batch adapter
        asks its consumer)."""
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"log_level": 3, **self.client_config}).list_topics(topic=self.topic, timeout=30)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            raise ConfigError(f"source topic {self.topic!r} of {self.topology.name!r} does not exist "
                              f"({t.error if t is not None else 'no metadata'})")
        return len(t.partitions)

    def _low_watermark(self, partition: int) -> int:
        """The earliest retained offset of a source partition (a replay from the start)."""
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({**self.client_config, "group.id": "grudge-watermarks"})
        try:
            return watermarks(c, TopicPartition(self.topic, partition))[0]
        finally:
            c.close()

    def is_stopping(self) -> bool:
        return False

    @contextlib.contextmanager
    def shutdown_progress(self, what: str, every_s: float = SHUTDOWN_PROGRESS_S) -> Iterator[None]:
        """Log every ``every_s`` while ``what`` (the final snapshots) is still running, so a
        shutdown slowed by a broker quota or an outage never looks hung."""
        done = threading.Event()
        t0 = time.monotonic()

        def report() -> None:
            while not done.wait(every_s):
                self.log.warning("stopping: %s still running after %.0f s (a broker quota or an unreachable "
                                 "broker slows it; killing the worker loses nothing: the next owner replays "
                                 "from the last snapshot)", what, time.monotonic() - t0)

        thread = threading.Thread(target=report, name="grudge-stop-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(1.0)
            if time.monotonic() - t0 >= every_s:
                self.log.info("stopping: %s done after %.0f s", what, time.monotonic() - t0)

    def commit_offsets(self, offsets: dict[int, int]) -> None:
        """Commit the group's offsets of a round without a transaction (batch: the consumer;
        Faust: nothing, its consumer commits up to ``commit_limits`` on its own timer)."""

    # -- assignment and restore -------------------------------------------------------------------

    def count(self) -> int:
        """The source topic's partition count (asked once)."""
        if self.partition_count is None:
            self.partition_count = self._topic_partition_count()
        return self.partition_count

    def restore(self, partition: int) -> RestoreOutcome:
        """Load ``partition``'s newest usable snapshot (blocking: run it in an executor from
        asyncio code)."""
        return restore_partition(self.topology, self.store, partition, self.count(),
                                 lambda: self._low_watermark(partition), self.metrics,
                                 self.publisher.dead_letter_limit())

    def adopt(self, partition: int, outcome: RestoreOutcome) -> PartitionSlot:
        """A restored partition becomes a slot; processing starts at its ``next_offset``."""
        slot = self.slots[partition] = PartitionSlot(self.topology, partition, outcome, self.count(),
                                                     self.metrics)
        slot.key_check = self.partitioner_check
        if outcome.operator.next_offset is not None:
            self.commit_limits[partition] = outcome.operator.next_offset
        return slot

    def release(self, partitions) -> None:
        """Revoked partitions go: their slots, cached snapshot positions and commit limits."""
        for p in partitions:
            self.slots.pop(p, None)
            self.assigned.discard(p)
            self.store.forget(self.topology.operator_id, p)
            self.commit_limits.pop(p, None)

    def record_assignment(self) -> None:
        """The assignment gauges and the members directory, after any change of either."""
        self.metrics.assigned.set(len(self.assigned))
        self.metrics.restored.set(len([p for p in self.assigned if p in self.slots]))
        self.publish_members()

    # -- checkpoints ------------------------------------------------------------------------------

    def dirty(self, partitions=None) -> list[PartitionSlot]:
        """The slots of ``partitions`` (default: all) with changes since their last snapshot."""
        parts = sorted(self.slots) if partitions is None else partitions
        return [self.slots[p] for p in parts if p in self.slots and self.slots[p].dirty]

    def write_snapshots(self, dirty: list[PartitionSlot], taken: list | None = None) -> dict[int, int]:
        """Snapshot ``dirty`` (blocking): outputs flushed first, unless a transaction carries
        them; the offsets the snapshots cover, by partition. ``taken``: the slots' snapshots
        serialized earlier (``take_snapshots``), written as they are."""
        checkpoint_slots(dirty, self.store, None if self.transaction is not None else self.publisher,
                         self.liveness.beating(self.is_stopping), taken=taken)
        return {s.partition: s.snapshotted_offset for s in dirty if s.snapshotted_offset is not None}

    def checkpointed(self, offsets: dict[int, int]) -> None:
        """Bookkeeping after a round: commit limits up to the snapshots (never back), the
        cadence restarted."""
        for p, o in offsets.items():
            if o > self.commit_limits.get(p, -1):
                self.commit_limits[p] = o
        self.cadence.done()

    def snapshot_round(self) -> None:
        """At-least-once: the partitions whose budget is spent are queued; ``snapshot_next``
        copies them one at a time at batch boundaries (the loop pauses for one partition's
        copy, not for all of them), each written by a ``SnapshotWriter`` while processing
        goes on."""
        self.cadence.done()
        if self.no_more_snapshots or self._snapshot_queue:
            return
        self._snapshot_queue = [s.partition for s in self.due_snapshots()]
        self.snapshot_next()

    def snapshot_next(self) -> None:
        if self.writer is not None or self.no_more_snapshots:
            return
        while self._snapshot_queue:
            slot = self.slots.get(self._snapshot_queue.pop(0))
            if slot is not None and slot.dirty:
                self.writer = SnapshotWriter(self.background_store(), [slot], [snapshot_write(slot, deferred=True)],
                                             self._writer_mark())
                return

    def background_store(self) -> CheckpointStore:
        """Where background snapshots are written: the store; with exactly-once its sibling
        with a plain producer of its own (the transactional one serves the loop only)."""
        if self.transaction is None:
            return self.store
        if self._background_store is None:
            self._background_store = self.store.sibling()
        return self._background_store

    def _writer_mark(self) -> int:
        """What a background snapshot's manifest waits for, noted at the copy: at-least-once,
        the output stream's position (every output before it delivered); exactly-once, the
        number of committed transactions that includes the one now open (it carries every
        output before the copy)."""
        txn = self.transaction
        if txn is None:
            return self.publisher.mark()
        return txn.commits + (1 if txn.open else 0)

    def finish_writer(self, wait: bool = False) -> None:
        """Move the background round on: release its manifests once the outputs it covers are
        delivered; its bookkeeping once written. ``wait``: until it is done (revocation,
        shutdown, a new assignment), flushing the outputs first."""
        w = self.writer
        if w is None:
            return
        txn = self.transaction
        if txn is not None and not w.release.is_set():
            # Exactly-once: the manifest waits for the commit of the transaction holding every
            # output before the copy. On revocation and shutdown (``wait``) a round not covered
            # yet is dropped: the checkpoint that follows snapshots in its transaction.
            if txn.commits >= w.mark:
                w.release.set()
            elif wait:
                w.cancelled.set()
        elif not w.release.is_set():
            if wait:
                try:
                    self.publisher.flush(should_stop=self.is_stopping)
                except DeliveryError:
                    w.cancelled.set()
                else:
                    w.release.set()
            elif w.chunks_done.is_set():
                if self.publisher.has_failures():
                    try:
                        self.publisher.flush(should_stop=self.is_stopping)
                    except DeliveryError:
                        w.cancelled.set()
                if not w.cancelled.is_set() and self.publisher.delivered_through(w.mark):
                    w.release.set()
        if wait:
            w.done.wait()
        if not w.done.is_set():
            return
        self.writer = None
        if w.error is not None:
            if not self.no_more_snapshots and not (txn is not None and w.cancelled.is_set()):
                self.round_failed(w.error, background=True)
            return
        live = [(s, r, n) for s, r, n in zip(w.slots, w.refs or [], w.sizes) if self.slots.get(s.partition) is s]
        if live:
            snapshots_written(*map(list, zip(*live)), time.perf_counter() - w.t0)

    def checkpoint(self, partitions=None) -> None:
        """One checkpoint round, blocking: snapshots of every changed partition of
        ``partitions``, then their offsets committed (in the transaction, with exactly-once)."""
        if self.no_more_snapshots:
            return
        dirty = self.dirty(partitions)
        txn = self.transaction
        if txn is not None:
            if not txn.open and not dirty:
                return
            txn.begin()
        offsets = self.write_snapshots(dirty)
        if txn is not None:
            txn.commit(self.topic, offsets)
        elif offsets:
            self.commit_offsets(offsets)
        self.checkpointed(offsets)

    def begin_outputs(self) -> None:
        """Before publishing outputs: with exactly-once they open the interval's transaction."""
        if self.transaction is not None:
            self.transaction.begin()

    def yield_to_queries(self) -> None:
        """Between partitions: the batch runtime lets live queries in flight finish first
        (``serving.QueryGate``); the Faust runtime answers them on its event loop, between
        the loop's awaits, and has nothing to do here."""

    def process_groups(self, groups: dict[int, Any], records: bool = False) -> None:
        """The one "process, then publish" step of every runtime: each partition's records
        through its slot, under the slot's lock (a live query never reads a batch half
        applied), then its outputs to the publisher. ``groups``: partition -> columns
        (offsets, timestamps, keys, values), or lists of ``SourceRecord`` with ``records``
        (operators that declare ``needs_headers``). A partition without a slot here (not or
        no longer owned) is skipped: its owner processes it from its snapshot position."""
        topic, slots = self.topic, self.slots
        for p, chunk in groups.items():
            slot = slots.get(p)
            if slot is None:
                continue
            self.yield_to_queries()
            with slot.lock:
                out = slot.process(chunk) if records else slot.process_columns(topic, *chunk)
            if out:
                self.begin_outputs()
                self.publisher.publish(out)

    def round_failed(self, exc: Exception, background: bool = False) -> None:
        """A periodic round failed (a broker outage, say): logged, not fatal; the previous
        snapshot stays current and the next interval tries again. Outputs that could not be
        delivered while the worker stops end the snapshots (they could cover lost outputs).
        A failed transaction ends the worker; a failed ``background`` snapshot never does."""
        if self.transaction is not None and not background:
            raise exc
        if isinstance(exc, DeliveryError) and self.is_stopping():
            self.log.error("no snapshot: %s; the next owner replays from the last snapshot", exc)
            self.no_more_snapshots = True
            return
        self.cadence.done()
        now = time.monotonic()
        if now - self._last_failure_log > FAILURE_LOG_INTERVAL_S:
            self._last_failure_log = now
            self.log.error("checkpoint failed (%s); the previous snapshot stays current, retrying at the "
                           "next interval", exc)

    # -- health and the snapshot budget -----------------------------------------------------------

    def replay_report(self) -> dict[int, dict]:
        """Per partition: the replay a restore would need now (records, estimated seconds) and
        the age of its snapshot."""
        now = time.monotonic()
        rate = self.rate.per_s
        return {p: {"replay_records": slot.unsnapshotted, "replay_s": round(slot.unsnapshotted / rate, 3),
                    "snapshot_age_s": round(now - slot.last_snapshot_wall, 1)}
                for p, slot in list(self.slots.items())}

    def budget_exceeded(self, report: dict[int, dict]) -> list[int]:
        """The partitions that hold up a restore past 1.5x the budget (snapshots are not
        landing: the snapshot topic refuses writes, say); none while within it."""
        if self.replay_budget_s <= 0 or sum(r["replay_s"] for r in report.values()) <= 1.5 * self.replay_budget_s:
            return []
        return sorted(p for p, r in report.items() if r["replay_records"])

    def record_replay(self) -> None:
        """Once a second from each runtime's loop: the restore-replay gauges, and the members
        record's refresh."""
        now = time.monotonic()
        if now - self._replay_recorded < 1.0:
            return
        self._replay_recorded = now
        # The members record carries the watermarks `grudge-stream alerts` shows: refreshed
        # now and then, and at once when a partition got its first one.
        if now - self._members_published >= MEMBERS_REFRESH_S or any(
                slot.operator.watermark is not None and self._published_marks.get(p) is None
                for p, slot in list(self.slots.items())):
            self.publish_members()
        m, op_id = self.metrics, self.topology.operator_id
        report = self.replay_report()
        exceeded = set(self.budget_exceeded(report))
        for p, r in report.items():
            labels = (op_id, str(p))
            m.replay_records.labels(*labels).set(r["replay_records"])
            m.replay_seconds.labels(*labels).set(r["replay_s"])
            m.replay_budget_exceeded.labels(*labels).set(1 if p in exceeded else 0)

    def ready_status(self) -> tuple[int, dict]:
        """``/ready`` with each partition's restore replay (``replay_report``) and their sum: a
        worker whose snapshots do not land stays ready (it processes and commits), and says so."""
        status, body = readiness(self.assigned, self.slots, self.broker, self.in_group)
        report = self.replay_report()
        body["replay"] = {str(p): r for p, r in sorted(report.items())}
        body["restore_replay_s"] = round(sum(r["replay_s"] for r in report.values()), 3)
        body["restore_budget_exceeded"] = self.budget_exceeded(report)
        # Informational: a mismatch does not take the worker out of service (it still judges
        # its records right), but its score answers for the affected keys are not to be trusted.
        body["key_partitioner"] = self.partitioner_check.report()
        return status, body

    def due_snapshots(self, now: float | None = None) -> list[PartitionSlot]:
        """The slots to snapshot now. A restore after a crash replays every partition of the
        worker, so the budget holds for their sum: once the records applied since their
        snapshots would take more than ``snapshot_replay_budget_s`` to replay (at the measured
        rate), the partitions that hold most are due, until half the budget is left. A slot
        whose snapshot is ``snapshot_max_age_s`` old is due whatever the budget; an idle one
        never (``snapshot_replay_budget_s`` 0: every changed slot)."""
        now = time.monotonic() if now is None else now
        changed = [s for s in list(self.slots.values()) if s.dirty]
        if self.replay_budget_s <= 0:
            return changed
        due = [s for s in changed if now - s.last_snapshot_wall >= self.snapshot_max_age_s]
        rest = sorted((s for s in changed if s not in due), key=lambda s: s.unsnapshotted, reverse=True)
        rate = self.rate.per_s
        left = sum(s.unsnapshotted for s in rest) / rate
        if left >= self.replay_budget_s:
            for s in rest:
                due.append(s)
                left -= s.unsnapshotted / rate
                if left < self.replay_budget_s / 2:
                    break
        return due

    # -- commits apart from snapshots ---------------------------------------------------------------

    def group_committed(self, partitions) -> dict[int, int]:
        """The group's committed offsets of ``partitions``, those it has (blocking).

        Asked on every assignment, so it meets the cluster at its worst (a coordinator that is
        loading or moving, a broker bounced): transient answers are retried for up to
        ``broker_wait_s``, then the last one is raised (one line, exit 2 from the CLI)."""
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
        from confluent_kafka.admin import AdminClient

        from grudge_stream.topics import transient

        if not partitions:
            return {}
        req = ConsumerGroupTopicPartitions(self.app_id, [TopicPartition(self.topic, p) for p in partitions])
        # require_stable: while a transaction holding offsets of these partitions is open (a
        # crashed predecessor's, or one the broker is aborting after an outage), the broker
        # answers UNSTABLE_OFFSET_COMMIT instead of an offset that may move back or forward
        # once it ends (KIP-447); that wait is bounded by the transaction's timeout.
        t0 = time.monotonic()
        deadline = t0 + setting(self.settings, "broker_wait_s")
        unstable_deadline = max(deadline, t0 + open_transaction_wait(self.settings))
        delay, warned = 0.25, 0.0
        while True:
            try:
                # A client per attempt: one kept across a broker outage kept timing out after it.
                admin = AdminClient({"log_level": 3, **self.client_config})
                res = admin.list_consumer_group_offsets([req], require_stable=True,
                                                        request_timeout=10)[self.app_id].result(15)
                failed = [tp.error for tp in res.topic_partitions if tp.error is not None]
                if failed:  # a coordinator still loading answers per partition: never read as "no commit"
                    raise KafkaException(failed[0])
                return {tp.partition: tp.offset for tp in res.topic_partitions if tp.offset >= 0}
            except (KafkaException, TimeoutError) as exc:
                now = time.monotonic()
                unstable = isinstance(exc, KafkaException) and exc.args[0].code() == KafkaError.UNSTABLE_OFFSET_COMMIT
                if not transient(exc) or now + delay > (unstable_deadline if unstable else deadline):
                    raise
                if now - warned >= 15:
                    self.log.warning("the group's committed offsets of %s%s: %s; retrying for up to %.0f s "
                                     "(broker_wait_s)", self.topic, sorted(partitions), exc,
                                     deadline - now)
                    warned = now
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def group_position(self) -> tuple[int, int] | None:
        """The group's committed offsets and the source's log end offsets, each summed over
        the source's partitions (blocking; ``GroupProgress`` asks it in the background)."""
        from confluent_kafka import Consumer, TopicPartition

        n = self.count()
        committed = self.group_committed(range(n))
        c = Consumer({**self.client_config, "group.id": "grudge-watermarks", "log_level": 0})
        try:
            ends = [c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5, cached=False)[1]
                    for p in range(n)]
        finally:
            c.close()
        return sum(committed.values()), sum(ends)

    def restart_point(self, partition: int, outcome: RestoreOutcome, committed: int | None) -> RestoreOutcome:
        """A restored partition whose group committed offsets but kept no snapshot (they are
        apart now) is rebuilt from its earliest retained offset, silently up to the commit
        (``PartitionSlot.suppress_below``) — never resumed at the commit with an empty sketch."""
        if outcome.operator.next_offset is None and committed is not None:
            outcome.operator.next_offset = self._low_watermark(partition)
        return outcome

    def resume(self, partition: int, outcome: RestoreOutcome, committed: int | None) -> PartitionSlot:
        """``adopt``, then the replay up to the group's committed offset stays silent, and the
        commit limit never falls below that offset (a commit must not move the group back)."""
        slot = self.adopt(partition, outcome)
        slot.suppress_below(committed)
        if committed is not None and committed > self.commit_limits.get(partition, -1):
            self.commit_limits[partition] = committed
        return slot

    def advance_commit_limits(self) -> None:
        """Runtimes whose consumer commits on its own (Faust): every ``commit_interval_s`` note
        each partition's next offset and the output stream's position; once every output
        before that position is delivered, the commit limits move there — ahead of the
        snapshots, which a restore makes up for by replaying silently to the committed offset."""
        pending = self._pending_limits
        if pending is not None:
            mark, offsets = pending
            if self.publisher.delivered_through(mark):
                for p, o in offsets.items():
                    if p in self.slots and o > self.commit_limits.get(p, -1):
                        self.commit_limits[p] = o
                self._pending_limits = None
        if self._pending_limits is None and self.commits.due():
            self.commits.done()
            moved = {p: s.operator.next_offset for p, s in self.slots.items()
                     if s.operator.next_offset is not None and s.operator.next_offset > self.commit_limits.get(p, -1)}
            if moved:
                self._pending_limits = (self.publisher.mark(), moved)

    @property
    def ready(self) -> bool:
        """Every assigned partition restored, and the cluster answering."""
        return self.ready_status()[0] == 200

    def record_lag(self, log_end: Callable[[int], int | None]) -> None:
        """Consumer lag per partition from ``log_end(partition)`` (the adapter's cached log
        end offsets), at most every ``LAG_INTERVAL_S``."""
        now = time.monotonic()
        if now - self._lag_checked < LAG_INTERVAL_S:
            return
        self._lag_checked = now
        for p, slot in list(self.slots.items()):
            try:
                high = log_end(p)
            except Exception:  # noqa: BLE001 - no fetch yet for a just-assigned partition
                continue
            if high is not None:
                slot.set_log_end(high)

    # -- live score queries -----------------------------------------------------------------------

    def query_slot(self, partition: int) -> PartitionSlot | None:
        """The slot of ``partition`` if this worker holds it restored (called from HTTP threads)."""
        slot = self.slots.get(partition)
        return slot if slot is not None and partition in self.assigned else None

    def start_members(self, url: str | None = None) -> None:
        """Start the members directory (blocking: run it in an executor from asyncio code).
        ``url``: where this member answers score queries (default ``advertised_url``)."""
        url = url or advertised_url(self.settings)
        try:
            rejected = self.metrics.entries_rejected.labels("members")
            self.members = MembersDirectory(self.bootstrap, self.app_id, self.instance_id or url, url,
                                            client_config=self.client_config, runtime=self.runtime,
                                            source_topic=self.topic, signing=self.signing,
                                            on_reject=rejected.inc).start()
        except Exception as exc:  # noqa: BLE001 - queries then answer for local partitions only
            self.log.error("members directory %s-members unavailable (%s): score queries answer for this "
                           "worker's partitions only", self.app_id, exc)
            return
        self.queries.directory = self.members
        self.publish_members()

    def publish_members(self) -> None:
        if self.members is not None:
            # (Also called from the thread that starts the directory: copy first.)
            assigned = set(self.assigned)
            held = {p: slot for p, slot in list(self.slots.items()) if p in assigned}
            marks = {p: slot.operator.watermark for p, slot in held.items()}
            self.members.publish(list(held), self.partition_count, watermarks=marks)
            self._members_published = time.monotonic()
            self._published_marks = marks
