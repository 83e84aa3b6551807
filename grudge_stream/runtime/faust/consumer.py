"""The Faust and aiokafka consumers of grudge-stream, and every use of their private API.

- ``CheckpointedConsumer`` (the consumer of ``build_app``'s worker, through ``GrudgeApp``):
  after Faust seeks the assigned partitions to their committed offsets
  (``perform_seek``, which runs after every rebalance and before any record flows), it
  waits for each source partition's restore and seeks it to the restored snapshot's
  ``next_offset``; and it commits only offsets that a durable snapshot covers, so the
  committed offset never runs ahead of the state. Its batch drain hands whole fetched
  batches to the runtime. ``ShortWaitConsumerThread`` gives it a configurable fetch wait.
- ``EmbeddedStateConsumer``, mixed into the consumer class of a user's app with attached
  states (``install_state_consumer``): restores after Faust's seek, commits clipped to
  the states' snapshots, and the fetch guard (``fetch_requested_partitions``).
- ``SnapshotCommitsMixin``, what both share: the ``perform_seek`` and
  ``_filter_committable_offsets`` overrides, with a hook for each way they differ.
- small readers of Faust's and aiokafka's private attributes for the watchers
  (``grudge_stream.runtime.faust.watchers``) and the embedded states.

No other module of ``grudge_stream.runtime.faust`` touches Faust's or aiokafka's private
API; tests/unit/test_faust_fetch.py and tests/unit/test_group_progress.py pin what this
module relies on.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.types import TP

from grudge_stream.sections import Group
from grudge_stream.topology import Settings

log = logging.getLogger("grudge_stream.faust")


class ShortWaitConsumerThread(AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread with a configurable fetch wait.

    faust-streaming 0.15.3 hardcodes ``fetch_max_wait_ms=1500``. While records of every
    source partition are buffered (during a checkpoint, say), the next fetch asks only for
    idle partitions, the broker holds it for the full wait, and nothing else is fetched
    meanwhile: a 1.5 s stall after every checkpoint. 100 ms (setting ``fetch_max_wait_ms``)
    cut the alert latency p99 from 1.6 s to 0.3 s in benchmarks/bench_alert_latency.py.
    """

    def _create_worker_consumer(self, transport):
        consumer = super()._create_worker_consumer(transport)
        runtime = getattr(self.app, "grudge_runtime", None)
        wait = (runtime.core.sections.group if runtime is not None else Group.of(Settings())).fetch_max_wait_ms
        consumer._fetch_max_wait_ms = wait  # read by aiokafka when its fetcher starts
        return consumer


class SnapshotConsumerMixin:
    """What both consumers change in Faust's: its two private hooks where snapshots take over.

    - ``perform_seek`` (after every rebalance, before any record flows): Faust's seek to
      the committed offsets, then ``_grudge_positioned`` restores the assigned partitions
      (and, for ``CheckpointedConsumer``, seeks them to their snapshots); the
      ``_grudge_seek_started`` / ``_grudge_seek_ended`` hooks bracket it.
    - ``_filter_committable_offsets`` (each commit): the offset of a partition whose
      commits follow snapshots (``_grudge_follows_snapshots``) is the one
      ``_grudge_commit_offset`` says, committed only if Faust's ``_should_commit`` agrees;
      ``_grudge_faust_committable`` gives Faust's own offsets to start from.

    ``_grudge_owner`` is what keeps the snapshots: the app's ``FaustRuntime`` or
    ``FaustStates``, or None (then nothing is positioned). Mixed in before Faust's
    consumer class.
    """

    def _grudge_owner(self) -> Any:
        raise NotImplementedError

    def _grudge_seek_started(self) -> None:
        """Before Faust's seek (nothing by default)."""

    async def _grudge_positioned(self, owner: Any) -> None:
        """After Faust's seek, with the snapshots' owner (not None)."""
        raise NotImplementedError

    def _grudge_seek_ended(self) -> None:
        """After Faust's seek and ``_grudge_positioned``, however they ended (nothing by default)."""

    async def perform_seek(self) -> None:
        self._grudge_seek_started()
        try:
            await super().perform_seek()  # type: ignore[misc]
            owner = self._grudge_owner()
            if owner is not None:
                await self._grudge_positioned(owner)
        finally:
            self._grudge_seek_ended()

    def _grudge_faust_committable(self, owner: Any, tps: list) -> dict:
        """The offsets Faust itself would commit (from its acks); the commit starts from them."""
        return super()._filter_committable_offsets(tps)  # type: ignore[misc, no-any-return]

    def _grudge_follows_snapshots(self, owner: Any, tp: TP) -> bool:
        raise NotImplementedError

    def _grudge_commit_offset(self, owner: Any, tp: TP, faust_offset: int | None) -> int | None:
        """The offset ``tp`` may be committed to (None: none), given Faust's own offset."""
        raise NotImplementedError

    def _filter_committable_offsets(self, tps):
        owner = self._grudge_owner()
        tps = list(tps)
        out = self._grudge_faust_committable(owner, tps)
        for tp in tps:
            if not self._grudge_follows_snapshots(owner, tp):
                continue
            offset = self._grudge_commit_offset(owner, tp, out.pop(tp, None))
            if offset is not None and self._should_commit(tp, offset):  # type: ignore[attr-defined]
                out[tp] = offset
        return out


class CheckpointedConsumer(SnapshotConsumerMixin, AIOKafkaConsumer):
    """Faust's consumer, positioned by snapshots and committing only what they cover.

    After Faust's seek, the runtime restores every assigned source partition and seeks it
    to its snapshot (``FaustRuntime.position_partitions``). Every commit is the runtime's
    commit limit of a source partition; Faust's acks decide nothing (they are dropped).
    """

    runtime: Any  # the app's FaustRuntime (grudge_stream.runtime.faust.worker)

    def _new_consumer_thread(self):
        return ShortWaitConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _wait_next_records(self, timeout: float):
        # Every fetch-loop iteration (both drain modes) is progress for /live; it stops
        # while the flow is stopped (a rebalance) or the loop is blocked downstream.
        runtime = getattr(self.app, "grudge_runtime", None)
        if runtime is not None:
            runtime.core.liveness.beat()
        return await super()._wait_next_records(timeout)

    def _grudge_owner(self) -> Any:
        return getattr(self.app, "grudge_runtime", None)

    async def _grudge_positioned(self, owner: Any) -> None:
        await owner.position_partitions(self)

    async def seek_from_consumer_thread(self, tp, offset: int) -> None:
        """``seek``, run on the aiokafka consumer's own thread.

        Faust's ``seek`` calls aiokafka from the event loop's thread while the consumer
        thread may be inside ``fetched_records``; the two mutate the fetcher's buffers
        unsynchronised (seen as a fetcher crash, ``KeyError`` in ``fetched_records``,
        when a rebalance's seek met a fetch).
        """
        thread = self._thread
        await thread.call_thread(thread._ensure_consumer().seek, tp, offset)
        self._read_offset[tp] = offset

    def _filter_tps_with_pending_acks(self, topics=None):
        # Commits follow snapshots, not acks: offer every partition with a snapshot offset.
        runtime = getattr(self.app, "grudge_runtime", None)
        tps = set(self._acked)
        if runtime is not None:
            source = runtime.core.topic
            tps.update(TP(source, p) for p in list(runtime.core.limits.limits))
        return (tp for tp in tps if topics is None or tp in topics or tp.topic in topics)

    async def _drain_messages(self, fetcher) -> None:  # pragma: no cover - exercised via workers
        runtime = getattr(self.app, "grudge_runtime", None)
        if runtime is None or runtime.drain != "batch":
            return await super()._drain_messages(fetcher)
        await self._drain_batches(fetcher, runtime)

    async def _drain_batches(self, fetcher, runtime: Any) -> None:
        """The lean drain path: whole fetched batches go straight to the runtime.

        Faust's own drain loop turns every record into a Message, an Event and about
        four asyncio tasks (``wait_first(callback(message), ...)``) before an agent sees
        it. Here one ``getmany`` result — up to thousands of records — is grouped by
        partition and handed over in one call. What Faust provides around the loop is
        kept: fetching only while flow is active (rebalances stop the flow and this
        loop waits in ``_wait_next_records``), the read-offset bookkeeping ``seek``
        relies on, and commits (which this consumer bases on snapshots, not on acks).

        A batch is never dropped without a seek back: records it held would be skipped
        for good (the operator takes the next batch as the continuation). A batch that
        arrives after a rebalance, under the new generation, is the continuation of the
        positions that rebalance set, and is processed. One that is still waiting for the
        runtime's lock when a rebalance runs is consistent too: the revocation snapshots
        exactly the records before it, and a partition moved elsewhere has no slot here.
        """
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        source = runtime.core.topology.source_topic
        set_read_offset = self._read_offset.__setitem__
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                records, active = await self._wait_next_records(1.0)
                if not records or self.should_stop:
                    continue
                if not self.flow_active:
                    # A rebalance began after this fetch: drop it, as Faust does, and seek
                    # back; the assignment that follows re-positions every partition.
                    try:
                        await self.perform_seek()
                    except Exception as exc:  # the assignment in progress seeks again
                        log.warning("seek back after a dropped batch failed: %s", exc)
                    continue
                batch = {}
                for tp, recs in records.items():
                    if tp.topic != source or (active is not None and tp not in active):
                        continue
                    batch[tp.partition] = recs
                    set_read_offset(tp, recs[-1].offset)
                if batch:
                    await runtime.handle_records(batch)
                await asyncio.sleep(0)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise

    def _grudge_faust_committable(self, owner: Any, tps: list) -> dict:
        return {}  # Faust's offsets are not asked for: its acks decide nothing here

    def _grudge_follows_snapshots(self, owner: Any, tp: TP) -> bool:
        return True  # every partition offered: its acks are dropped below

    def _grudge_commit_offset(self, owner: Any, tp: TP, faust_offset: int | None) -> int | None:
        # Faust's ack bookkeeping decides nothing here: drop it so it cannot grow.
        self._acked[tp].clear()
        self._acked_index[tp].clear()
        if owner is None or tp.topic != owner.core.topic:
            return None
        return owner.core.limits.limits.get(tp.partition)  # type: ignore[no-any-return]


class GrudgeApp(faust.App):
    """A Faust app whose transport uses ``CheckpointedConsumer``."""

    def _new_transport(self):
        transport = super()._new_transport()
        transport.Consumer = CheckpointedConsumer
        return transport


def requested_partitions(active: Any) -> frozenset | None:
    """What a fetch may return records of: the partitions Faust consumes at the moment it
    asks (a copy), or None for "nothing, do not ask".

    Faust hands aiokafka its live set of active partitions, which rebalances and
    recoveries change while the fetch waits, and aiokafka reads an empty set as every
    partition. A fetch that began with the changelogs active and ended after Faust paused
    them returned the records aiokafka had prefetched for paused source partitions; Faust
    drops records of partitions it does not consume, and the consumer's position had
    moved past them: those records never reached an agent until the next rebalance."""
    if active is None:
        return None
    copy = frozenset(active)
    return copy if copy else None


def fetch_requested_partitions(thread: Any) -> Any:
    """Make ``thread`` (Faust's aiokafka consumer thread of an app with embedded state)
    fetch records of the partitions active when a fetch asks, and nothing when none is
    (``requested_partitions``); returns it. Its own fetch stays the one that runs."""
    fetch = thread._fetch_records

    async def fetch_requested(consumer, active_partitions, timeout=None, max_records=None):
        if active_partitions is not None:
            active_partitions = requested_partitions(active_partitions)
            if active_partitions is None:
                return {}
        return await fetch(consumer, active_partitions, timeout=timeout, max_records=max_records)

    fetch_requested.grudge_requested_partitions = True  # type: ignore[attr-defined]
    thread._fetch_records = fetch_requested
    return thread


class EmbeddedStateConsumer(SnapshotConsumerMixin):
    """Mixed into the consumer class of a user's Faust app by ``FaustStates``
    (``install_state_consumer``); its seek and commit hooks are those of
    ``SnapshotConsumerMixin``, with the app's ``FaustStates`` as the snapshots' owner.

    Two changes, for the source topics of attached states only (every other topic of the
    app is consumed and committed exactly as Faust does it):

    - after Faust positions the assigned partitions (``perform_seek``, after every
      rebalance and before any record flows) every state restores its new partitions
      from their snapshots. Nothing is re-positioned: the app's other agents read the
      topic too; records below a snapshot's offset are skipped by the state alone.
    - a commit never passes a state's newest durable snapshot: Faust's offset (its acks)
      is clipped to the state's commit limit, so after a crash every record the restored
      state lacks is delivered again. Faust's own gap check runs against the acked
      position this consumer keeps, since the committed offset now trails it.

    Its fetches ask for the partitions active when they ask,
    so a record of a source partition held for a restore is never fetched and dropped
    (``fetch_requested_partitions``).
    """

    def _grudge_states(self) -> Any:
        """The app's ``FaustStates`` (grudge_stream.runtime.faust.states), or None."""
        return getattr(self.app, "grudge_states", None)  # type: ignore[attr-defined]

    def _new_consumer_thread(self):
        return fetch_requested_partitions(super()._new_consumer_thread())  # type: ignore[misc]

    def grudge_committed_offset(self, tp) -> int | None:
        """The offset Faust last committed for ``tp`` (None: not known yet)."""
        return self._committed_offset.get(tp)  # type: ignore[attr-defined, no-any-return]

    async def grudge_commit(self, offsets: dict) -> None:
        """Commit ``offsets`` (per TP) now, as Faust's own commit does."""
        await self._commit(offsets)  # type: ignore[attr-defined]

    def grudge_acked_position(self, tp, extra=()) -> int | None:
        """The offset below which every record of ``tp`` is acked by every agent, read from
        Faust's ack list without consuming it (None: not known yet)."""
        states = self._grudge_states()
        start = states.acked_end.get(tp) if states is not None else None
        if start is None:
            start = self._committed_offset.get(tp)  # type: ignore[attr-defined]
        if start is None:
            return None
        for offset in sorted({*self._acked.get(tp, ()), *extra}):  # type: ignore[attr-defined]
            if offset == start:
                start += 1
            elif offset > start:
                break
        return start

    def ack(self, message) -> bool:
        """Faust's ack, except for a state's source topic while a rebalance runs or for a
        message fetched before the last one: Faust's streams skip those unprocessed and
        ack them anyway (so its lag does not grow), but no agent applied them to the
        state, so they must not move the acked position a snapshot covers. Such a
        message is fetched again after the rebalance and acked then."""
        states = self._grudge_states()
        if states is not None and message.topic in states.topics:
            app = self.app  # type: ignore[attr-defined]
            generation = getattr(message, "generation_id", None)
            if not app.flow_control.is_active() or (
                    generation is not None and generation != app.consumer_generation_id):
                message.acked = True
                self._unacked_messages.discard(message)  # type: ignore[attr-defined]
                return False
        return super().ack(message)  # type: ignore[misc]

    def resume_partitions(self, tps) -> None:
        """Faust resumes the assigned source partitions just before it seeks them to their
        committed offsets, at the end of a rebalance (its recovery's last step): records
        fetched in between reach the agents, and the seek delivers them again, so every
        agent on the topic (a Table's among them) would count them twice. A state's source
        partitions are resumed once that seek is done instead (``perform_seek``)."""
        states = self._grudge_states()
        tps = set(tps)
        if states is not None:
            held = {tp for tp in tps if tp.topic in states.topics}
            if held:
                self._grudge_held = getattr(self, "_grudge_held", set()) | held
                tps -= held
        super().resume_partitions(tps)  # type: ignore[misc]

    def _grudge_release_held(self) -> None:
        held = getattr(self, "_grudge_held", None)
        if held:
            self._grudge_held = set()
            super().resume_partitions(held)  # type: ignore[misc]

    def grudge_release_stale_hold(self, after_s: float = 2.0) -> None:
        """Resume held source partitions no seek released within ``after_s`` (a seek that
        never came or was cancelled): they must never stay paused (FaustStates.tick)."""
        if getattr(self, "_grudge_seeking", False) or not getattr(self, "_grudge_held", None):
            self._grudge_held_since = None
            return
        since = getattr(self, "_grudge_held_since", None)
        now = time.monotonic()
        if since is None:
            self._grudge_held_since = now
        elif now - since >= after_s:
            self._grudge_held_since = None
            log.warning("source partitions %s were held for a seek that did not come; resumed",
                        sorted(f"{tp.topic}[{tp.partition}]" for tp in self._grudge_held))
            self._grudge_release_held()

    async def on_partitions_revoked(self, revoked) -> None:
        self._grudge_held = set()  # a new rebalance pauses and resumes everything again
        # Faust drops the revoked partitions' acks before the app's revocation handlers run:
        # keep them for the revocation snapshot and commit (FaustStates.on_revoked).
        states = self._grudge_states()
        if states is not None:
            states.revoked_acks = {tp: list(self._acked.get(tp, ()))  # type: ignore[attr-defined]
                                   for tp in revoked if tp.topic in states.topics}
        await super().on_partitions_revoked(revoked)  # type: ignore[misc]

    def _grudge_owner(self) -> Any:
        return self._grudge_states()

    def _grudge_seek_started(self) -> None:
        self._grudge_seeking = True

    async def _grudge_positioned(self, owner: Any) -> None:
        # A seek while Table recovery reads the changelogs (Faust's fetch loop seeks
        # back when a fetch comes in with the flow stopped) is not the assignment's
        # last: the seek that ends the recovery follows, and restores. Restoring here
        # would hold the fetch loop, which feeds the changelogs to the recovery, for the
        # restores' time.
        if not getattr(self.app, "in_recovery", False):  # type: ignore[attr-defined]
            await owner.on_positioned(self)

    def _grudge_seek_ended(self) -> None:
        self._grudge_seeking = False
        self._grudge_release_held()  # the source partitions flow once restored

    def _new_offset(self, tp):
        states = self._grudge_states()
        if states is None or tp.topic not in states.topics:
            return super()._new_offset(tp)  # type: ignore[misc]
        committed = self._committed_offset  # type: ignore[attr-defined]
        saved = committed[tp]
        acked = states.acked_end.get(tp)
        base = acked if acked is not None else saved
        acks = self._acked.get(tp)  # type: ignore[attr-defined]
        if acks and base is not None:
            # Faust's check lets the offset at the committed position itself be missing
            # (``min(acked) - committed > 1``): with 11, 12 acked and 10 not, it would move
            # to 13, and a snapshot would claim record 10, which no agent had finished.
            # The acks must start at the position (or a gap Faust recorded there).
            first = min(acks)
            gaps = self._gap.get(tp)  # type: ignore[attr-defined]
            if gaps:
                first = min([first, *(iv.begin for iv in gaps.overlap(0, max(acks) + 1))])
            if first > base:
                return None
        if acked is not None:
            committed[tp] = acked
        try:
            return super()._new_offset(tp)  # type: ignore[misc]
        finally:
            committed[tp] = saved

    # Commits: Faust's own offsets (its acks), except for the states' source topics.

    def _grudge_follows_snapshots(self, owner: Any, tp: TP) -> bool:
        return owner is not None and tp.topic in owner.topics

    def _grudge_commit_offset(self, owner: Any, tp: TP, faust_offset: int | None) -> int | None:
        # Faust's offset moves the acked position on; the commit is clipped to the snapshots.
        if faust_offset is not None and faust_offset > owner.acked_end.get(tp, -1):
            owner.acked_end[tp] = faust_offset
        return owner.committable(tp)  # type: ignore[no-any-return]


def keep_queued_events_on_resume(flow_control: Any) -> None:
    """Make ``flow_control.resume()`` of a flow that is not suspended drop nothing.

    Faust's resume clears every agent's queue, whatever the flow's state. Table recovery
    resumes an already running flow after it seeks the source partitions, so events
    fetched after that seek and still queued are dropped unacked. Faust fetches them
    again only at the next rebalance (its commits stop before the first of them), but an
    agent has meanwhile gone on with the records after them: a state updated by that
    agent would skip the dropped records for good (below its offset when they come
    back). Kept, they reach the agents in offset order, some of them twice (the seek
    fetches them again), which a state skips and which is Faust's at-least-once for
    everything else. A real suspension (a rebalance, a stop) still clears the queues
    when it resumes."""
    if getattr(flow_control, "grudge_keeps_queues", False):
        return
    clearing_resume = flow_control.resume

    def resume() -> None:
        if flow_control.is_active():
            flow_control._resume.set()
            return
        clearing_resume()

    flow_control.resume = resume
    flow_control.grudge_keeps_queues = True


def install_state_consumer(app: faust.App) -> None:
    """Make the app's transport build consumers with ``EmbeddedStateConsumer`` mixed in."""

    def mixed(transport):
        base = transport.Consumer
        if not issubclass(base, EmbeddedStateConsumer):
            transport.Consumer = type(f"Grudge{base.__name__}", (EmbeddedStateConsumer, base), {})
        return transport

    if getattr(app, "_transport", None) is not None:
        mixed(app._transport)
        return
    new_transport = app._new_transport
    app._new_transport = lambda: mixed(new_transport())  # type: ignore[method-assign]


# -- Faust's and aiokafka's private attributes, read (never set) for the watchers and the states --


def app_consumer(app: Any) -> Any:
    """The app's consumer if it has been created, else None (``app.consumer`` would create it)."""
    return getattr(app, "_consumer", None)


def group_coordinator(app: Any) -> tuple[Any, Any]:
    """aiokafka's group coordinator of the app's consumer and the event loop of the consumer's
    thread (``(None, None)`` before the consumer runs; either may be None while it starts)."""
    thread = getattr(app_consumer(app), "_thread", None)
    coordinator = getattr(getattr(thread, "_consumer", None), "_coordinator", None)
    return coordinator, getattr(thread, "thread_loop", None)


def coordination_task(coordinator: Any) -> tuple[Any, Any]:
    """The coordinator's task that runs the group membership, and its closing future (None if absent)."""
    return getattr(coordinator, "_coordination_task", None), getattr(coordinator, "_closing", None)


def table_recovery(app: Any) -> Any:
    """Faust's Table recovery of the app, or None before the app has tables (none made here)."""
    tables = app.__dict__.get("tables")  # never created here
    return getattr(tables, "_recovery", None)
