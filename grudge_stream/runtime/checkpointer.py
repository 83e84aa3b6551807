"""The snapshots of one worker: when they are due, and the background round that writes them.

Parts the worker core (``grudge_stream.runtime.core``) holds:

- ``CheckpointCadence`` owns the time of the last round and says when the next is due
  (also the cadence of commits apart from snapshots, ``grudge_stream.runtime.commits``);
- ``ProcessingRate`` owns the measured records per second a worker processes with a backlog;
- ``SnapshotBudget`` owns the replay budget (``snapshot_replay_budget_s``,
  ``snapshot_max_age_s``) and that rate: which partitions are due (``due_snapshots``) and
  what a restore would replay now (``replay_report``);
- ``SnapshotWriter`` is one background round, run on the checkpointer's ``WriterThread``;
- ``Checkpointer`` owns the snapshot rounds: the cadence, the writer in flight and the
  partitions queued behind it, the store background snapshots go to, the blocking writes
  of a round (``write_snapshots``), and ``no_more_snapshots`` once a round may no longer
  be written; a failed periodic round is logged and retried at the next interval.

The checkpointer reads the slots (``grudge_stream.runtime.slots``) and the open transaction
(``grudge_stream.runtime.transactional``); it commits nothing: the core's round does.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

from grudge_stream.checkpoint import CheckpointStore
from grudge_stream.exceptions import CheckpointError, DeliveryError
from grudge_stream.partitions import PartitionSlot, checkpoint_slots, snapshot_write, snapshots_written

# A failed periodic checkpoint round is logged at most this often.
FAILURE_LOG_INTERVAL_S = 10.0


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


class SnapshotBudget:
    """Which partitions a snapshot is due for, and the replay a restore would need now.

    ``holder.slots``: the worker's slots (``PartitionSlots``), read at each call."""

    def __init__(self, replay_budget_s: float, snapshot_max_age_s: float, holder: Any) -> None:
        # A partition's snapshot is due when a restore would replay more than the budget
        # (docs/checkpoints.md): records since its snapshot at the measured processing rate.
        self.replay_budget_s = replay_budget_s
        self.snapshot_max_age_s = snapshot_max_age_s
        self.rate = ProcessingRate()
        self.holder = holder

    def replay_report(self) -> dict[int, dict]:
        """Per partition: the replay a restore would need now (records, estimated seconds) and
        the age of its snapshot."""
        now = time.monotonic()
        rate = self.rate.per_s
        return {p: {"replay_records": slot.unsnapshotted, "replay_s": round(slot.unsnapshotted / rate, 3),
                    "snapshot_age_s": round(now - slot.last_snapshot_wall, 1)}
                for p, slot in list(self.holder.slots.items())}

    def budget_exceeded(self, report: dict[int, dict]) -> list[int]:
        """The partitions that hold up a restore past 1.5x the budget (snapshots are not
        landing: the snapshot topic refuses writes, say); none while within it."""
        if self.replay_budget_s <= 0 or sum(r["replay_s"] for r in report.values()) <= 1.5 * self.replay_budget_s:
            return []
        return sorted(p for p, r in report.items() if r["replay_records"])

    def due_snapshots(self, now: float | None = None) -> list[PartitionSlot]:
        """The slots to snapshot now. A restore after a crash replays every partition of the
        worker, so the budget holds for their sum: once the records applied since their
        snapshots would take more than ``snapshot_replay_budget_s`` to replay (at the measured
        rate), the partitions that hold most are due, until half the budget is left. A slot
        whose snapshot is ``snapshot_max_age_s`` old is due whatever the budget; an idle one
        never (``snapshot_replay_budget_s`` 0: every changed slot)."""
        now = time.monotonic() if now is None else now
        changed = [s for s in list(self.holder.slots.values()) if s.dirty]
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


class WriterThread:
    """The thread a checkpointer's background rounds run on, one after another: started with
    the first round and kept, idle on its queue in between, so the loop starts a round with a
    queue put instead of a thread's start (1-4 ms of the loop's checkpoint stop, measured at
    400,000 events/s on two cores). A daemon, like the thread of each round it replaces;
    ``close`` ends it once the rounds submitted are done."""

    def __init__(self, name: str = "grudge-snapshot-writer") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, args=(self._jobs,), name=self.name, daemon=True)
            self._thread.start()
        self._jobs.put(job)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            job()  # SnapshotWriter._run: catches everything, reports through its events

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
            self._jobs = queue.SimpleQueue()


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

    def __init__(self, store, slots: list[PartitionSlot], writes: list, mark: int,
                 runner: WriterThread | None = None) -> None:
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
        if runner is not None:
            runner.submit(self._run)
        else:  # a thread of its own
            threading.Thread(target=self._run, name="grudge-snapshot-writer", daemon=True).start()

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


class Checkpointer:
    """The snapshot rounds of one worker (see the module docstring), due by ``cadence``
    (every ``checkpoint_interval_s``).

    ``holder.slots``: the slots; ``txn.transaction``: the open exactly-once transaction,
    or None (both read at each call); ``is_stopping()``: the worker's hook."""

    def __init__(self, cadence: CheckpointCadence, budget: SnapshotBudget, holder: Any, txn: Any,
                 store: CheckpointStore, publisher: Any, liveness: Any,
                 is_stopping: Callable[[], bool], log: logging.Logger) -> None:
        self.cadence = cadence
        self.budget = budget
        self.holder = holder
        self.txn = txn
        self.store = store
        self.publisher = publisher
        self.liveness = liveness
        self.is_stopping = is_stopping
        self.log = log
        # The at-least-once background snapshot in flight, and the due partitions waiting
        # for their copy (one per batch boundary): ``round`` / ``next`` / ``finish_writer``.
        self.writer: SnapshotWriter | None = None
        self.queue: list[int] = []
        self.background: CheckpointStore | None = None
        self.runner = WriterThread()
        # Set when processing died of an unexpected error, or outputs could not be delivered
        # on the way out: no snapshot is written after that (the state may be ahead of its
        # outputs; the next owner replays from the last good one).
        self.no_more_snapshots = False
        self._last_failure_log = 0.0

    def write_snapshots(self, dirty: list[PartitionSlot], taken: list | None = None) -> dict[int, int]:
        """Snapshot ``dirty`` (blocking): outputs flushed first, unless a transaction carries
        them; the offsets the snapshots cover, by partition. ``taken``: the slots' snapshots
        serialized earlier, written as they are."""
        checkpoint_slots(dirty, self.store, None if self.txn.transaction is not None else self.publisher,
                         self.liveness.beating(self.is_stopping), taken=taken)
        return {s.partition: s.snapshotted_offset for s in dirty if s.snapshotted_offset is not None}

    def round(self) -> None:
        """At-least-once: the partitions whose budget is spent are queued; ``next`` copies
        them one at a time at batch boundaries (the loop pauses for one partition's copy, not
        for all of them), each written by a ``SnapshotWriter`` while processing goes on."""
        self.cadence.done()
        if self.no_more_snapshots or self.queue:
            return
        self.queue = [s.partition for s in self.budget.due_snapshots()]
        self.next()

    def next(self) -> None:
        if self.writer is not None or self.no_more_snapshots:
            return
        while self.queue:
            slot = self.holder.slots.get(self.queue.pop(0))
            if slot is not None and slot.dirty:
                self.writer = SnapshotWriter(self.background_store(), [slot], [snapshot_write(slot, deferred=True)],
                                             self.writer_mark(), self.runner)
                return

    def background_store(self) -> CheckpointStore:
        """Where background snapshots are written: the store; with exactly-once its sibling
        with a plain producer of its own (the transactional one serves the loop only)."""
        if self.txn.transaction is None:
            return self.store
        if self.background is None:
            self.background = self.store.sibling()
        return self.background

    def writer_mark(self) -> int:
        """What a background snapshot's manifest waits for, noted at the copy: at-least-once,
        the output stream's position (every output before it delivered); exactly-once, the
        number of committed transactions that includes the one now open (it carries every
        output before the copy)."""
        txn = self.txn.transaction
        if txn is None:
            return self.publisher.mark()  # type: ignore[no-any-return]
        return txn.commits + (1 if txn.open else 0)  # type: ignore[no-any-return]

    def finish_writer(self, wait: bool = False) -> None:
        """Move the background round on: release its manifests once the outputs it covers are
        delivered; its bookkeeping once written. ``wait``: until it is done (revocation,
        shutdown, a new assignment), flushing the outputs first."""
        w = self.writer
        if w is None:
            return
        txn = self.txn.transaction
        publisher = self.publisher
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
                    publisher.flush(should_stop=self.is_stopping)
                except DeliveryError:
                    w.cancelled.set()
                else:
                    w.release.set()
            elif w.chunks_done.is_set():
                if publisher.has_failures():
                    try:
                        publisher.flush(should_stop=self.is_stopping)
                    except DeliveryError:
                        w.cancelled.set()
                if not w.cancelled.is_set() and publisher.delivered_through(w.mark):
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
        slots = self.holder.slots
        live = [(s, r, n) for s, r, n in zip(w.slots, w.refs or [], w.sizes) if slots.get(s.partition) is s]
        if live:
            snapshots_written(*map(list, zip(*live)), time.perf_counter() - w.t0)

    def close(self) -> None:
        """The writer thread ends (after a round in flight, which ``finish_writer(wait=True)``
        has normally seen done)."""
        self.runner.close()

    def round_failed(self, exc: Exception, background: bool = False) -> None:
        """A periodic round failed (a broker outage, say): logged, not fatal; the previous
        snapshot stays current and the next interval tries again. Outputs that could not be
        delivered while the worker stops end the snapshots (they could cover lost outputs).
        A failed transaction ends the worker; a failed ``background`` snapshot never does."""
        if self.txn.transaction is not None and not background:
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
