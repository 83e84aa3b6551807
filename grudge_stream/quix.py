"""Sketch state in your own Quix Streams application: steps of a ``StreamingDataFrame``.

::

    from quixstreams import Application
    from grudge_stream import quix as grudge
    from grudge_stream.hashkey import HashKey
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

    app = Application(broker_address="localhost:9092", consumer_group="shop-guard",
                      auto_offset_reset="earliest")
    logins = app.topic("logins", key_deserializer="bytes", value_deserializer="json")
    abuse = grudge.scores(app, "shop-guard-abuse", source=logins, hash_key=HashKey.parse(SEED),
                          sketch=ScoreSketchConfig(levels=4, cells_per_level=100_000,
                                                   decay=Exponential(0.01), hasher="siphash"),
                          raise_at=0.5, clear_at=0.25)

    sdf = app.dataframe(logins)
    sdf = abuse.update(sdf, lambda login: 0.04 if login["outcome"] == "bad" else -0.001)
    sdf = sdf.apply(count_logins, stateful=True)       # your own steps, Quix's own state
    app.run()

``scores``, ``rate_limiter``, ``heavy_hitters`` and ``forgetting_set`` build a state
(``grudge_stream.state``) and bind it to the app; ``bind(app, state)`` binds one you
built. The binding (``QuixState``) adds steps to a dataframe of the state's source
topic, in the shape of the dataframe's own:

- ``update(sdf, value_of)``: apply each record to the state; the record goes on unchanged;
- ``apply(sdf, value_of)``: the record's value becomes what the state computed for it
  (the new score, ``(allowed, retry_after_ms)``, the estimate, "new?");
- ``filter(sdf, value_of, keep=None)``: only records the state lets through go on (rate
  limiter: allowed; forgetting set: seen for the first time; scores and heavy hitters:
  the key is raised).

Each takes the record's key, its timestamp (Quix's, the topic's timestamp extractor
included) and its partition and offset (``message_context()``); ``value_of(value)`` is
what the record adds (a delta, a cost, a count: None leaves the state untouched).

What binding does to the app, and nothing else (docs/embedding.md, "In a Quix Streams
application"):

- assigned partitions of the source topic are restored from their newest snapshots in
  Quix's assignment callback, before any of their records is processed (or, failing
  that, on first use); revoked ones get a last snapshot and are let go;
- the state is snapshotted at every Quix checkpoint, before Quix commits: the steps
  register a sink (Quix's ``BaseSink``) whose ``flush`` (called by every checkpoint
  before its commit) delivers the state's outputs, then writes the snapshots, so the
  commit never passes a durable snapshot and no snapshot covers an undelivered output;
- records below a restored snapshot's offset are skipped by the state alone; your other
  steps see them (at-least-once, as Quix gives).

``serve(app, port=..., token_file=...)`` serves the states' score reads over HTTP, on a
small server of its own while ``app.run()`` runs (Quix has none):
``/grudge/<state>/v1/score?key=K`` on any instance, answered by the instance that holds the
key's partition, behind the bearer tokens of ``token_file`` (``StatesServer``).

Assignment and revocation come from Quix's rebalance callbacks, which Quix does not
expose (``Application._on_assign``, ``_on_revoke``, ``_on_lost``): ``_hook_rebalance``
wraps them, for the Quix versions in ``QUIX_SUPPORTED`` (the ``quix`` extra pins them;
tests/unit/test_quix_binding.py fails when those attributes change).
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable, Generic, Iterable, TypeVar

from quixstreams import Application, message_context
from quixstreams.context import MessageContextNotSetError
from quixstreams.sinks import BaseSink

from grudge_stream.state import (
    ForgettingSetState,
    HeavyHitterState,
    RateLimitState,
    ScoreState,
    SketchState,
    StateNotReady,
)

__all__ = ["bind", "scores", "rate_limiter", "heavy_hitters", "forgetting_set", "serve", "QuixState", "QuixStates",
           "StatesServer", "QUIX_SUPPORTED", "StateNotReady"]

log = logging.getLogger("grudge_stream.quix")

# Records applied while live reads are served: every one of the first ``SAMPLE_FIRST``
# offsets of a partition, then one offset in ``SAMPLE_MASK + 1``, has its key checked
# against the reads' partitioner (as the Faust binding samples).
SAMPLE_FIRST = 256
SAMPLE_MASK = 63

# The Quix Streams versions this binding is tested with (the ``quix`` extra pins them):
# [lowest, first unsupported).
QUIX_SUPPORTED = ((3, 28, 1), (3, 29, 0))

S = TypeVar("S", bound=SketchState[Any])


def _version() -> tuple[int, ...]:
    import quixstreams

    parts = []
    for piece in str(quixstreams.__version__).split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _topic_name(source: Any) -> str:
    if isinstance(source, str) and source:
        return source
    name = getattr(source, "name", None)
    if isinstance(name, str) and name:
        return name
    raise TypeError(f"source must be a topic name or a Quix Topic (app.topic(...)), not {source!r}")


# -- the one private hook ---------------------------------------------------------------------

_REBALANCE_CALLBACKS = ("_on_assign", "_on_revoke", "_on_lost")


def _hook_rebalance(app: Application, assigned: Callable[[list], None], revoked: Callable[[list], None],
                    lost: Callable[[list], None]) -> None:
    """Call ``assigned`` after Quix's own assignment callback, ``revoked`` after its
    revocation callback (which commits Quix's checkpoint first) and ``lost`` after it drops
    lost partitions, each with the callback's ``TopicPartition`` list.

    PRIVATE to Quix Streams: ``Application._on_assign`` / ``_on_revoke`` / ``_on_lost`` are
    the callbacks ``Application._run_dataframe`` hands to ``consumer.subscribe``, read from
    the instance when ``run()`` starts, so instance attributes replace them. Quix has no
    public rebalance hook (3.28). Checked here and by tests/unit/test_quix_binding.py."""
    missing = [n for n in _REBALANCE_CALLBACKS if not callable(getattr(app, n, None))]
    if missing:
        raise RuntimeError(
            f"Quix Streams {'.'.join(map(str, _version()))} has no Application.{', '.join(missing)}: "
            f"grudge_stream.quix restores on assignment through them and supports Quix Streams "
            f">={'.'.join(map(str, QUIX_SUPPORTED[0]))},<{'.'.join(map(str, QUIX_SUPPORTED[1]))} "
            "(pip install 'grudge-stream[quix]')")
    own_assign, own_revoke, own_lost = (getattr(app, n) for n in _REBALANCE_CALLBACKS)

    def on_assign(consumer: Any, partitions: list) -> None:
        own_assign(consumer, partitions)
        if partitions:
            assigned(partitions)

    def on_revoke(consumer: Any, partitions: list) -> None:
        try:
            own_revoke(consumer, partitions)
        finally:
            if partitions:
                revoked(partitions)

    def on_lost(consumer: Any, partitions: list) -> None:
        try:
            own_lost(consumer, partitions)
        finally:
            if partitions:
                lost(partitions)

    app._on_assign = on_assign  # type: ignore[method-assign]
    app._on_revoke = on_revoke  # type: ignore[method-assign]
    app._on_lost = on_lost  # type: ignore[method-assign]


# -- the binding ------------------------------------------------------------------------------

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
        state.restore_on_demand = lambda p, b=bound: self._restore_now(b, p)
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


# -- live reads over HTTP ---------------------------------------------------------------------

class _NotStarted:
    """The API of a state that has not started yet (the app has not joined its group): every
    score request answers 503 ``not_ready``, as on a Faust app."""

    def __init__(self, name: str) -> None:
        self.name = name

    health = staticmethod(lambda path: None)
    is_score = staticmethod(lambda path: True)

    def admit(self, headers: Any, peer: str) -> tuple[None, Any]:
        from grudge_stream.serving.http import _json

        return None, _json(503, {"error": "not_ready", "message": f"state {self.name!r} has not started yet (the "
                                 "application has not joined its group)", "retry_after_s": 1}, {"Retry-After": "1"})

    def answered(self, answer: Any, t0: float) -> None:
        pass


class StatesServer:
    """Live reads of a Quix application's states over HTTP (``serve``).

    Quix Streams has no web server, so this is a small one of grudge-stream's own: the
    batch worker's threaded server (``grudge_stream.serving.server``), started on a thread
    when ``app.run()`` starts and stopped when it returns. Per state, ``<prefix>/<name>/v1/score``
    and ``<prefix>/<name>/v1/scores``: the score query API of a worker
    (``grudge_stream.serving``), whose access rules, parsing, routing, forwards and answers
    are used as they are. The key's partition is computed with ``key_partitioner`` (Kafka's
    murmur2 by default, as Quix's own producers place keys); a partition this instance
    does not hold is asked of its owner, found in the members directory
    ``grudge-embedded-<name>-members`` where every instance publishes the partitions it
    holds restored and the URL it answers at, and each answer says which instance read it
    (``served_by``, and ``forwarded_by`` when it was asked of another). While reads are
    served, each record is applied under its partition's lock (which a read holds while
    it reads), and the keys applied are sampled to check the partitioner; until a sampled
    key confirmed it, answers carry ``partitioner_check``.
    """

    def __init__(self, states: QuixStates, *, port: int | None = None, host: str | None = None,
                 token_file: str | None = None, key_partitioner: str | None = None, insecure_open: bool = False,
                 prefix: str = "/grudge", advertised_url: str | None = None) -> None:
        from grudge_stream.exceptions import ConfigError
        from grudge_stream.serving import PARTITIONERS
        from grudge_stream.settings import Settings, setting
        from grudge_stream.webauth import QueryAccess, is_loopback, server_tls

        if key_partitioner is not None and key_partitioner not in PARTITIONERS:
            raise ConfigError(f"key_partitioner must be one of {PARTITIONERS}, not {key_partitioner!r}")
        if not isinstance(prefix, str) or not prefix.startswith("/") or "?" in prefix:
            raise ValueError(f"prefix must be a URL path starting with '/', not {prefix!r}")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
            raise ValueError(f"port must be an int from 0 to 65535 (0: any free port), not {port!r}")
        if host is not None and (not isinstance(host, str) or not host):
            raise ValueError(f"host must be an address to bind, not {host!r}")
        env = Settings()
        self.states = states
        self.host = host if host is not None else str(setting(env, "web_host"))
        self.port = port if port is not None else int(setting(env, "web_port"))
        token_file = token_file or setting(env, "query_token_file")
        if not token_file and not is_loopback(self.host) and not insecure_open:
            raise ConfigError(
                f"host: live reads served on {self.host} would answer anyone who reaches port {self.port} "
                "without a token. Give serve(app, token_file=...) (or GRUDGE_QUERY_TOKEN_FILE: a file of bearer "
                "tokens, docs/security.md), serve on a loopback address (host='127.0.0.1', the default), or "
                "serve(app, insecure_open=True)")
        overrides = {"web_host": self.host, "web_port": str(self.port)}
        if token_file:
            overrides["query_token_file"] = str(token_file)
        if insecure_open:
            overrides["insecure_open_queries"] = "true"
        if advertised_url:
            overrides["advertised_url"] = str(advertised_url)
        self.settings = Settings(overrides, environ=env.environ)
        try:
            self.access = QueryAccess.from_settings(self.settings)
        except ConfigError as exc:  # a token file that cannot be read, or holds no token
            raise ConfigError(f"token_file: {exc}") from None
        self.tls = server_tls(self.settings)
        self.key_partitioner = key_partitioner
        self.prefix = prefix.rstrip("/")
        self.base_url = ""
        self.server: Any = None
        self.apis: dict[str, Any] = {}

    def path(self, bound: Any) -> str:
        """The state's path (``/v1/score`` and ``/v1/scores`` below it)."""
        from urllib.parse import quote

        return f"{self.prefix}/{quote(bound.name, safe='-._~')}"

    def url(self, bound: Any) -> str:
        """The state's URL, as other instances forward to it (once serving)."""
        return self.base_url + self.path(bound)

    def start(self) -> None:
        """Bind the port and serve from a thread (``app.run()`` calls it first); a port that
        cannot be bound is a ``ConfigError`` naming it, before the app joins its group."""
        from grudge_stream.exceptions import ConfigError
        from grudge_stream.serving.members import advertised_url
        from grudge_stream.serving.server import WebServer
        from grudge_stream.settings import Settings

        if self.server is not None:
            return
        try:
            self.server = WebServer((self.host, self.port), self.route, self.tls).start("grudge-quix-reads")
        except OSError as exc:
            raise ConfigError(f"port: live reads cannot be served on {self.host}:{self.port}: {exc}") from None
        bound = {**self.settings.overrides, "web_port": str(self.server.port)}
        self.base_url = advertised_url(Settings(bound, environ=self.settings.environ))
        log.info("live reads of the states at %s%s/<state>/v1/score", self.base_url, self.prefix)

    def route(self, path: str) -> tuple[Any, str] | None:
        """A request's state API and the path below the state, or None (404)."""
        from urllib.parse import unquote

        from grudge_stream.serving.http import WorkerHTTP

        if not path.startswith(self.prefix + "/"):
            return None
        name, _, rel = path[len(self.prefix) + 1:].partition("/")
        rel = "/" + rel
        name = unquote(name)
        if not WorkerHTTP.is_score(rel) or name not in self.states.states:
            return None
        api = self.apis.get(name)
        return (api if api is not None else _NotStarted(name)), rel

    def start_state(self, bound: QuixState[Any]) -> None:
        """A started state's queries under these access rules, answering at its URL, and its
        members directory (Quix's assignment callback calls it). Once per start of the state."""
        from grudge_stream.serving.http import mount_core

        core = bound.state.core
        if core is None or bound.name in self.apis:
            return
        url = self.url(bound)
        self.apis[bound.name] = mount_core(core, url, self.access, self.key_partitioner)
        bound.served = True
        log.info("state %s: live reads at %s/v1/score (key_partitioner=%s)", bound.name, url,
                 core.queries.partitioner)

    def close(self) -> None:
        """The port closed and every state's members directory withdrawn (a clean stop)."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()
        for name in list(self.apis):
            api = self.apis.pop(name)
            bound = self.states.states.get(name)
            if bound is not None:
                bound.served = False
            core = api.worker
            if core.members is not None:
                core.members.close()
                core.members = None


def serve(app: Application, *, port: int | None = None, host: str | None = None, token_file: str | None = None,
          key_partitioner: str | None = None, insecure_open: bool = False, prefix: str = "/grudge",
          advertised_url: str | None = None) -> StatesServer:
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
    machine's name when ``host`` binds every address; ``GRUDGE_ADVERTISED_URL``)."""
    return QuixStates.of(app).serve(port=port, host=host, token_file=token_file, key_partitioner=key_partitioner,
                                    insecure_open=insecure_open, prefix=prefix, advertised_url=advertised_url)
