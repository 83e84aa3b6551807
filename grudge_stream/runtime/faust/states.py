"""Sketch states embedded in a user's own Faust app (``grudge_stream.faust``).

``attach`` adds a state to an app; ``FaustStates`` (one per app, ``app.grudge_states``)
restores the states' partitions on assignment, snapshots them on a timer, on revocation
and at shutdown, and clips the app's commits of their source topics to the snapshots.
``serve`` mounts their live reads on the app's web server
(``grudge_stream.runtime.faust.web``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import warnings
from typing import TYPE_CHECKING, Any, TypeVar

import faust
from confluent_kafka import KafkaException
from faust.exceptions import AlreadyConfiguredWarning
from faust.types import TP

from grudge_stream.exceptions import (EXIT_FAULT, EXIT_USER_ERROR, CheckpointError, ConfigError, DeliveryError,
                                     GrudgeError, WorkerFault)
from grudge_stream.runtime.faust.consumer import app_consumer, install_state_consumer, keep_queued_events_on_resume
from grudge_stream.runtime.faust.watchers import request_rebalance, watch_coordination, watch_recovery
from grudge_stream.runtime.faust.web import StatesWeb, current_position
from grudge_stream.state_base import StateContext

if TYPE_CHECKING:
    from grudge_stream.state import SketchState

log = logging.getLogger("grudge_stream.faust")

# A Table recovery of a user's app that reads nothing for this long is stalled (FaustStates).
RECOVERY_STALL_S = 60.0


class FaustStates:
    """The sketch states attached to one Faust app (``app.grudge_states``): restores on
    assignment, snapshots on a timer, on revocation and at shutdown, commit limits."""

    TICK_S = 0.5

    def __init__(self, app: faust.App) -> None:
        if app_consumer(app) is not None:
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
        install_state_consumer(app)
        _install_worker_exit_status(app, self)
        keep_queued_events_on_resume(app.flow_control)
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
                core.checkpointer.no_more_snapshots = True
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
        state.bind_context(StateContext(current_position=lambda: current_position(state),
                                        restore_on_demand=lambda p: self.restore_now(state, p),
                                        app_connection=lambda: _app_connection(self.app),
                                        app_group=self.app.conf.id))  # Faust's consumer group
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
                committed = consumer.grudge_committed_offset(TP(state.source_topic, p))
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
        if core is None or core.checkpointer.no_more_snapshots:
            return
        positions = self._positions(state, partitions)
        for p, o in positions.items():
            op = core.slots[p].operator if p in core.slots else None
            if op is not None and (op.next_offset is None or o > op.next_offset):
                op.next_offset = o
        taken = state.embedded.take_snapshots(partitions)
        if taken:
            await self._run(state.write_snapshots, taken, should_stop)
        core.checkpointer.cadence.done()
        return positions

    async def tick(self) -> None:
        """Start a checkpoint round in the background if one is due and none runs (a timer
        that waits for the writes would overlap itself)."""
        consumer = app_consumer(self.app)
        if consumer is not None and hasattr(consumer, "grudge_release_stale_hold"):
            consumer.grudge_release_stale_hold()
        if not self.started or self.stopping or self.lock.locked():
            return
        if any(s.core is not None and s.core.checkpointer.cadence.due() for s in self.states.values()):
            asyncio.ensure_future(self._round())

    async def _round(self) -> None:
        async with self.lock:
            for state in self.states.values():
                core = state.core
                if core is None or not core.checkpointer.cadence.due():
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
            if limit >= 0 and (self.consumer.grudge_committed_offset(tp) or 0) < limit:
                offsets[tp] = limit
        if offsets:
            await self.consumer.grudge_commit(offsets)

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
