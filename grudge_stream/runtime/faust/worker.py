"""The Faust worker runtime: ``build_app`` and ``FaustRuntime``, a Faust app whose agent
(or batch drain) feeds a topology's operators.

Thin on purpose; the work happens in ``grudge_stream.runtime.core`` (partition
slots, restore, the checkpoint cadence and round, commit limits, health and
metrics), ``grudge_stream.partitions`` and the operators. What it adds to Faust:

- ``CheckpointedConsumer`` (``grudge_stream.runtime.faust.consumer``), which positions
  the source partitions by snapshots and commits only what they cover; state
  correctness therefore does not depend on Faust's commits.
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
import time
from collections import defaultdict
from typing import Any

import faust
from faust.types import TP
from faust.web import View

from grudge_stream._cyext._ingest import group_records
from grudge_stream.exceptions import CheckpointError, ConfigError, DeliveryError, WorkerFault
from grudge_stream.kafkaconf import faust_options as faust_options_from_settings
from grudge_stream.operators.records import SourceRecord
from grudge_stream.runtime.core import WorkerCore
from grudge_stream.runtime.faust.consumer import CheckpointedConsumer, GrudgeApp, keep_queued_events_on_resume
from grudge_stream.runtime.faust.watchers import watch_coordination
from grudge_stream.serving.http import WorkerHTTP
from grudge_stream.sections import Group, sections
from grudge_stream.statedir import app_state_dir
from grudge_stream.topology import Settings, Topology
from grudge_stream.webauth import server_tls

log = logging.getLogger("grudge_stream.faust")

MAX_POLL_RECORDS = 20_000


def _headers(headers) -> list[tuple[str, bytes]] | None:
    """aiokafka's header tuple (Faust's message may hold a mapping) as a list; None if empty."""
    if not headers:
        return None
    if hasattr(headers, "items"):
        return list(headers.items())
    return list(headers)


class FaustRuntime:
    """The Faust runtime: it holds the worker's ``WorkerCore`` (``core``) and feeds it from
    Faust: restores run in an executor, the checkpoint round's writes too, its bookkeeping
    on the event loop under ``lock``."""

    def __init__(self, app: faust.App, topology: Topology, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.drain = Group.of(settings).drain
        if self.drain not in ("batch", "agent"):
            raise ConfigError(f"drain must be 'batch' or 'agent', not {self.drain!r}")
        # The confluent-kafka clients of the core get the security and pass-through client
        # properties (the aiokafka connection gets the same from build_app: broker_credentials).
        self.core = WorkerCore(topology, settings, runtime="faust", log=log, is_stopping=self.is_stopping)
        self.restoring: dict[int, asyncio.Future] = {}
        self.lock = asyncio.Lock()
        self.stopping = False
        # A restore refused for good (ForeignDeployment, PartitionCountChanged): the worker
        # stops without a snapshot and `grudge-stream worker` exits 2 with this one line.
        self.fatal: CheckpointError | WorkerFault | None = None
        self.consumer: Any = None  # the Faust consumer, once it positioned partitions

    # -- the core's hook --------------------------------------------------------------------------

    def is_stopping(self) -> bool:
        return self.stopping

    def _source_partitions(self, tps) -> set[int]:
        return {tp.partition for tp in tps if tp.topic == self.core.topic}

    # -- assignment -------------------------------------------------------------------------------

    def _start_restore(self, partition: int) -> asyncio.Future:
        fut = self.restoring.get(partition)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self.restoring[partition] = asyncio.ensure_future(
                loop.run_in_executor(None, self.core.restore, partition))
        return fut

    async def on_assigned(self, sender: Any, assigned: set, **kwargs: Any) -> None:
        parts = self._source_partitions(assigned)
        self.core.partition_slots.assigned = parts
        self.core.in_group = True
        self.core.metrics.assigned.set(len(parts))
        for p in parts:
            if p not in self.core.slots:
                self._start_restore(p)

    async def position_partitions(self, consumer: CheckpointedConsumer) -> None:
        """Called from perform_seek: restore every assigned source partition, then seek it."""
        self.consumer = consumer
        tps = [tp for tp in consumer.assignment() if tp.topic == self.core.topic]
        self.core.partition_slots.assigned = {tp.partition for tp in tps}
        self.core.metrics.assigned.set(len(tps))
        loop = asyncio.get_running_loop()
        new = [tp.partition for tp in tps if tp.partition not in self.core.slots]
        # Commits run ahead of snapshots: a restored partition replays silently up to them.
        committed = await loop.run_in_executor(None, self.core.group_committed, new) if new else {}
        for tp in tps:
            p = tp.partition
            if p not in self.core.slots:
                self.core.liveness.beat()  # a rebalance's restores count as progress, per partition
                try:
                    outcome = await self._start_restore(p)
                except CheckpointError as exc:  # another deployment's snapshot, a changed partition count
                    self.stop_fatally(exc)
                    return
                outcome = await loop.run_in_executor(None, self.core.restart_point, p, outcome, committed.get(p))
                self.core.liveness.beat()
                self.restoring.pop(p, None)
                self.core.resume(p, outcome, committed.get(p))
            start = self.core.slots[p].operator.next_offset
            if start is not None:
                await consumer.seek_from_consumer_thread(tp, start)
        self.core.record_assignment()

    def stop_fatally(self, exc: CheckpointError | WorkerFault) -> None:
        """One line, no more snapshots (none may cover a state this worker cannot have), and
        a graceful stop of the Faust worker (SIGTERM to ourselves)."""
        if self.fatal is None:
            log.error("%s", exc)
            self.fatal = exc
        self.core.checkpointer.no_more_snapshots = True
        os.kill(os.getpid(), signal.SIGTERM)

    async def on_revoked(self, sender: Any, revoked: set, **kwargs: Any) -> None:
        parts = self._source_partitions(revoked)
        self.core.in_group = False
        async with self.lock:
            try:
                await self._checkpoint([p for p in parts if p in self.core.slots])
            except Exception as exc:  # the partitions go either way; their next owner replays
                log.error("no snapshot on revocation of %s: %s", sorted(parts), exc)
            self.core.release(parts)
        self.core.record_assignment()

    # -- processing -------------------------------------------------------------------------------

    async def handle(self, events: list) -> None:
        """Process a batch of Faust events (the ``drain=agent`` path)."""
        async with self.lock:
            by_partition: dict[int, list[SourceRecord]] = defaultdict(list)
            core = self.core
            topic = core.topic
            for ev in events:
                m = ev.message
                by_partition[m.partition].append(SourceRecord(
                    topic, m.partition, m.offset, int(round(m.timestamp * 1000)), m.key, m.value,
                    _headers(m.headers)))
            t0 = time.perf_counter()
            with self._processing():
                core.process_groups(by_partition, records=True)
            # Processing time only: a replay also fetches, at about the same cost again.
            core.budget.rate.observe(len(events), 2 * (time.perf_counter() - t0))
            await self._checkpoint_if_due()

    async def handle_records(self, batch: dict[int, list]) -> None:
        """Process fetched aiokafka records, grouped by partition (the batch drain path)."""
        async with self.lock:
            core = self.core
            topic = core.topic
            t0 = time.perf_counter()
            count = sum(len(recs) for recs in batch.values())
            with self._processing():
                if core.needs_headers:  # forwarding operators read headers: SourceRecords for them only
                    core.process_groups({p: [SourceRecord(topic, p, r.offset, r.timestamp, r.key, r.value,
                                                          _headers(r.headers)) for r in recs]
                                         for p, recs in batch.items()}, records=True)
                else:
                    core.process_groups(group_records(batch))
            # Processing time only: a replay also fetches, at about the same cost again.
            core.budget.rate.observe(count, 2 * (time.perf_counter() - t0))
            await self._checkpoint_if_due()

    @contextlib.contextmanager
    def _processing(self):
        """An unexpected error while processing leaves state ahead of its outputs: after it
        no snapshot is written (the worker stops; the next owner replays)."""
        try:
            yield
        except Exception:
            self.core.checkpointer.no_more_snapshots = True
            raise

    async def _checkpoint_if_due(self) -> None:
        """After a batch, under ``lock``: commit limits moved on (``advance_commit_limits``),
        and a periodic round if the cadence says one is due."""
        core = self.core
        if core.publisher.has_failures():
            # Refused outputs are re-sent or dead-lettered by a flush (off the loop).
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: core.publisher.flush(should_stop=self.is_stopping))
            except DeliveryError as exc:
                core.round_failed(exc)
        core.advance_commit_limits()
        # Snapshots in the background (WorkerCore.snapshot_round): the partitions whose
        # budget is spent are copied one at a time here, between batches, and written by a
        # SnapshotWriter thread while processing goes on; a failed round is logged, not fatal.
        core.finish_writer()
        core.snapshot_next()
        if core.checkpointer.cadence.due():
            core.snapshot_round()

    async def _checkpoint(self, partitions: list[int]) -> None:
        """On revocation and shutdown: the background round finished first, then
        ``WorkerCore.checkpoint`` with the writes in an executor and the bookkeeping (commit
        limits, which the consumer reads on the loop) on the loop."""
        loop = asyncio.get_running_loop()
        if self.core.checkpointer.writer is not None:
            await loop.run_in_executor(None, lambda: self.core.finish_writer(wait=True))
        if self.core.checkpointer.no_more_snapshots:
            return
        dirty = self.core.dirty(partitions)
        offsets = {}
        if dirty:
            offsets = await loop.run_in_executor(None, self.core.write_snapshots, dirty)
        self.core.checkpointed(offsets)

    def _log_end(self, p: int) -> int | None:
        return self.consumer.highwater(TP(self.core.topic, p))

    def watch_coordination(self) -> None:
        """End the worker (``EXIT_FAULT``, no snapshot) once the consumer's group
        coordination has ended for good (``watch_coordination``)."""
        def failed(exc: WorkerFault) -> None:
            self.core.metrics.consumer_fatal.inc()
            self.stop_fatally(exc)

        watch_coordination(self.app, failed, lambda: self.stopping or self.fatal is not None)

    async def checkpoint_tick(self) -> None:
        core = self.core
        core.waiting.tick(len(core.assigned))
        core.group_progress.tick(bool(core.assigned))
        if self.consumer is not None:
            core.record_lag(self._log_end)
        core.record_replay()
        core.ticks.check(core.slots)
        checkpointer, limits = core.checkpointer, core.limits
        if (checkpointer.cadence.due() or limits.cadence.due() or limits.pending is not None
                or checkpointer.writer is not None or checkpointer.queue):
            async with self.lock:
                await self._checkpoint_if_due()

    async def on_shutdown(self, sender: Any = None, **kwargs: Any) -> None:
        """Graceful shutdown: a final snapshot of every partition, then flush."""
        self.stopping = True
        log.info("stopping: final snapshots for partitions %s", sorted(self.core.slots))
        async with self.lock:
            try:
                with self.core.shutdown_progress("final snapshots"):
                    await self._checkpoint(list(self.core.slots))
            except Exception as exc:
                log.error("final snapshots not written (%s); the next owner replays from the last snapshot", exc)
                self.core.checkpointer.no_more_snapshots = True
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, lambda: self.core.publisher.flush(should_stop=lambda: True))
        except DeliveryError as exc:
            log.error("%s", exc)
        self.core.store.close()
        self.core.ticks.close()
        self.core.checkpointer.close()
        if self.core.membership.directory is not None:
            await loop.run_in_executor(None, self.core.membership.directory.close)
        if not self.core.checkpointer.no_more_snapshots:
            log.info("final snapshots written for partitions %s", sorted(self.core.slots))


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
    cfg = sections(settings)
    replication = cfg.identity.replication_factor
    if replication == -1:
        # The broker's default, asked here: Faust's topic creation cannot send -1.
        from grudge_stream.kafkaconf import client_config
        from grudge_stream.topics import broker_default_replication, wait_for_cluster

        replication = wait_for_cluster(
            "reading the brokers' default.replication.factor",
            lambda: broker_default_replication(settings.bootstrap_servers, client_config(settings)),
            cfg.kafka.broker_wait_s, settings.bootstrap_servers)
    options: dict[str, Any] = dict(
        broker=f"kafka://{settings.bootstrap_servers}",
        store="memory://",
        topic_replication_factor=replication,
        topic_partitions=cfg.identity.partitions,
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        broker_commit_interval=cfg.group.commit_interval_s,
        web_enabled=cfg.serving.web_enabled,
        web_host=cfg.serving.web_host,
        web_port=cfg.serving.web_port,
        web_bind=cfg.serving.web_host,
        web_ssl_context=server_tls(cfg.serving),
        key_serializer="raw",
        value_serializer="raw",
        producer_max_request_size=2 * 1024 * 1024,
        # Records per getmany(): unbounded, a worker with a backlog holds every fetched
        # record of all its partitions as Python objects at once (peak RSS ~860 MiB over
        # 3 M events on 8 partitions, against ~400 MiB with this cap, at the same rate).
        broker_max_poll_records=MAX_POLL_RECORDS,
        broker_session_timeout=cfg.group.session_timeout_s,
        broker_heartbeat_interval=cfg.group.heartbeat_interval_s,
    )
    instance_id = cfg.group.group_instance_id
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
    batch = cfg.group.batch_size
    within = cfg.group.batch_within_s

    async def process(stream):
        async for events in stream.take_events(batch, within):
            await runtime.handle(events)

    if runtime.drain == "agent":
        app.agent(source, name=f"{topology.name}-operator")(process)
        # The agent's queue holds records fetched after the runtime positioned the
        # partitions: a resume of the running flow must not drop them (the operator would
        # go on past them and skip them when they come back).
        keep_queued_events_on_resume(app.flow_control)
    else:
        # No agent: the consumer hands fetched batches to the runtime directly; the topic
        # only needs to be part of the subscription.
        app.topics.add(source)
    app.on_partitions_assigned.connect(runtime.on_assigned)
    app.on_partitions_revoked.connect(runtime.on_revoked)
    app.on_before_shutdown.connect(runtime.on_shutdown)
    runtime.watch_coordination()
    # Also moves the commit limits on while no records arrive (commit_interval_s).
    tick_s = max(0.1, min(cfg.group.commit_interval_s, topology.checkpoint_interval_s / 2))
    app.timer(tick_s, name=f"{topology.name}-checkpoint")(
        runtime.checkpoint_tick)

    api = WorkerHTTP(runtime.core)

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
        await asyncio.get_running_loop().run_in_executor(None, runtime.core.start_members)

    return app
