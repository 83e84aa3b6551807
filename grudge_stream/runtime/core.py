"""The runtime-neutral worker core: what both runtimes do the same way, built from parts.

The runtimes (``grudge_stream.runtime.batch``, the confluent-kafka consumer loop;
``grudge_stream.runtime.faust.worker``, the Faust app; ``grudge_stream.runtime.embedded``, a
state fed by its caller's own loop) differ in how records arrive and how the group is
joined; everything else is here, once. A runtime does not subclass the core: it holds one,
built with the few things only it knows, its **hooks**, as keyword arguments::

    self.core = WorkerCore(topology, settings, runtime="batch", log=log,
                           is_stopping=self.stopping.is_set,    # () -> bool
                           commit_offsets=self.commit_offsets,  # ({partition: offset}) -> None
                           yield_to_queries=self.yield_to_queries)  # () -> None

- ``runtime``: its name (in the members directory record), ``log``: its logger;
- ``is_stopping()``: whether the worker is shutting down (flushes and snapshot writes stop
  waiting on the broker); default: never;
- ``commit_offsets(offsets)``: commit the group's offsets of a checkpoint round without a
  transaction (batch: its consumer); default: nothing (Faust's consumer commits up to the
  commit limits on its own timer);
- ``yield_to_queries()``: called between the partitions of a batch, to let live queries in
  flight finish first (batch: ``serving.QueryGate``); default: nothing.

The source's partition count and its low watermarks are asked with the core's own clients,
never an adapter's consumer (see ``BatchWorker``'s note on rebalance callbacks). The group
membership the adapter learns in its rebalance callbacks it sets as ``core.in_group``.

The runtime then calls the core's steps (``restore``, ``resume``, ``process_groups``,
``checkpoint``, ``record_replay``, ...) and reads its parts directly:
``core.partition_slots``, ``core.checkpointer`` (``core.budget``), ``core.limits``,
``core.offsets``, ``core.transactions``, ``core.membership``; ``core.slots``,
``core.assigned`` and ``core.partition_count`` read the partition slots'. The parts, one
per job, each in a module of its own:

- **partitions** (``grudge_stream.runtime.slots``, ``PartitionSlots``): one
  ``PartitionSlot`` per assigned source partition; ``restore`` (blocking) loads the newest
  usable snapshot (rules in ``grudge_stream.partitions``), ``adopt`` makes it a slot,
  ``release`` lets revoked partitions go;
- **snapshots** (``grudge_stream.runtime.checkpointer``): the one ``CheckpointCadence``
  both runtimes ask "is a round due?" — every ``checkpoint_interval_s`` — the replay budget
  that says which partitions are due (``SnapshotBudget``), and the background rounds
  (``Checkpointer``, ``SnapshotWriter``); a failed periodic round is logged and retried at
  the next interval;
- **commits** (``grudge_stream.runtime.commits``): the **commit limits** a committed offset
  never passes (the Faust consumer never commits past them), the commits apart from
  snapshots, and the group's committed offsets (``GroupOffsets``);
- **exactly-once** (``grudge_stream.runtime.transactional``): the transactional producer and
  the ``Transaction`` the core's round runs in when the adapter gives it one;
- **members** (``grudge_stream.runtime.membership``): the members directory of live score
  queries;
- **the checkpoint round** (``checkpoint``, here): outputs flushed (or, with exactly-once,
  carried by the same transaction), every changed partition snapshotted, then the offsets
  the snapshots cover committed — through the transaction, the consumer, or as commit limits;
- **readiness, lag, health and metrics**: ``/ready`` (``ready_status``), ``/live``
  (``Liveness``), ``/metrics`` (``Metrics``), consumer lag per partition.

Runtime settings are read once into frozen sections (``grudge_stream.sections``: ``sections``,
with the defaults declared in ``COMMON``) and each part gets its section; client configuration comes from
``grudge_stream.kafkaconf`` (``producer_config`` for every producer, ``FAST_CONSUMER`` for
every batched confluent-kafka consumer), and consumed messages become records through
``grudge_stream.operators.records``.

Exactly-once (``exactly_once=true``) is a batch-runtime feature: the Faust runtime refuses
the setting — see ``grudge_stream.runtime.faust.worker`` for the reason.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterator

from grudge_stream.checkpoint import CheckpointStore, watermarks
from grudge_stream.exceptions import ConfigError
from grudge_stream.health import AssignmentWatch, BrokerProbe, readiness
from grudge_stream.kafka.transactions import TXN_CALL_LIMIT_S, TXN_CALL_TIMEOUT_S, Transaction, TransactionStuck
from grudge_stream.kafka.transactions import resume as _resume  # noqa: F401 - the batch adapter's
from grudge_stream.kafkaconf import FAST_CONSUMER, client_config
from grudge_stream.liveness import GroupProgress, Liveness
from grudge_stream.metrics import Metrics
from grudge_stream.operators.records import group_source_records
from grudge_stream.runtime.native import allocator
from grudge_stream.outputs import OutputPublisher
from grudge_stream.partitions import PartitionSlot, RestoreOutcome
from grudge_stream.runtime.checkpointer import (CheckpointCadence, Checkpointer, ProcessingRate, SnapshotBudget,
                                                SnapshotWriter)
from grudge_stream.runtime.commits import CommitLimits, GroupOffsets, open_transaction_wait, restart_point
from grudge_stream.runtime.membership import Membership
from grudge_stream.runtime.slots import PartitionSlots
from grudge_stream.runtime.ticks import IdleTicks
from grudge_stream.runtime.transactional import Transactions
from grudge_stream.serving import PartitionerCheck, ScoreQueries
from grudge_stream.sections import sections
from grudge_stream.signing import SigningKeys
from grudge_stream.topology import Settings, Topology

# (ProcessingRate, SnapshotWriter, open_transaction_wait: importable from here as before their
# parts had modules of their own.)
__all__ = ["FAST_CONSUMER", "CheckpointCadence", "ProcessingRate", "SnapshotWriter", "Transaction",
           "TransactionStuck", "TXN_CALL_LIMIT_S", "TXN_CALL_TIMEOUT_S", "WorkerCore", "group_source_records",
           "open_transaction_wait"]

# A shutdown whose final snapshots take longer logs its progress this often.
SHUTDOWN_PROGRESS_S = 10.0

_LOG = logging.getLogger("grudge_stream.runtime")


def _never() -> bool:
    return False


def _nothing() -> None:
    pass


def _commit_nothing(offsets: dict[int, int]) -> None:
    pass


class WorkerCore:
    """The state and bookkeeping of one worker, whichever runtime feeds it and holds it.

    It holds its parts (the module docstring): ``partition_slots`` (``PartitionSlots``),
    ``checkpointer`` (``Checkpointer``) with its ``budget`` (``SnapshotBudget``),
    ``limits`` (``CommitLimits``), ``offsets`` (``GroupOffsets``), ``transactions``
    (``Transactions``) and ``membership`` (``Membership``). The runtime's hooks
    (``runtime``, ``log``, ``is_stopping``, ``commit_offsets``, ``yield_to_queries``) are
    keyword arguments, as the module docstring shows.
    """

    def __init__(self, topology: Topology, settings: Settings, *, runtime: str = "",
                 log: logging.Logger = _LOG, is_stopping: Callable[[], bool] = _never,
                 commit_offsets: Callable[[dict[int, int]], None] = _commit_nothing,
                 yield_to_queries: Callable[[], None] = _nothing, exactly_once: bool = False,
                 bootstrap_servers: str | None = None, client_properties: dict | None = None) -> None:
        self.runtime = runtime
        self.log = log
        self.is_stopping = is_stopping
        self.commit_offsets = commit_offsets
        self.yield_to_queries = yield_to_queries
        # The group gave this member an assignment (maybe empty) since its last revocation: the
        # runtime sets it in its rebalance callbacks.
        self.in_group = False
        self.topology = topology
        self.settings = settings
        self.sections = sections(settings)  # read once; each part gets its section
        self.bootstrap = bootstrap_servers or self.sections.kafka.bootstrap_servers
        # Security and pass-through client properties, for every client (docs/security.md).
        self.client_config = {**client_config(settings, self.bootstrap), **(client_properties or {})}
        self.topic = topology.source_topic
        # Forwarding operators read headers: the record path (no columns) for them only.
        self.needs_headers = bool(topology.needs_headers)
        self.app_id = topology.app_id
        self.instance_id = self.sections.group.group_instance_id
        self.metrics = Metrics()
        self.liveness = Liveness.from_settings(self.sections.group)
        # /live also fails when this member holds nothing while the group stands still and
        # records arrive (a member the group forgot: liveness.GroupProgress).
        self.group_progress = GroupProgress(self.liveness.timeout_s, self.group_position)
        self.liveness.watch("group", self.group_progress)
        self.partition_slots = PartitionSlots(topology, self.metrics,
                                              partition_count=lambda: self._topic_partition_count(),
                                              low_watermark=lambda p: self._low_watermark(p))
        self.limits = CommitLimits(CheckpointCadence(self.sections.group.commit_interval_s))
        self.offsets = GroupOffsets(self.app_id, self.topic, self.sections.kafka, self.client_config, self.log,
                                    self.sections.checkpointing)
        cadence = CheckpointCadence(topology.checkpoint_interval_s)
        self.budget = SnapshotBudget(self.sections.checkpointing.snapshot_replay_budget_s,
                                     self.sections.checkpointing.snapshot_max_age_s, self.partition_slots)
        self._replay_recorded = 0.0
        self.transactions = Transactions(self.sections.checkpointing, self.app_id, self.instance_id, self.bootstrap,
                                         self.client_config, self.log, exactly_once=exactly_once)
        producer = self.transactions.producer  # the transactional one, or None
        self.publisher = OutputPublisher(self.bootstrap, topology.outputs, producer=producer,
                                         operator_id=topology.operator_id, metrics=self.metrics,
                                         client_config=self.client_config)
        self.store = CheckpointStore(self.bootstrap, topology.snapshot_topic, client_config=self.client_config,
                                     chunk_bytes=self.sections.checkpointing.snapshot_chunk_bytes,
                                     chunk_delay_s=self.sections.checkpointing.snapshot_chunk_delay_s,
                                     producer=producer,
                                     open_transaction_wait_s=open_transaction_wait(self.sections.checkpointing))
        self.checkpointer = Checkpointer(cadence, self.budget, self.partition_slots, self.transactions, self.store,
                                         self.publisher, self.liveness, lambda: self.is_stopping(), self.log)
        self.broker = BrokerProbe(self.client_config, self.topic)
        # Ticks into quiet partitions that hold raised keys (grudge_stream.runtime.ticks).
        self.ticks = IdleTicks(self.topic, self.sections.event_time.idle_tick_s, self.client_config,
                               self.metrics.idle_ticks.labels(topology.operator_id))
        self.waiting = AssignmentWatch(self.sections.group.session_timeout_s, bool(self.instance_id))
        self.partitioner_check = PartitionerCheck(self.sections.serving.key_partitioner, self.topic,
                                                  self.metrics)
        self.signing = SigningKeys.from_settings(self.sections.serving)  # signed members records
        # Live score queries (grudge_stream.serving): answered from a restored slot, or
        # forwarded to the owner the members directory names (``start_members``).
        self.membership = Membership(self.partition_slots, self.sections.serving, bootstrap=self.bootstrap,
                                     app_id=self.app_id,
                                     instance_id=self.instance_id, client_config=self.client_config,
                                     runtime=self.runtime, topic=self.topic, signing=self.signing,
                                     metrics=self.metrics, log=self.log)
        table = topology.overrides
        if table is not None:  # the overrides follower started before the worker: count from here on
            overrides_rejected = self.metrics.entries_rejected.labels("overrides")
            overrides_rejected.inc(table.rejected)
            table.on_reject = overrides_rejected.inc
        self.queries = ScoreQueries.from_settings(self.sections.serving, self.query_slot,
                                                  lambda: self.partition_count, None,
                                                  self.metrics)
        self.queries.partitioner_check = self.partitioner_check

    def renew_producer(self, stuck: bool = False) -> None:
        """Exactly-once: replace a producer fenced for good by a new one under the same
        transactional id, as Kafka Streams does after a ``ProducerFencedException``. It
        happens when the cluster was away longer than ``transaction_timeout_s``: the broker
        aborted the open transaction and bumped the producer's epoch. The old producer's
        unsent records are purged and forgotten; the caller resets the partitions it holds.
        A ``stuck`` producer (a call still blocked inside it) is set aside, never destroyed
        under that call; the new one fences it."""
        producer = self.transactions.renew(stuck)
        self.publisher.drop_unfinished(producer)
        self.store.use_producer(producer)

    # -- the partition slots' state, read-only ----------------------------------------------------

    @property
    def slots(self) -> dict[int, PartitionSlot]:
        """The slots of the partitions held, by partition (``PartitionSlots.slots``)."""
        return self.partition_slots.slots

    @property
    def assigned(self) -> set[int]:
        """The source partitions assigned to this worker (``PartitionSlots.assigned``)."""
        return self.partition_slots.assigned

    @property
    def partition_count(self) -> int | None:
        """The source topic's partition count, once asked (``count``)."""
        return self.partition_slots.partition_count

    # -- the source's partition count and low watermarks, with clients of the core's own -------

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

    # -- assignment and restore (PartitionSlots) --------------------------------------------------

    def count(self) -> int:
        """The source topic's partition count (asked once)."""
        return self.partition_slots.count()

    def restore(self, partition: int) -> RestoreOutcome:
        """Load ``partition``'s newest usable snapshot (blocking: run it in an executor from
        asyncio code)."""
        return self.partition_slots.restore(partition, self.store, self.publisher.dead_letter_limit)

    def adopt(self, partition: int, outcome: RestoreOutcome) -> PartitionSlot:
        """A restored partition becomes a slot; processing starts at its ``next_offset``."""
        slot = self.partition_slots.adopt(partition, outcome)
        slot.key_check = self.partitioner_check
        self.limits.adopted(partition, outcome.operator.next_offset)
        return slot

    def release(self, partitions) -> None:
        """Revoked partitions go: their slots, cached snapshot positions and commit limits."""
        for p in partitions:
            self.partition_slots.release(p)
            self.store.forget(self.topology.operator_id, p)
            self.limits.forget(p)

    def record_assignment(self) -> None:
        """The assignment gauges and the members directory, after any change of either."""
        self.metrics.assigned.set(len(self.assigned))
        self.metrics.restored.set(len([p for p in self.assigned if p in self.slots]))
        self.publish_members()

    # -- checkpoints (Checkpointer) ---------------------------------------------------------------

    def dirty(self, partitions=None) -> list[PartitionSlot]:
        """The slots of ``partitions`` (default: all) with changes since their last snapshot."""
        return self.partition_slots.dirty(partitions)

    def write_snapshots(self, dirty: list[PartitionSlot], taken: list | None = None) -> dict[int, int]:
        """Snapshot ``dirty`` (blocking, ``Checkpointer.write_snapshots``); the offsets the
        snapshots cover, by partition."""
        return self.checkpointer.write_snapshots(dirty, taken)

    def checkpointed(self, offsets: dict[int, int]) -> None:
        """Bookkeeping after a round: commit limits up to the snapshots (never back), the
        cadence restarted."""
        self.limits.raise_to(offsets)
        self.checkpointer.cadence.done()

    def snapshot_round(self) -> None:
        """At-least-once: the due partitions queued for the background (``Checkpointer.round``)."""
        self.checkpointer.round()

    def snapshot_next(self) -> None:
        self.checkpointer.next()

    def background_store(self) -> CheckpointStore:
        return self.checkpointer.background_store()

    def finish_writer(self, wait: bool = False) -> None:
        """Move the background round on (``Checkpointer.finish_writer``)."""
        self.checkpointer.finish_writer(wait)

    def round_failed(self, exc: Exception, background: bool = False) -> None:
        """A periodic round failed: logged, not fatal (``Checkpointer.round_failed``)."""
        self.checkpointer.round_failed(exc, background)

    def checkpoint(self, partitions=None) -> None:
        """One checkpoint round, blocking: snapshots of every changed partition of
        ``partitions``, then their offsets committed (in the transaction, with exactly-once)."""
        if self.checkpointer.no_more_snapshots:
            return
        dirty = self.dirty(partitions)
        txn = self.transactions.transaction
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
        txn = self.transactions.transaction
        if txn is not None:
            txn.begin()

    def process_groups(self, groups: dict[int, Any], records: bool = False) -> None:
        """The one "process, then publish" step of every runtime: each partition's records
        through its slot, under the slot's lock (a live query never reads a batch half
        applied), then its outputs to the publisher. ``groups``: partition -> columns
        (offsets, timestamps, keys, values), or lists of ``SourceRecord`` with ``records``
        (operators that declare ``needs_headers``). A partition without a slot here (not or
        no longer owned) is skipped: its owner processes it from its snapshot position."""
        topic, slots = self.topic, self.partition_slots.slots
        yield_to_queries = self.yield_to_queries
        for p, chunk in groups.items():
            slot = slots.get(p)
            if slot is None:
                continue
            yield_to_queries()
            with slot.lock:
                out = slot.process(chunk) if records else slot.process_columns(topic, *chunk)
            if out:
                self.begin_outputs()
                self.publisher.publish(out)

    # -- health and the snapshot budget (SnapshotBudget) -------------------------------------------

    def replay_report(self) -> dict[int, dict]:
        """Per partition: the replay a restore would need now and the age of its snapshot."""
        return self.budget.replay_report()

    def budget_exceeded(self, report: dict[int, dict]) -> list[int]:
        """The partitions that hold up a restore past 1.5x the budget."""
        return self.budget.budget_exceeded(report)

    def due_snapshots(self, now: float | None = None) -> list[PartitionSlot]:
        """The slots to snapshot now (``SnapshotBudget.due_snapshots``)."""
        return self.budget.due_snapshots(now)

    def record_replay(self) -> None:
        """Once a second from each runtime's loop: the restore-replay gauges, and the members
        record's refresh."""
        now = time.monotonic()
        if now - self._replay_recorded < 1.0:
            return
        self._replay_recorded = now
        # The members record carries the watermarks `grudge-stream alerts` shows: refreshed
        # now and then, and at once when a partition got its first one.
        if self.membership.refresh_due(now):
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
        body["allocator"] = allocator()  # the C allocator (docs/runtime.md, "The allocator")
        return status, body

    @property
    def ready(self) -> bool:
        """Every assigned partition restored, and the cluster answering."""
        return self.ready_status()[0] == 200

    def record_lag(self, log_end: Callable[[int], int | None]) -> None:
        """Consumer lag per partition (``PartitionSlots.record_lag``)."""
        self.partition_slots.record_lag(log_end)

    # -- commits apart from snapshots (CommitLimits, GroupOffsets) ----------------------------------

    def group_committed(self, partitions) -> dict[int, int]:
        """The group's committed offsets of ``partitions`` (blocking, ``GroupOffsets.committed``)."""
        return self.offsets.committed(partitions)

    def group_position(self) -> tuple[int, int] | None:
        """The group's committed offsets and the source's log end offsets, each summed over
        the source's partitions (blocking; ``GroupProgress`` asks it in the background)."""
        return self.offsets.position(self.count())

    def restart_point(self, partition: int, outcome: RestoreOutcome, committed: int | None) -> RestoreOutcome:
        """A restored partition whose group committed offsets but kept no snapshot is rebuilt
        from its earliest retained offset (``commits.restart_point``)."""
        return restart_point(outcome, committed, lambda: self._low_watermark(partition))

    def resume(self, partition: int, outcome: RestoreOutcome, committed: int | None) -> PartitionSlot:
        """``adopt``, then the replay up to the group's committed offset stays silent, and the
        commit limit never falls below that offset (a commit must not move the group back)."""
        slot = self.adopt(partition, outcome)
        slot.suppress_below(committed)
        if committed is not None:
            self.limits.raise_to({partition: committed})
        return slot

    def advance_commit_limits(self) -> None:
        """Runtimes whose consumer commits on its own (Faust): the commit limits move on
        every ``commit_interval_s`` once the outputs before them are delivered — ahead of the
        snapshots, which a restore makes up for by replaying silently to the committed
        offset (``CommitLimits.advance``)."""
        self.limits.advance(self.slots, self.publisher)

    # -- live score queries (Membership) -----------------------------------------------------------

    def query_slot(self, partition: int) -> PartitionSlot | None:
        """The slot of ``partition`` if this worker holds it restored (called from HTTP threads)."""
        return self.partition_slots.query_slot(partition)

    def start_members(self, url: str | None = None) -> None:
        """Start the members directory (blocking: run it in an executor from asyncio code).
        ``url``: where this member answers score queries (default ``advertised_url``)."""
        if self.membership.start(url, self.queries):
            self.publish_members()

    def publish_members(self) -> None:
        self.membership.publish()
