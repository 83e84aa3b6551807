"""Sketch states bound to a Quix Streams ``Application``: ``QuixState`` (one state's steps,
restores and snapshots), ``QuixStates`` (the states of one app, hooked into its rebalances
and ``run()``), and ``bind``, ``scores``, ``rate_limiter``, ``heavy_hitters``,
``forgetting_set`` and ``serve``, which make them (``grudge_stream.quix`` says how to use them).
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable, Generic, Iterable, TypeVar

from quixstreams import Application, message_context
from quixstreams.context import MessageContextNotSetError
from quixstreams.sinks import BaseSink

from grudge_stream.quix.rebalance import _hook_rebalance
from grudge_stream.quix.server import StatesServer
from grudge_stream.state import (
    ForgettingSetState,
    HeavyHitterState,
    RateLimitState,
    ScoreState,
    SketchState,
    StateContext,
    StateNotReady,
)

log = logging.getLogger("grudge_stream.quix")

# Records applied while live reads are served: every one of the first ``SAMPLE_FIRST``
# offsets of a partition, then one offset in ``SAMPLE_MASK + 1``, has its key checked
# against the reads' partitioner (as the Faust binding samples).
SAMPLE_FIRST = 256
SAMPLE_MASK = 63

S = TypeVar("S", bound=SketchState[Any])


def _topic_name(source: Any) -> str:
    if isinstance(source, str) and source:
        return source
    name = getattr(source, "name", None)
    if isinstance(name, str) and name:
        return name
    raise TypeError(f"source must be a topic name or a Quix Topic (app.topic(...)), not {source!r}")


class _CheckpointSink(BaseSink):
    """The state's part of Quix's checkpoint. Quix calls ``add`` for every record reaching
    the dataframe the steps were added to (its position, so a snapshot covers records that
    did not change the state too) and ``flush`` at every checkpoint, before it commits."""

    def __init__(self, binding: "QuixState[Any]") -> None:
        super().__init__()
        self.binding = binding

    def add(self, value: Any, key: Any, timestamp: int, headers: Any, topic: str, partition: int,
            offset: int) -> None:
        self.binding.seen(topic, partition, offset)

    def flush(self) -> None:
        self.binding.checkpoint()

    def __repr__(self) -> str:
        return f"<grudge-stream checkpoint of state {self.binding.state.name!r}>"


_NOT_APPLIED = object()


def _key(k: Any) -> bytes:
    return k.encode("utf-8") if isinstance(k, str) else bytes(k)


class QuixState(Generic[S]):
    """One sketch state bound to a Quix ``Application`` (built by ``scores`` & co. or
    ``bind``): its steps, and the restores and snapshots Quix's rebalances and checkpoints
    call for. ``state`` is the ``grudge_stream.state`` object (reads: ``score``, ``raised``,
    ``top``, ``describe``, ``outputs``)."""

    def __init__(self, states: "QuixStates", state: S) -> None:
        self.states = states
        self.state: S = state
        self.name = state.name
        self.source_topic = state.source_topic
        self._sink = _CheckpointSink(self)
        self._sink_on: set[str] = set()  # stream ids of the dataframes the sink is on
        # Per partition: the offset below which the app has processed every record (Quix
        # stores an offset after every step of the record ran).
        self._positions: dict[int, int] = {}
        self._lock = threading.RLock()
        # Live reads are served (``serve``): records are applied under the slot's lock.
        self.served = False

    def __repr__(self) -> str:
        return f"<QuixState {self.state.kind} {self.name!r} of {self.source_topic!r}>"

    # -- steps --------------------------------------------------------------------------------

    def update(self, sdf: Any, value_of: Callable[[Any], Any] | None = None, *,
               key_of: Callable[[Any, Any], Any] | None = None) -> Any:
        """``sdf`` with a step that applies each record to the state; the record goes on as it
        was. ``value_of(value)``: what the record adds (None: it does not touch the state)."""
        step = self._step(sdf, value_of, key_of)

        def update_step(value: Any, key: Any, timestamp: int, headers: Any) -> None:
            step(value, key, timestamp)

        return sdf.update(update_step, metadata=True)

    def apply(self, sdf: Any, value_of: Callable[[Any], Any] | None = None, *,
              key_of: Callable[[Any, Any], Any] | None = None) -> Any:
        """``sdf`` with a step that applies each record to the state; the record's value
        becomes the state's result (None for a record the state skipped: already reflected
        in a restored snapshot, or refused for its time)."""
        step = self._step(sdf, value_of, key_of)

        def apply_step(value: Any, key: Any, timestamp: int, headers: Any) -> Any:
            result = step(value, key, timestamp)
            return None if result is _NOT_APPLIED else result

        return sdf.apply(apply_step, metadata=True)

    def filter(self, sdf: Any, value_of: Callable[[Any], Any] | None = None, *,
               keep: Callable[[Any], bool] | None = None, key_of: Callable[[Any, Any], Any] | None = None) -> Any:
        """``sdf`` with a step that applies each record to the state and lets it through when
        ``keep(result)`` (default: allowed, first seen, or the key raised). A record the
        state skipped (already reflected in a restored snapshot) goes through: downstream
        steps get it at least once, as Quix gives; so does one the state never saw
        (``value_of`` or ``key_of`` gave None)."""
        if keep is not None and not callable(keep):
            raise TypeError(f"keep must be callable, not {type(keep).__name__}")
        step = self._step(sdf, value_of, key_of, with_key=True)
        user_keep = keep
        default_keep = self._default_keep()

        def filter_step(value: Any, key: Any, timestamp: int, headers: Any) -> bool:
            result, k, p = step(value, key, timestamp)
            if result is _NOT_APPLIED:
                return True
            return bool(user_keep(result)) if user_keep is not None else bool(default_keep(result, k, p))

        return sdf.filter(filter_step, metadata=True)

    def _default_keep(self) -> Callable[[Any, Any, int], bool]:
        """keep(result, key, partition) of a filter step without ``keep``."""
        st = self.state
        if isinstance(st, RateLimitState):
            return lambda r, k, p: bool(r[0])
        if isinstance(st, ForgettingSetState):
            return lambda r, k, p: bool(r)
        if isinstance(st, ScoreState):
            return lambda r, k, p: st.raised(k, p)
        return lambda r, k, p: _key(k) in st.operator(p).latch

    def _step(self, sdf: Any, value_of: Callable[[Any], Any] | None,
              key_of: Callable[[Any, Any], Any] | None, with_key: bool = False) -> Callable[[Any, Any, int], Any]:
        """The per-record function of a step on ``sdf`` (checked: it reads the state's source
        topic), with the checkpoint sink put on ``sdf`` once."""
        topics = [getattr(t, "name", t) for t in getattr(sdf, "topics", ())]
        if not hasattr(sdf, "update") or not topics:
            raise TypeError(f"sdf must be a Quix StreamingDataFrame (app.dataframe(...)), not {sdf!r}")
        if self.source_topic not in topics:
            raise ValueError(f"sdf: state {self.name!r} is bound to topic {self.source_topic!r}, but this "
                             f"StreamingDataFrame reads {topics}: add its steps to the dataframe of "
                             f"{self.source_topic!r} (before any group_by, which changes the topic)")
        if len(topics) != 1:
            raise ValueError(f"sdf: state {self.name!r} needs a dataframe of its topic {self.source_topic!r} "
                             f"alone, not one of {topics} (a concat)")
        if value_of is not None and not callable(value_of):
            raise TypeError(f"value_of must be callable, not {type(value_of).__name__}")
        if key_of is not None and not callable(key_of):
            raise TypeError(f"key_of must be callable, not {type(key_of).__name__}")
        apply = self._applier(value_of)  # checked before the dataframe is touched
        if sdf.stream_id not in self._sink_on:
            sdf.sink(self._sink)  # a branch: it sees every record of sdf; flushed at each checkpoint
            self._sink_on.add(sdf.stream_id)
        source = self.source_topic

        def step(value: Any, key: Any, timestamp: int) -> Any:
            try:
                ctx = message_context()
            except MessageContextNotSetError:
                raise StateNotReady(f"state {self.name!r}: its step ran outside a running Quix application "
                                    "(no message context); call app.run()") from None
            if ctx.topic != source:
                raise ValueError(f"sdf: state {self.name!r} is bound to topic {source!r}, but its step got a "
                                 f"record of {ctx.topic!r}")
            k = key_of(value, key) if key_of is not None else key
            if k is None:
                result = _NOT_APPLIED
            elif self.served:
                result = self._apply_served(apply, k, value, ctx.partition, ctx.offset, int(timestamp))
            else:
                result = apply(k, value, ctx.partition, ctx.offset, int(timestamp))
            return (result, k, ctx.partition) if with_key else result

        return step

    def _apply_served(self, apply: Callable[[Any, Any, int, int, int], Any], k: Any, value: Any, p: int, o: int,
                      t: int) -> Any:
        """``apply`` while live reads are served (``serve``): under the partition's slot lock,
        which a read holds while it reads the partition, so a read never sees half a record
        applied; and now and then the key checked against the partitioner the reads use."""
        core = self.state.core
        slot = core.slots.get(p) if core is not None else None
        if slot is None:  # restored on first use, by this very call
            return apply(k, value, p, o, t)
        with slot.lock:
            result = apply(k, value, p, o, t)
        if o < SAMPLE_FIRST or not o & SAMPLE_MASK:
            core = self.state.core
            if core is not None and core.partition_count and isinstance(k, (bytes, str)):
                core.partitioner_check.check(p, core.partition_count, [_key(k)])
        return result

    def _applier(self, value_of: Callable[[Any], Any] | None) -> Callable[[Any, Any, int, int, int], Any]:
        st = self.state
        if isinstance(st, ScoreState):
            if value_of is None:
                raise TypeError(f"value_of is required for score state {self.name!r}: the delta of a record")
            method, default = st.update, None
        elif isinstance(st, RateLimitState):
            method, default = st.try_update, 1.0
        elif isinstance(st, HeavyHitterState):
            method, default = st.add, 1
        elif isinstance(st, ForgettingSetState):
            def add(k: Any, _v: Any, *, partition: int, offset: int, timestamp_ms: int) -> Any:
                return st.add_if_absent(k, partition=partition, offset=offset, timestamp_ms=timestamp_ms)
            method, default = add, None
        else:
            raise TypeError(f"state must be a ScoreState, RateLimitState, HeavyHitterState or "
                            f"ForgettingSetState, not {type(st).__name__}")

        def apply(k: Any, value: Any, p: int, o: int, t: int) -> Any:
            if value_of is not None:
                v = value_of(value)
                if v is None:  # the record does not touch the state
                    return _NOT_APPLIED
            else:
                v = default
            result = method(k, v, partition=p, offset=o, timestamp_ms=t)
            return _NOT_APPLIED if result is None else result

        return apply

    # -- Quix's checkpoint and rebalances -------------------------------------------------------

    def seen(self, topic: str, partition: int, offset: int) -> None:
        if topic == self.source_topic and offset + 1 > self._positions.get(partition, -1):
            self._positions[partition] = offset + 1

    def checkpoint(self) -> None:
        """The state's outputs delivered, then the snapshots of every changed partition
        written (blocking): Quix's checkpoint calls it before committing."""
        with self._lock:
            core = self.state.core
            if core is None or not core.slots:
                return
            positions = {p: o for p, o in self._positions.items() if p in core.slots}
            self.state.checkpoint(positions)
            if self.served:
                core.record_replay()  # the members record refreshed now and then (watermarks)

    def assigned(self, partitions: list[int]) -> None:
        with self._lock:
            self.state.start()
            web = self.states.web
            if web is not None:
                web.start_state(self)
            held = set(self.state.partitions())
            new = sorted(p for p in partitions if p not in held)
            if new:
                starts = self.state.assign(new)
                log.info("state %s: %s %s restored (resuming at %s)", self.name, self.source_topic, new, starts)

    def released(self, partitions: list[int], *, snapshot: bool) -> None:
        with self._lock:
            if self.state.core is None:
                return
            parts = [p for p in partitions if p in self.state.core.slots]
            if parts:
                self.state.revoke(parts, snapshot=snapshot)
                log.info("state %s: %s %s let go", self.name, self.source_topic, parts)
            for p in partitions:
                self._positions.pop(p, None)

    def close(self) -> None:
        with self._lock:
            try:
                self.state.close(snapshot=True)
            except Exception as exc:  # noqa: BLE001 - the next owner restores the last snapshot
                log.error("state %s: no final snapshot (%s); the next owner replays from the last one",
                          self.name, exc)


_BOUND: "weakref.WeakKeyDictionary[Application, QuixStates]" = weakref.WeakKeyDictionary()


class QuixStates:
    """The sketch states bound to one Quix ``Application``: restores on assignment (before
    records flow), releases on revocation, close when ``run()`` returns."""

    def __init__(self, app: Application) -> None:
        if not isinstance(app, Application):
            raise TypeError(f"app must be a quixstreams.Application, not {type(app).__name__}")
        self.app = app
        self.states: dict[str, QuixState[Any]] = {}
        self.assignment: set[tuple[str, int]] = set()
        self.running = False
        # Live reads over HTTP (``serve``), or None.
        self.web: StatesServer | None = None
        _hook_rebalance(app, self._assigned, self._revoked, self._lost)
        run = app.run

        def run_and_close(*args: Any, **kwargs: Any) -> Any:
            if self.web is not None:
                self.web.start()  # the port bound before the app joins its group
            self.running = True
            try:
                return run(*args, **kwargs)
            finally:
                self.running = False
                try:
                    if self.web is not None:
                        self.web.close()
                finally:
                    for bound in self.states.values():
                        bound.close()

        app.run = run_and_close  # type: ignore[method-assign]

    @classmethod
    def of(cls, app: Application) -> "QuixStates":
        if not isinstance(app, Application):
            raise TypeError(f"app must be a quixstreams.Application, not {type(app).__name__}")
        states = _BOUND.get(app)
        if states is None:
            states = _BOUND[app] = cls(app)
        return states

    def add(self, state: S) -> QuixState[S]:
        if not isinstance(state, SketchState):
            raise TypeError(f"state must be a grudge_stream.state state, not {type(state).__name__}")
        if state.name in self.states:
            raise ValueError(f"name: a sketch state named {state.name!r} is already bound to this application")
        if self.running:
            raise RuntimeError(f"bind state {state.name!r} before the application runs")
        bound = QuixState(self, state)
        state.bind_context(StateContext(restore_on_demand=lambda p, b=bound: self._restore_now(b, p)))
        self.states[state.name] = bound
        return bound

    def serve(self, **options: Any) -> "StatesServer":
        """Live reads of every state (bound now or later) on a web server of their own (``serve``)."""
        if self.web is not None:
            raise ValueError("app: live reads are already served for this application")
        if self.running:
            raise RuntimeError("serve live reads before the application runs")
        self.web = StatesServer(self, **options)
        return self.web

    def _by_topic(self, tps: Iterable[Any]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for tp in tps:
            out.setdefault(tp.topic, []).append(tp.partition)
        return out

    def _assigned(self, tps: list) -> None:
        self.assignment.update((tp.topic, tp.partition) for tp in tps)
        by_topic = self._by_topic(tps)
        for bound in self.states.values():
            parts = by_topic.get(bound.source_topic)
            if parts:
                bound.assigned(parts)

    def _revoked(self, tps: list) -> None:
        self._release(tps, snapshot=True)

    def _lost(self, tps: list) -> None:
        # Another member may own them already: no snapshot of ours may overwrite its.
        self._release(tps, snapshot=False)

    def _release(self, tps: list, *, snapshot: bool) -> None:
        self.assignment.difference_update((tp.topic, tp.partition) for tp in tps)
        by_topic = self._by_topic(tps)
        for bound in self.states.values():
            parts = by_topic.get(bound.source_topic)
            if parts:
                bound.released(parts, snapshot=snapshot)

    def _restore_now(self, bound: QuixState[Any], partition: int) -> None:
        """A record of a partition the assignment hook has not restored reached a step:
        restore it now. Never for a partition the app's consumer does not hold."""
        if not self.running:
            raise StateNotReady(f"state {bound.name!r} used outside a running Quix application "
                                "(app.run() restores its partitions)")
        if (bound.source_topic, partition) not in self.assignment:
            return
        log.info("state %s: %s[%d] restored on first use", bound.name, bound.source_topic, partition)
        bound.assigned([partition])


def bind(app: Application, state: S) -> QuixState[S]:
    """Bind ``state`` (a ``grudge_stream.state`` state) to ``app``; its ``QuixState``."""
    return QuixStates.of(app).add(state)


def scores(app: Application, name: str, *, source: Any, **kw: Any) -> QuixState[ScoreState]:
    """A ``ScoreState`` (decaying scores with alerts) of ``source``, bound to ``app``."""
    return bind(app, ScoreState(name, source_topic=_topic_name(source), **kw))


def rate_limiter(app: Application, name: str, *, source: Any, **kw: Any) -> QuixState[RateLimitState]:
    """A ``RateLimitState`` (token buckets) of ``source``, bound to ``app``."""
    return bind(app, RateLimitState(name, source_topic=_topic_name(source), **kw))


def heavy_hitters(app: Application, name: str, *, source: Any, **kw: Any) -> QuixState[HeavyHitterState]:
    """A ``HeavyHitterState`` (decayed counts, top-k, alerts) of ``source``, bound to ``app``."""
    return bind(app, HeavyHitterState(name, source_topic=_topic_name(source), **kw))


def forgetting_set(app: Application, name: str, *, source: Any, **kw: Any) -> QuixState[ForgettingSetState]:
    """A ``ForgettingSetState`` (a set that forgets) of ``source``, bound to ``app``."""
    return bind(app, ForgettingSetState(name, source_topic=_topic_name(source), **kw))


def serve(app: Application, *, port: int | None = None, host: str | None = None, token_file: str | None = None,
          key_partitioner: str | None = None, insecure_open: bool = False, prefix: str = "/grudge",
          advertised_url: str | None = None, serving: Any = None) -> StatesServer:
    """Serve live reads of ``app``'s states (bound before or after) over HTTP, from any
    instance: ``GET <prefix>/<state name>/v1/score?key=K`` (and ``/v1/scores``), answered by
    the instance that holds the key's partition (``StatesServer``; docs/embedding.md). Quix
    Streams has no web server: this one listens on ``host:port`` while ``app.run()`` runs.

    ``port``: default the ``GRUDGE_WEB_PORT`` setting (6066; 0: any free port); ``host``:
    the address to bind, default ``GRUDGE_WEB_HOST`` (127.0.0.1). ``token_file``: the
    bearer tokens (``name:token`` lines, re-read when the file changes; default
    ``GRUDGE_QUERY_TOKEN_FILE``); without one only a loopback ``host`` is served, unless
    ``insecure_open``. ``key_partitioner``: how the source topic's producers place keys,
    ``murmur2`` (Kafka's default, Quix's own producers, Java's) or ``crc32``
    (librdkafka's default); default each state's setting (murmur2). ``advertised_url``:
    the URL the other instances reach this one at (default ``http://<host>:<port>``, the
    machine's name when ``host`` binds every address; ``GRUDGE_ADVERTISED_URL``). ``serving``:
    a ``grudge_stream.sections.Serving`` section the others default to instead of the
    ``GRUDGE_*`` variables (its TLS files, query budget, ...)."""
    return QuixStates.of(app).serve(port=port, host=host, token_file=token_file, key_partitioner=key_partitioner,
                                    insecure_open=insecure_open, prefix=prefix, advertised_url=advertised_url,
                                    serving=serving)
