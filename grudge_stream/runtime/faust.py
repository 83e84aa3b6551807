"""The Faust glue: a Faust app whose agent feeds a topology's operators.

Thin on purpose; the work happens in ``grudge_stream.runtime.core`` (partition
slots, restore, the checkpoint cadence and round, commit limits, health and
metrics), ``grudge_stream.partitions`` and the operators. All of Faust's private
API that grudge-stream relies on is in this one module. What it adds to Faust:

- ``CheckpointedConsumer``, a subclass of Faust's aiokafka consumer with two
  changes: after Faust seeks the assigned partitions to their committed
  offsets (``perform_seek``, which runs after every rebalance and before any
  record flows), it waits for each source partition's restore and seeks it to
  the restored snapshot's ``next_offset``; and it commits only offsets that a
  durable snapshot covers, so the committed offset never runs ahead of the
  state. State correctness therefore does not depend on Faust's commits.
- an agent that takes batches of events (``take_events``), groups them by
  partition, runs each partition's operator and publishes its outputs with a
  dedicated confluent-kafka producer (no awaited send per event);
- a checkpoint timer, revocation and shutdown hooks, ``/ready``, ``/live``,
  ``/metrics`` and the live score query pages ``/v1/score`` and ``/v1/scores``
  (``grudge_stream.serving``: read on the event loop between batches); Faust's data
  directory under the state directory (``grudge_stream.statedir``), never the
  working directory.

Exactly-once is refused (``grudge-stream worker`` exits with one line when
``exactly_once=true`` meets this runtime): a transaction must commit the source
offsets with the consuming client's group metadata (``send_offsets_to_transaction``),
and this runtime consumes with aiokafka while its outputs and snapshots go through
confluent-kafka, so no one producer can commit all three together. Exactness here
comes from offset-tagged snapshots and deterministic alert ids (docs/runtime.md).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
import warnings
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import faust
from confluent_kafka import KafkaException
from faust.exceptions import AlreadyConfiguredWarning
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.types import TP
from faust.web import View

from grudge_stream._cyext._ingest import group_records
from grudge_stream.exceptions import (EXIT_FAULT, EXIT_USER_ERROR, CheckpointError, ConfigError, DeliveryError,
                                     GrudgeError, WorkerFault)
from grudge_stream.kafkaconf import faust_options as faust_options_from_settings
from grudge_stream.liveness import RecoveryStall
from grudge_stream.operators.records import SourceRecord
from grudge_stream.runtime.core import WorkerCore
from grudge_stream.serving.http import WorkerHTTP, mount_core
from grudge_stream.settings import setting
from grudge_stream.statedir import app_state_dir
from grudge_stream.topology import Settings, Topology
from grudge_stream.webauth import server_tls

if TYPE_CHECKING:
    from grudge_stream.state import SketchState

log = logging.getLogger("grudge_stream.faust")

MAX_POLL_RECORDS = 20_000
# How often a thread checks that the consumer's group coordination still runs.
COORDINATION_CHECK_S = 2.0
RECOVERY_CHECK_S = 2.0
# A Table recovery of a user's app that reads nothing for this long is stalled (FaustStates).
RECOVERY_STALL_S = 60.0


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
        wait = setting(runtime.settings if runtime is not None else Settings(), "fetch_max_wait_ms")
        consumer._fetch_max_wait_ms = wait  # read by aiokafka when its fetcher starts
        return consumer


class CheckpointedConsumer(AIOKafkaConsumer):
    """Faust's consumer, positioned by snapshots and committing only what they cover."""

    runtime: "FaustRuntime"

    def _new_consumer_thread(self):
        return ShortWaitConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _wait_next_records(self, timeout: float):
        # Every fetch-loop iteration (both drain modes) is progress for /live; it stops
        # while the flow is stopped (a rebalance) or the loop is blocked downstream.
        runtime = getattr(self.app, "grudge_runtime", None)
        if runtime is not None:
            runtime.liveness.beat()
        return await super()._wait_next_records(timeout)

    async def perform_seek(self) -> None:
        await super().perform_seek()
        runtime = getattr(self.app, "grudge_runtime", None)
        if runtime is not None:
            await runtime.position_partitions(self)

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
            source = runtime.topic
            tps.update(TP(source, p) for p in list(runtime.commit_limits))
        return (tp for tp in tps if topics is None or tp in topics or tp.topic in topics)

    async def _drain_messages(self, fetcher) -> None:  # pragma: no cover - exercised via workers
        runtime = getattr(self.app, "grudge_runtime", None)
        if runtime is None or runtime.drain != "batch":
            return await super()._drain_messages(fetcher)
        await self._drain_batches(fetcher, runtime)

    async def _drain_batches(self, fetcher, runtime: "FaustRuntime") -> None:
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
        source = runtime.topology.source_topic
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

    def _filter_committable_offsets(self, tps):
        runtime = getattr(self.app, "grudge_runtime", None)
        limits = runtime.commit_limits if runtime is not None else {}
        source = runtime.topic if runtime is not None else None
        out = {}
        for tp in tps:
            # Faust's ack bookkeeping decides nothing here: drop it so it cannot grow.
            self._acked[tp].clear()
            self._acked_index[tp].clear()
            limit = limits.get(tp.partition) if tp.topic == source else None
            if limit is not None and self._should_commit(tp, limit):
                out[tp] = limit
        return out


class GrudgeApp(faust.App):
    """A Faust app whose transport uses ``CheckpointedConsumer``."""

    def _new_transport(self):
        transport = super()._new_transport()
        transport.Consumer = CheckpointedConsumer
        return transport


def _headers(headers) -> list[tuple[str, bytes]] | None:
    """aiokafka's header tuple (Faust's message may hold a mapping) as a list; None if empty."""
    if not headers:
        return None
    if hasattr(headers, "items"):
        return list(headers.items())
    return list(headers)


class FaustRuntime(WorkerCore):
    """Per-worker state (``WorkerCore``) fed by Faust: restores run in an executor, the
    checkpoint round's writes too, its bookkeeping on the event loop under ``lock``."""

    runtime = "faust"
    log = log

    def __init__(self, app: faust.App, topology: Topology, settings: Settings) -> None:
        self.app = app
        self.drain = setting(settings, "drain")
        if self.drain not in ("batch", "agent"):
            raise ConfigError(f"drain must be 'batch' or 'agent', not {self.drain!r}")
        # The confluent-kafka clients of the core get the security and pass-through client
        # properties (the aiokafka connection gets the same from build_app: broker_credentials).
        super().__init__(topology, settings)
        self.restoring: dict[int, asyncio.Future] = {}
        self.lock = asyncio.Lock()
        self.stopping = False
        # A restore refused for good (ForeignDeployment, PartitionCountChanged): the worker
        # stops without a snapshot and `grudge-stream worker` exits 2 with this one line.
        self.fatal: CheckpointError | WorkerFault | None = None
        self.consumer: Any = None  # the Faust consumer, once it positioned partitions

    # -- core hooks -------------------------------------------------------------------------------

    def is_stopping(self) -> bool:
        return self.stopping

    def _source_partitions(self, tps) -> set[int]:
        return {tp.partition for tp in tps if tp.topic == self.topic}

    # -- assignment -------------------------------------------------------------------------------

    def _start_restore(self, partition: int) -> asyncio.Future:
        fut = self.restoring.get(partition)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self.restoring[partition] = asyncio.ensure_future(
                loop.run_in_executor(None, self.restore, partition))
        return fut

    async def on_assigned(self, sender: Any, assigned: set, **kwargs: Any) -> None:
        parts = self._source_partitions(assigned)
        self.assigned = parts
        self.in_group = True
        self.metrics.assigned.set(len(parts))
        for p in parts:
            if p not in self.slots:
                self._start_restore(p)

    async def position_partitions(self, consumer: CheckpointedConsumer) -> None:
        """Called from perform_seek: restore every assigned source partition, then seek it."""
        self.consumer = consumer
        tps = [tp for tp in consumer.assignment() if tp.topic == self.topic]
        self.assigned = {tp.partition for tp in tps}
        self.metrics.assigned.set(len(tps))
        loop = asyncio.get_running_loop()
        new = [tp.partition for tp in tps if tp.partition not in self.slots]
        # Commits run ahead of snapshots: a restored partition replays silently up to them.
        committed = await loop.run_in_executor(None, self.group_committed, new) if new else {}
        for tp in tps:
            p = tp.partition
            if p not in self.slots:
                self.liveness.beat()  # a rebalance's restores count as progress, per partition
                try:
                    outcome = await self._start_restore(p)
                except CheckpointError as exc:  # another deployment's snapshot, a changed partition count
                    self.stop_fatally(exc)
                    return
                outcome = await loop.run_in_executor(None, self.restart_point, p, outcome, committed.get(p))
                self.liveness.beat()
                self.restoring.pop(p, None)
                self.resume(p, outcome, committed.get(p))
            start = self.slots[p].operator.next_offset
            if start is not None:
                await consumer.seek_from_consumer_thread(tp, start)
        self.record_assignment()

    def stop_fatally(self, exc: CheckpointError | WorkerFault) -> None:
        """One line, no more snapshots (none may cover a state this worker cannot have), and
        a graceful stop of the Faust worker (SIGTERM to ourselves)."""
        if self.fatal is None:
            log.error("%s", exc)
            self.fatal = exc
        self.no_more_snapshots = True
        os.kill(os.getpid(), signal.SIGTERM)

    async def on_revoked(self, sender: Any, revoked: set, **kwargs: Any) -> None:
        parts = self._source_partitions(revoked)
        self.in_group = False
        async with self.lock:
            try:
                await self._checkpoint([p for p in parts if p in self.slots])
            except Exception as exc:  # the partitions go either way; their next owner replays
                log.error("no snapshot on revocation of %s: %s", sorted(parts), exc)
            self.release(parts)
        self.record_assignment()

    # -- processing -------------------------------------------------------------------------------

    async def handle(self, events: list) -> None:
        """Process a batch of Faust events (the ``drain=agent`` path)."""
        async with self.lock:
            by_partition: dict[int, list[SourceRecord]] = defaultdict(list)
            topic = self.topic
            for ev in events:
                m = ev.message
                by_partition[m.partition].append(SourceRecord(
                    topic, m.partition, m.offset, int(round(m.timestamp * 1000)), m.key, m.value,
                    _headers(m.headers)))
            t0 = time.perf_counter()
            with self._processing():
                self.process_groups(by_partition, records=True)
            # Processing time only: a replay also fetches, at about the same cost again.
            self.rate.observe(len(events), 2 * (time.perf_counter() - t0))
            await self._checkpoint_if_due()

    async def handle_records(self, batch: dict[int, list]) -> None:
        """Process fetched aiokafka records, grouped by partition (the batch drain path)."""
        async with self.lock:
            topic = self.topic
            t0 = time.perf_counter()
            count = sum(len(recs) for recs in batch.values())
            with self._processing():
                if self.needs_headers:  # forwarding operators read headers: SourceRecords for them only
                    self.process_groups({p: [SourceRecord(topic, p, r.offset, r.timestamp, r.key, r.value,
                                                          _headers(r.headers)) for r in recs]
                                         for p, recs in batch.items()}, records=True)
                else:
                    self.process_groups(group_records(batch))
            # Processing time only: a replay also fetches, at about the same cost again.
            self.rate.observe(count, 2 * (time.perf_counter() - t0))
            await self._checkpoint_if_due()

    @contextlib.contextmanager
    def _processing(self):
        """An unexpected error while processing leaves state ahead of its outputs: after it
        no snapshot is written (the worker stops; the next owner replays)."""
        try:
            yield
        except Exception:
            self.no_more_snapshots = True
            raise

    async def _checkpoint_if_due(self) -> None:
        """After a batch, under ``lock``: commit limits moved on (``advance_commit_limits``),
        and a periodic round if the cadence says one is due."""
        if self.publisher.has_failures():
            # Refused outputs are re-sent or dead-lettered by a flush (off the loop).
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: self.publisher.flush(should_stop=self.is_stopping))
            except DeliveryError as exc:
                self.round_failed(exc)
        self.advance_commit_limits()
        # Snapshots in the background (WorkerCore.snapshot_round): the partitions whose
        # budget is spent are copied one at a time here, between batches, and written by a
        # SnapshotWriter thread while processing goes on; a failed round is logged, not fatal.
        self.finish_writer()
        self.snapshot_next()
        if self.cadence.due():
            self.snapshot_round()

    async def _checkpoint(self, partitions: list[int]) -> None:
        """On revocation and shutdown: the background round finished first, then
        ``WorkerCore.checkpoint`` with the writes in an executor and the bookkeeping (commit
        limits, which the consumer reads on the loop) on the loop."""
        loop = asyncio.get_running_loop()
        if self.writer is not None:
            await loop.run_in_executor(None, lambda: self.finish_writer(wait=True))
        if self.no_more_snapshots:
            return
        dirty = self.dirty(partitions)
        offsets = {}
        if dirty:
            offsets = await loop.run_in_executor(None, self.write_snapshots, dirty)
        self.checkpointed(offsets)

    def _log_end(self, p: int) -> int | None:
        return self.consumer.highwater(TP(self.topic, p))

    def watch_coordination(self) -> None:
        """End the worker (``EXIT_FAULT``, no snapshot) once the consumer's group
        coordination has ended for good (``watch_coordination``)."""
        def failed(exc: WorkerFault) -> None:
            self.metrics.consumer_fatal.inc()
            self.stop_fatally(exc)

        watch_coordination(self.app, failed, lambda: self.stopping or self.fatal is not None)

    async def checkpoint_tick(self) -> None:
        self.waiting.tick(len(self.assigned))
        self.group_progress.tick(bool(self.assigned))
        if self.consumer is not None:
            self.record_lag(self._log_end)
        self.record_replay()
        self.ticks.check(self.slots)
        if (self.cadence.due() or self.commits.due() or self._pending_limits is not None
                or self.writer is not None or self._snapshot_queue):
            async with self.lock:
                await self._checkpoint_if_due()

    async def on_shutdown(self, sender: Any = None, **kwargs: Any) -> None:
        """Graceful shutdown: a final snapshot of every partition, then flush."""
        self.stopping = True
        log.info("stopping: final snapshots for partitions %s", sorted(self.slots))
        async with self.lock:
            try:
                with self.shutdown_progress("final snapshots"):
                    await self._checkpoint(list(self.slots))
            except Exception as exc:
                log.error("final snapshots not written (%s); the next owner replays from the last snapshot", exc)
                self.no_more_snapshots = True
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, lambda: self.publisher.flush(should_stop=lambda: True))
        except DeliveryError as exc:
            log.error("%s", exc)
        self.store.close()
        self.ticks.close()
        if self.members is not None:
            await loop.run_in_executor(None, self.members.close)
        if not self.no_more_snapshots:
            log.info("final snapshots written for partitions %s", sorted(self.slots))


def build_app(topology: Topology, settings: Settings | None = None, *, create_topics: bool = True,
              partitions: int | None = None, create_source: bool = False, **faust_options: Any) -> faust.App:
    """A Faust app running ``topology``; start it with ``faust.Worker(app).execute_from_commandline()``.

    The start-up rules come first (``grudge_stream.runtime.start``), as for ``grudge-stream
    worker``: the refusals (exactly_once, security aiokafka cannot apply, the web port, the
    group's runtime, another deployment's topics), the topics (``create_topics``; ``partitions``
    and ``create_source`` as in ``grudge-stream topics``) and the overrides follower."""
    from grudge_stream.runtime.start import start_checks

    settings = settings or Settings()
    start_checks(topology, settings, "faust", create_topics=create_topics, partitions=partitions,
                 create_source=create_source)
    replication = setting(settings, "replication_factor")
    if replication == -1:
        # The broker's default, asked here: Faust's topic creation cannot send -1.
        from grudge_stream.kafkaconf import client_config
        from grudge_stream.topics import broker_default_replication, wait_for_cluster

        replication = wait_for_cluster(
            "reading the brokers' default.replication.factor",
            lambda: broker_default_replication(settings.bootstrap_servers, client_config(settings)),
            setting(settings, "broker_wait_s"), settings.bootstrap_servers)
    options: dict[str, Any] = dict(
        broker=f"kafka://{settings.bootstrap_servers}",
        store="memory://",
        topic_replication_factor=replication,
        topic_partitions=setting(settings, "partitions"),
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        broker_commit_interval=setting(settings, "commit_interval_s"),
        web_enabled=setting(settings, "web_enabled"),
        web_host=setting(settings, "web_host"),
        web_port=setting(settings, "web_port"),
        web_bind=setting(settings, "web_host"),
        web_ssl_context=server_tls(settings),
        key_serializer="raw",
        value_serializer="raw",
        producer_max_request_size=2 * 1024 * 1024,
        # Records per getmany(): unbounded, a worker with a backlog holds every fetched
        # record of all its partitions as Python objects at once (peak RSS ~860 MiB over
        # 3 M events on 8 partitions, against ~400 MiB with this cap, at the same rate).
        broker_max_poll_records=MAX_POLL_RECORDS,
        broker_session_timeout=setting(settings, "session_timeout_s"),
        broker_heartbeat_interval=setting(settings, "heartbeat_interval_s"),
    )
    instance_id = setting(settings, "group_instance_id")
    if instance_id:
        # Static membership: a restarted worker reclaims its partitions without a rebalance.
        options["consumer_group_instance_id"] = instance_id
    # SASL / TLS of Faust's own aiokafka clients (consumer, producer, topic creation), from the
    # same settings as the confluent-kafka clients; refuses what aiokafka cannot apply.
    options.update(faust_options_from_settings(settings))
    if "datadir" not in faust_options:
        # Faust creates <datadir>/v1/tables at start; its default is "<app_id>-data" in the cwd.
        options["datadir"] = str(app_state_dir(settings, topology.app_id, temporary_fallback=True))
    options.update(faust_options)
    app = GrudgeApp(topology.app_id, **options)
    runtime = FaustRuntime(app, topology, settings)
    app.grudge_runtime = runtime  # type: ignore[attr-defined]
    source = app.topic(topology.source_topic, key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")
    batch = setting(settings, "batch_size")
    within = setting(settings, "batch_within_s")

    async def process(stream):
        async for events in stream.take_events(batch, within):
            await runtime.handle(events)

    if runtime.drain == "agent":
        app.agent(source, name=f"{topology.name}-operator")(process)
        # The agent's queue holds records fetched after the runtime positioned the
        # partitions: a resume of the running flow must not drop them (the operator would
        # go on past them and skip them when they come back).
        _keep_queued_events_on_resume(app.flow_control)
    else:
        # No agent: the consumer hands fetched batches to the runtime directly; the topic
        # only needs to be part of the subscription.
        app.topics.add(source)
    app.on_partitions_assigned.connect(runtime.on_assigned)
    app.on_partitions_revoked.connect(runtime.on_revoked)
    app.on_before_shutdown.connect(runtime.on_shutdown)
    runtime.watch_coordination()
    # Also moves the commit limits on while no records arrive (commit_interval_s).
    tick_s = max(0.1, min(setting(settings, "commit_interval_s"), topology.checkpoint_interval_s / 2))
    app.timer(tick_s, name=f"{topology.name}-checkpoint")(
        runtime.checkpoint_tick)

    api = WorkerHTTP(runtime)

    def respond(web, answer):
        return web.bytes(answer.body, content_type=answer.content_type, status=answer.status,
                         headers=dict(answer.headers) or None)

    class HealthView(View):
        async def get(self, request):
            return respond(self, api.health(request.path))

    for path in ("/ready", "/live", "/metrics"):
        app.page(path)(type(f"HealthView{path[1:].title()}", (HealthView,), {}))

    async def score_query(web, request):
        """Live score queries (grudge_stream.serving.http): local reads on the loop, between
        batches; forwards from an executor thread."""
        t0 = time.perf_counter()
        peer = getattr(request, "remote", None) or ""
        client, answer = api.admit(request.headers, peer)
        if client is not None:  # the body is read only once the token is checked
            body = await request.read() if request.method == "POST" else b""
            answer = await api.score_on_loop(request.method, request.path, request.query_string, body,
                                             request.headers, peer, client)
        api.answered(answer, t0)
        return respond(web, answer)

    class ScoreView(View):
        async def get(self, request):
            return await score_query(self, request)

        async def post(self, request):
            return await score_query(self, request)

    app.page("/v1/score")(ScoreView)
    app.page("/v1/scores")(type("ScoresView", (ScoreView,), {}))

    @app.task
    async def start_members():
        await asyncio.get_running_loop().run_in_executor(None, runtime.start_members)

    return app


# -- sketch state in a user's own Faust app (grudge_stream.faust) ---------------------------------


def coordination_failure(app: Any) -> str | None:
    """Why the app consumer's group coordination ended for good, or None while it runs.

    aiokafka runs the group membership (joins, heartbeats, assignments) as one task; an
    error it does not expect ends that task (a static member whose rejoin met another
    incarnation's assignment, say), and the consumer goes on fetching nothing, a member in
    name only, for ever. aiokafka's private attributes, read only (pinned by
    tests/unit/test_group_progress.py); a consumer not started yet or closing is None."""
    consumer = getattr(app, "_consumer", None)  # never created here
    inner = getattr(getattr(consumer, "_thread", None), "_consumer", None)
    coordinator = getattr(inner, "_coordinator", None)
    task = getattr(coordinator, "_coordination_task", None)
    closing = getattr(coordinator, "_closing", None)
    if task is None or not task.done() or (closing is not None and closing.done()):
        return None
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return repr(exc) if exc is not None else "it returned"


def watch_coordination(app: Any, failed: Callable[[WorkerFault], None], done: Callable[[], bool],
                       every_s: float = COORDINATION_CHECK_S) -> threading.Thread:
    """A thread that calls ``failed`` once (with one line's worth of reason) when ``app``'s
    consumer group coordination has ended for good (``coordination_failure``), until
    ``done()``. A thread, not a Faust timer: a member in that state may never start them."""
    def watch() -> None:
        while not done():
            time.sleep(every_s)
            failure = coordination_failure(app)
            if failure is not None and not done():
                failed(WorkerFault(
                    f"the consumer's group coordination ended ({failure}): this member can neither hold "
                    f"nor take partitions any more (a static member fenced by another with its "
                    f"group_instance_id, say); ending the worker for a restart, without a snapshot"))
                return

    t = threading.Thread(target=watch, name="grudge-coordination-watch", daemon=True)
    t.start()
    return t


def recovery_progress(app: Any) -> tuple[bool, dict] | None:
    """Faust's Table recovery as it stands: whether it runs, and per changelog partition
    it reads for the app's active tables, ``(offset read, offset to reach)``. None before
    the app has tables, or when read mid-change (the next look gets it). Faust's private
    attributes, read only, from any thread (pinned by tests/unit/test_group_progress.py)."""
    tables = app.__dict__.get("tables")  # never created here
    recovery = getattr(tables, "_recovery", None)
    if recovery is None:
        return None
    try:
        offsets = dict(recovery.active_offsets)
        highwaters = dict(recovery.active_highwaters)
        tps = list(recovery.active_tps)
    except RuntimeError:  # changed size while copied
        return None
    return bool(recovery.in_recovery), {tp: (offsets.get(tp), highwaters.get(tp)) for tp in tps}


def request_rebalance(app: Any) -> bool:
    """Ask the app consumer's group for a rebalance (aiokafka's rejoin, on the consumer's
    own thread); False when the consumer does not run."""
    thread = getattr(getattr(app, "_consumer", None), "_thread", None)
    coordinator = getattr(getattr(thread, "_consumer", None), "_coordinator", None)
    loop = getattr(thread, "thread_loop", None)
    if coordinator is None or loop is None or loop.is_closed():
        return False
    loop.call_soon_threadsafe(coordinator.request_rejoin)
    return True


def watch_recovery(app: Any, stall_s: Callable[[], float], stalled: Callable[[list], None],
                   done: Callable[[], bool], every_s: float = RECOVERY_CHECK_S) -> threading.Thread:
    """A thread that calls ``stalled`` with the partitions of a Table recovery that read
    nothing for ``stall_s()`` seconds (liveness.RecoveryStall), until ``done()``; 0 is off."""
    def watch() -> None:
        stall: RecoveryStall | None = None
        while not done():
            time.sleep(every_s)
            limit = stall_s()
            if not limit:
                stall = None
                continue
            if stall is None or stall.stall_s != limit:
                stall = RecoveryStall(limit)
            seen = recovery_progress(app)
            if seen is None:
                continue
            short = stall.observe(*seen)
            if short and not done():
                stalled(short)

    t = threading.Thread(target=watch, name="grudge-recovery-watch", daemon=True)
    t.start()
    return t


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


class EmbeddedStateConsumer:
    """Mixed into the consumer class of a user's Faust app by ``FaustStates``.

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

    def _grudge_states(self) -> "FaustStates | None":
        return getattr(self.app, "grudge_states", None)  # type: ignore[attr-defined]

    def _new_consumer_thread(self):
        return fetch_requested_partitions(super()._new_consumer_thread())  # type: ignore[misc]

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

    async def perform_seek(self) -> None:
        self._grudge_seeking = True
        try:
            await super().perform_seek()  # type: ignore[misc]
            states = self._grudge_states()
            # A seek while Table recovery reads the changelogs (Faust's fetch loop seeks
            # back when a fetch comes in with the flow stopped) is not the assignment's
            # last: the seek that ends the recovery follows, and restores. Restoring here
            # would hold the fetch loop, which feeds the changelogs to the recovery, for the
            # restores' time.
            if states is not None and not getattr(self.app, "in_recovery", False):  # type: ignore[attr-defined]
                await states.on_positioned(self)
        finally:
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

    def _filter_committable_offsets(self, tps):
        states = self._grudge_states()
        if states is None:
            return super()._filter_committable_offsets(tps)  # type: ignore[misc]
        tps = list(tps)
        out = super()._filter_committable_offsets(tps)  # type: ignore[misc]
        for tp in tps:
            if tp.topic not in states.topics:
                continue
            new = out.pop(tp, None)
            if new is not None and new > states.acked_end.get(tp, -1):
                states.acked_end[tp] = new
            offset = states.committable(tp)
            if offset is not None and self._should_commit(tp, offset):  # type: ignore[attr-defined]
                out[tp] = offset
        return out


class FaustStates:
    """The sketch states attached to one Faust app (``app.grudge_states``): restores on
    assignment, snapshots on a timer, on revocation and at shutdown, commit limits."""

    TICK_S = 0.5

    def __init__(self, app: faust.App) -> None:
        if getattr(app, "_consumer", None) is not None:
            raise RuntimeError("attach sketch states to a Faust app before it starts (its consumer exists)")
        self.app = app
        self.states: dict[str, Any] = {}
        self.topics: set[str] = set()
        # Per source TP: the offset below which every record was acked by every agent
        # (from Faust's commit bookkeeping); snapshots cover it.
        self.acked_end: dict[TP, int] = {}
        self.started = False
        self.lock = asyncio.Lock()
        self.stopping = False
        self.consumer: Any = None
        self.revoked_acks: dict[TP, list[int]] = {}
        self.fatal: str | None = None
        self.exit_status = EXIT_USER_ERROR  # with ``fatal``: what the app's worker exits with
        # Live reads on the app's web server (``serve``), or None.
        self.web: StatesWeb | None = None
        _install_consumer(app)
        _install_worker_exit_status(app, self)
        _keep_queued_events_on_resume(app.flow_control)
        app.on_partitions_revoked.connect(self.on_revoked)
        app.on_before_shutdown.connect(self.on_shutdown)
        app.timer(self.TICK_S, name="grudge-states-checkpoint")(self.tick)
        self._recovery_stall_s = RECOVERY_STALL_S
        finished = lambda: self.stopping or self.fatal is not None  # noqa: E731
        watch_coordination(app, self._coordination_ended, finished)
        watch_recovery(app, lambda: self._recovery_stall_s, self._recovery_stalled, finished)

    @property
    def recovery_stall_s(self) -> float:
        """Seconds a Table recovery of the app may read nothing before its changelog
        partitions are logged and the group is asked for a rebalance (0: never)."""
        return self._recovery_stall_s

    @recovery_stall_s.setter
    def recovery_stall_s(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"recovery_stall_s: a number of seconds >= 0 (0: off), got {value!r}")
        self._recovery_stall_s = float(value)

    def _recovery_stalled(self, short: list) -> None:
        """The app's Table recovery read nothing for ``recovery_stall_s``: say which
        changelog partitions it waits on, and ask for a rebalance, which starts the
        recovery again from what it has read (Faust's restart of a recovery)."""
        for state in list(self.states.values()):
            core = getattr(state, "core", None)
            if core is not None:
                core.metrics.recovery_stalls.inc()
        waits = ", ".join(f"{tp.topic}[{tp.partition}] at {have} of {need}" for tp, (have, need) in short[:8])
        more = f" and {len(short) - 8} more" if len(short) > 8 else ""
        asked = request_rebalance(self.app)
        log.error("the app's Table recovery read nothing for %.0f s; changelog partitions it waits on: %s%s; %s",
                  self._recovery_stall_s, waits, more,
                  "asked the group for a rebalance" if asked else "its consumer does not run: no rebalance asked")

    def _coordination_ended(self, exc: WorkerFault) -> None:
        """The app's consumer is a member in name only: no state snapshots again (none may
        cover what a fenced member did), one line, and the app stops; its worker exits with
        status 3, a fault its orchestrator restarts."""
        for state in list(self.states.values()):
            core = getattr(state, "core", None)
            if core is not None:
                core.no_more_snapshots = True
                core.metrics.consumer_fatal.inc()
        self.exit_status = EXIT_FAULT
        self.fatal = str(exc)
        log.error("%s", self.fatal)
        os.kill(os.getpid(), signal.SIGTERM)

    def add(self, state) -> None:
        if state.name in self.states:
            raise ValueError(f"name: a sketch state named {state.name!r} is already attached to app "
                             f"{self.app.conf.id!r}")
        if self.started:
            raise RuntimeError(f"attach state {state.name!r} before the app starts")
        state.current_position = lambda: _current_position(state)
        state.restore_on_demand = lambda p: self.restore_now(state, p)
        state.app_connection = lambda: _app_connection(self.app)
        state.app_group = self.app.conf.id  # Faust's consumer group
        self.states[state.name] = state
        self.topics.add(state.source_topic)
        if self.web is not None:
            self.web.mount(state)

    def serve(self, **options: Any) -> "StatesWeb":
        """Live reads of every state (attached now or later) on the app's web server (``serve``)."""
        if self.web is not None:
            raise ValueError(f"live reads are already served on app {self.app.conf.id!r}")
        if self.started:
            raise RuntimeError("serve live reads before the app starts")
        self.web = StatesWeb(self, **options)
        for state in self.states.values():
            self.web.mount(state)
        return self.web

    def committable(self, tp: TP) -> int | None:
        """The offset ``tp`` may be committed to: its acked position, clipped to every
        attached state's newest durable snapshot (None: some state has none yet)."""
        acked = self.acked_end.get(tp)
        if acked is None:
            return None
        limit = acked
        for state in self.states.values():
            if state.source_topic == tp.topic:
                own = state.commit_limit(tp.partition)
                if own is None:
                    return None
                limit = min(limit, own)
        return limit

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def on_positioned(self, consumer) -> None:
        """Every assigned source partition restored before a record of it flows."""
        self.consumer = consumer
        if self.fatal is not None:
            return
        if not self.started:
            web = self.web
            if web is not None:
                try:
                    web.start()  # the access rules, checked against the app's final web settings
                except GrudgeError as exc:
                    self.stop_fatally(None, exc, "live reads on the app's web server")
                    return
            for state in self.states.values():
                try:
                    await self._run(state.start)
                    if web is not None:
                        await self._run(web.start_state, state)
                except (GrudgeError, KafkaException) as exc:
                    self.stop_fatally(state, exc)
                    return
            self.started = True
        assignment = consumer.assignment()
        for state in self.states.values():
            held = set(state.partitions())
            new = sorted(tp.partition for tp in assignment
                         if tp.topic == state.source_topic and tp.partition not in held)
            if not new:
                continue
            positions = await self._run(state.assign, new)
            for p in new:
                committed = consumer._committed_offset.get(TP(state.source_topic, p))
                start = positions.get(p)
                if committed is not None and start is not None and committed > start:
                    log.warning("state %s: %s[%d] was committed to %d, past its snapshot's %d: records "
                                "%d..%d were not applied to the state", state.name, state.source_topic,
                                p, committed, start, start, committed - 1)

    def stop_fatally(self, state, exc: BaseException, what: str | None = None) -> None:
        """A state that cannot start (its cluster does not answer, a login fails, a topic
        cannot be made), or live reads that cannot be served under the access rules
        (``what``): one line, no record reaches an agent, and the app stops (SIGTERM to
        itself); its worker exits with status 2."""
        if isinstance(exc, KafkaException) and exc.args and hasattr(exc.args[0], "str"):
            exc = ConfigError(f"Kafka: {' '.join(exc.args[0].str().split())}")
        self.fatal = f"{what or f'state {state.name!r}'} cannot start: {exc}"
        log.error("%s", self.fatal)
        self.app.flow_control.suspend()
        os.kill(os.getpid(), signal.SIGTERM)

    def restore_now(self, state, partition: int) -> None:
        """An event of an assigned partition reached an agent before the rebalance hook
        restored it (Faust can let the first fetch of a worker through before it positions
        the partitions): restore it now, on the loop. Never for a partition the consumer
        does not hold."""
        consumer = self.consumer if self.consumer is not None else self.app.consumer
        if self.fatal is not None or TP(state.source_topic, partition) not in consumer.assignment():
            return
        log.info("state %s: %s[%d] restored on first use", state.name, state.source_topic, partition)
        try:
            state.start()
        except (GrudgeError, KafkaException) as exc:
            self.stop_fatally(state, exc)
            return
        state.assign([partition])

    def _positions(self, state, partitions=None) -> dict[int, int]:
        """Per partition of ``state``, where the app's agents are done (their acks)."""
        consumer = self.consumer
        if consumer is None:
            return {}
        out = {}
        for p in partitions if partitions is not None else state.partitions():
            tp = TP(state.source_topic, p)
            pos = consumer.grudge_acked_position(tp, self.revoked_acks.get(tp, ()))
            if pos is not None:
                out[p] = pos
        return out

    async def _checkpoint(self, state, partitions=None, should_stop=None) -> None:
        core = state.core
        if core is None or core.no_more_snapshots:
            return
        positions = self._positions(state, partitions)
        for p, o in positions.items():
            op = core.slots[p].operator if p in core.slots else None
            if op is not None and (op.next_offset is None or o > op.next_offset):
                op.next_offset = o
        taken = core.take_snapshots(partitions)
        if taken:
            await self._run(state.write_snapshots, taken, should_stop)
        core.cadence.done()
        return positions

    async def tick(self) -> None:
        """Start a checkpoint round in the background if one is due and none runs (a timer
        that waits for the writes would overlap itself)."""
        consumer = getattr(self.app, "_consumer", None)  # never created here
        if consumer is not None and hasattr(consumer, "grudge_release_stale_hold"):
            consumer.grudge_release_stale_hold()
        if not self.started or self.stopping or self.lock.locked():
            return
        if any(s.core is not None and s.core.cadence.due() for s in self.states.values()):
            asyncio.ensure_future(self._round())

    async def _round(self) -> None:
        async with self.lock:
            for state in self.states.values():
                core = state.core
                if core is None or not core.cadence.due():
                    continue
                try:
                    await self._checkpoint(state)
                except (CheckpointError, DeliveryError) as exc:
                    core.round_failed(exc)

    async def on_revoked(self, sender: Any, revoked: set, **kwargs: Any) -> None:
        """Revoked partitions (the agents are done with them by now): snapshotted, committed
        as far as the snapshots cover, then let go."""
        async with self.lock:
            done = []
            for state in self.states.values():
                if state.core is None:
                    continue
                parts = sorted(tp.partition for tp in revoked
                               if tp.topic == state.source_topic and tp.partition in state.core.slots)
                if not parts:
                    continue
                try:
                    done.append((state, parts, await self._checkpoint(state, parts)))
                except Exception as exc:  # the partitions go either way; their next owner replays
                    log.error("state %s: no snapshot on revocation of %s: %s", state.name, parts, exc)
                    done.append((state, parts, {}))
            for state, parts, positions in done:
                try:
                    await self._commit_revoked(state, positions)
                except Exception as exc:  # noqa: BLE001 - the next owner starts from the last commit
                    log.warning("state %s: no commit on revocation of %s: %s", state.name, parts, exc)
            for state, parts, _ in done:
                state.revoke(parts, snapshot=False)
            for tp in revoked:
                self.acked_end.pop(tp, None)
            self.revoked_acks = {}

    async def _commit_revoked(self, state, positions: dict[int, int]) -> None:
        """Commit the revoked partitions as far as every agent got and the snapshots cover:
        Faust itself does not commit on revocation, so without this the next owner's agents
        (a Table's among them) would process again what came after the last timed commit."""
        offsets = {}
        for p, pos in positions.items():
            tp = TP(state.source_topic, p)
            limit = pos
            for other in self.states.values():
                if other.source_topic == state.source_topic:
                    own = other.commit_limit(p)
                    limit = min(limit, own) if own is not None else -1
            if limit >= 0 and (self.consumer._committed_offset.get(tp) or 0) < limit:
                offsets[tp] = limit
        if offsets:
            await self.consumer._commit(offsets)

    async def on_shutdown(self, sender: Any = None, **kwargs: Any) -> None:
        self.stopping = True
        async with self.lock:
            for state in self.states.values():
                if state.core is None:
                    continue
                try:
                    await self._checkpoint(state, should_stop=lambda: True)
                except Exception as exc:
                    log.error("state %s: final snapshots not written (%s); the next owner replays from "
                              "the last snapshot", state.name, exc)
        if self.web is not None:
            await self._run(self.web.close)


# The events an agent hands a state whose reads are served (``update(key, delta)`` in an
# agent) have their record's key checked against the partitioner: those at offsets below
# ``SAMPLE_FIRST`` of each partition, then one offset in 64 (a bit test per event).
SAMPLE_FIRST = 256
SAMPLE_MASK = 63


class StatesWeb:
    """Live reads of a Faust app's states on the app's own web server (``serve``).

    Per state, ``<prefix>/<name>/v1/score`` and ``<prefix>/<name>/v1/scores``: the score
    query API of a worker (``grudge_stream.serving``), whose parsing, access rules,
    routing, forwards and answers are used as they are; this class only mounts them on
    Faust's web server. The key's partition is computed with the state's
    ``key_partitioner`` (Kafka's murmur2 by default, as Faust's own producer places keys);
    a partition this instance does not hold is asked of its owner, found in the members
    directory ``grudge-embedded-<name>-members`` where every instance publishes the
    partitions it holds restored and the URL it answers at (``<canonical_url><prefix>/<name>``),
    and each answer says which instance read it (``served_by``). The keys of the events the
    agents hand a state are sampled to check that partitioner; until a sampled key
    confirmed it, answers carry ``partitioner_check``.
    """

    def __init__(self, states: "FaustStates", *, token_file: str | None = None,
                 key_partitioner: str | None = None, insecure_open: bool = False,
                 prefix: str = "/grudge") -> None:
        from grudge_stream.serving import PARTITIONERS

        if key_partitioner is not None and key_partitioner not in PARTITIONERS:
            raise ConfigError(f"key_partitioner must be one of {PARTITIONERS}, not {key_partitioner!r}")
        if not isinstance(prefix, str) or not prefix.startswith("/") or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a URL path starting with '/', not {prefix!r}")
        self.states = states
        self.app = states.app
        self.token_file = token_file
        self.key_partitioner = key_partitioner
        self.insecure_open = bool(insecure_open)
        self.prefix = prefix.rstrip("/")
        self.access: Any = None
        self.base_url = ""
        self.apis: dict[str, WorkerHTTP] = {}

    def path(self, state: Any) -> str:
        """The state's path on the app's web server (``/v1/score`` and ``/v1/scores`` below it)."""
        from urllib.parse import quote

        return f"{self.prefix}/{quote(state.name, safe='-._~')}"

    def mount(self, state: Any) -> None:
        """The state's two pages on the app's web server (before the app starts, as any page)."""
        base, web = self.path(state), self

        def view(rel: str) -> type:
            async def answer(self: View, request: Any) -> Any:
                return await web.respond(self, state, request, rel)

            return type(f"GrudgeState{rel.rsplit('/', 1)[1].title()}View", (View,), {"get": answer, "post": answer})

        for rel in ("/v1/score", "/v1/scores"):
            self.app.page(base + rel, name=f"grudge-{state.name}-{rel.rsplit('/', 1)[1]}")(view(rel))
        # The keys the agents hand the state are sampled for the partitioner check.
        sample = self.sample
        state.current_position = lambda: _current_position(state, sample)

    def start(self) -> None:
        """The access rules against the app's web settings as the worker runs them (after
        ``faust worker --web-bind/--web-host/--web-port``): without a token file the pages
        answer only on a loopback bind address (``ConfigError`` otherwise)."""
        from grudge_stream.webauth import QueryAccess, is_loopback

        conf = self.app.conf
        first = next(iter(self.states.states.values()), None)
        settings = first.settings if first is not None else Settings()
        token_file = self.token_file or setting(settings, "query_token_file")
        bind = str(conf.web_bind or "0.0.0.0")
        if not token_file and not is_loopback(bind) and not self.insecure_open:
            raise ConfigError(
                f"the app's web server binds {bind} (web_bind): the states' score reads would answer anyone "
                f"who reaches port {conf.web_port} without a token. Give serve(app, token_file=...) (or "
                "GRUDGE_QUERY_TOKEN_FILE: a file of bearer tokens, docs/security.md), bind the web server to a "
                "loopback address (faust worker --web-bind 127.0.0.1), or serve(app, insecure_open=True)")
        overrides = {"web_host": bind, "web_port": str(conf.web_port)}
        if token_file:
            overrides["query_token_file"] = token_file
        if self.insecure_open:
            overrides["insecure_open_queries"] = "true"
        self.access = QueryAccess.from_settings(Settings(overrides, environ=settings.environ))
        self.base_url = str(conf.canonical_url).rstrip("/")
        if not conf.web_enabled:
            log.warning("the app's web server is disabled (web_enabled=False): the states' live reads "
                        "are not served, and no other instance can forward to this one")

    def start_state(self, state: Any) -> None:
        """A started state's queries under these access rules, answering at its URL, and its
        members directory (blocking: run it in an executor). Once per state."""
        if state.name in self.apis or state.core is None:
            return
        core = state.core
        url = self.base_url + self.path(state)
        self.apis[state.name] = mount_core(core, url, self.access, self.key_partitioner)
        log.info("state %s: live reads at %s/v1/score (key_partitioner=%s)", state.name, url,
                 core.queries.partitioner)

    async def respond(self, view: View, state: Any, request: Any, rel: str) -> Any:
        """One request to a state's page: refused without the token before its body is read,
        then answered as a worker answers ``rel`` (local reads on the loop, forwards from an
        executor thread)."""
        from grudge_stream.serving.http import Answer, _json

        t0 = time.perf_counter()
        api = self.apis.get(state.name)
        if api is None or self.access is None:
            answer: Answer = _json(503, {"error": "not_ready", "message": f"state {state.name!r} has not started "
                                         "yet (the app has not joined its group)", "retry_after_s": 1},
                                   {"Retry-After": "1"})
        else:
            peer = getattr(request, "remote", None) or ""
            client, refusal = api.admit(request.headers, peer)
            if client is None:
                answer = refusal
            else:
                body = await request.read() if request.method == "POST" else b""
                answer = await api.score_on_loop(request.method, rel, request.query_string, body,
                                                 request.headers, peer, client)
            api.answered(answer, t0)
        return view.bytes(answer.body, content_type=answer.content_type, status=answer.status,
                          headers=dict(answer.headers) or None)

    def sample(self, state: Any, message: Any) -> None:
        """The record of an event an agent hands ``state``: now and then its key (as
        produced, before Faust's key serializer) checked against the state's partitioner
        (``PartitionerCheck``: its status is in every answer until a key confirmed it)."""
        core, key = state.core, message.key
        if core is not None and core.partition_count and isinstance(key, bytes):
            core.partitioner_check.check(message.partition, core.partition_count, [key])

    def close(self) -> None:
        """Every state's members directory closed (a clean stop: its record withdrawn)."""
        for state in self.states.states.values():
            core = state.core
            if core is not None and core.members is not None:
                core.members.close()
                core.members = None


def _current_position(state, sample: Callable[[Any, Any], None] | None = None) -> tuple[int, int, int]:
    """(partition, offset, timestamp ms) of the Faust event being processed; ``sample``
    (live reads served: ``StatesWeb.sample``) sees its message."""
    event = faust.current_event()
    if event is None:
        raise TypeError(f"state {state.name!r} was called outside a Faust agent's event: pass partition, "
                        "offset and timestamp_ms")
    m = event.message
    if m.topic != state.source_topic:
        raise ValueError(f"state {state.name!r} is bound to topic {state.source_topic!r}, but the event "
                         f"being processed is of {m.topic!r}")
    if sample is not None and (m.offset < SAMPLE_FIRST or not m.offset & SAMPLE_MASK):
        sample(state, m)
    return m.partition, m.offset, int(round(m.timestamp * 1000))


def _keep_queued_events_on_resume(flow_control: Any) -> None:
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


def _app_connection(app: faust.App) -> tuple[str, dict[str, Any], str | None]:
    """The app's own cluster for its states' confluent-kafka clients (read when a state
    starts, so ``faust worker --broker`` and a conf changed after the app was made count)."""
    from grudge_stream.kafkaconf import faust_bootstrap, faust_client_properties

    props, unmapped = faust_client_properties(app)
    return faust_bootstrap(app), props, unmapped


def _install_worker_exit_status(app: faust.App, states: "FaustStates") -> None:
    """The app's worker class (``app.conf.Worker``, what ``app.main()`` and ``faust worker``
    run) exits with status 2 when a state stopped the app (``FaustStates.stop_fatally``) for a
    configuration it cannot work with, and 3 when it stopped it for a fault a restart cures (a
    consumer whose group coordination ended), as a worker of grudge-stream's own does."""
    base = app.conf.Worker
    if getattr(base, "grudge_exit_status", False):
        return

    def execute_from_commandline(self):  # type: ignore[no-untyped-def]
        try:
            base.execute_from_commandline(self)
        except SystemExit:
            if states.fatal is None:
                raise
        if states.fatal is not None:  # said in one line when it happened
            raise SystemExit(states.exit_status)

    worker = type(base.__name__, (base,), {"grudge_exit_status": True,
                                           "execute_from_commandline": execute_from_commandline,
                                           "__module__": base.__module__})
    with warnings.catch_warnings():  # read above, not yet used: nothing holds the old class
        warnings.simplefilter("ignore", AlreadyConfiguredWarning)
        app.conf.Worker = worker


def _install_consumer(app: faust.App) -> None:
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


StateT = TypeVar("StateT", bound="SketchState[Any]")


def _states(app: faust.App) -> FaustStates:
    states = getattr(app, "grudge_states", None)
    if states is None:
        states = app.grudge_states = FaustStates(app)  # type: ignore[attr-defined]
    return states


def attach(app: faust.App, state: StateT) -> StateT:
    """Attach ``state`` (a ``grudge_stream.state.SketchState``) to ``app``; returns it."""
    _states(app).add(state)
    return state


def serve(app: faust.App, *, token_file: str | None = None, key_partitioner: str | None = None,
          insecure_open: bool = False, prefix: str = "/grudge") -> StatesWeb:
    """Serve live reads of ``app``'s states (those attached before or after) on its web
    server: ``GET <prefix>/<state name>/v1/score?key=K`` (and ``/v1/scores``), answered by
    the instance that holds the key's partition (``StatesWeb``; docs/embedding.md).

    ``token_file``: the bearer tokens (``name:token`` lines, re-read when the file changes;
    default the ``GRUDGE_QUERY_TOKEN_FILE`` setting); without one the app refuses to start
    unless its web server binds a loopback address or ``insecure_open`` is set.
    ``key_partitioner``: how the app's producers place keys, ``murmur2`` (Kafka's default,
    Faust's, Java's) or ``crc32`` (librdkafka's default); default each state's setting."""
    return _states(app).serve(token_file=token_file, key_partitioner=key_partitioner,
                              insecure_open=insecure_open, prefix=prefix)
