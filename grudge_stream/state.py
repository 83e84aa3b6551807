"""Sketch-backed state for your own stream processor: the embedding API.

A ``SketchState`` is what a Faust Table is to a dict: per-key state of one source
topic, split by its partitions, that your code reads and updates per event, and
that grudge-stream snapshots, restores and publishes for you. Unlike a table it
never grows: each partition holds one fixed-size sketch, whatever the number of
keys, and forgets on its own.

Four kinds, one per sketch family:

- ``ScoreState``: decaying feedback scores (``update``), single or split-sign, with
  alerts when a key's score crosses ``raise_at`` (and clears at ``clear_at``);
- ``RateLimitState``: token buckets (``try_update``);
- ``HeavyHitterState``: decayed counts with top-k (``add``, ``top``) and alerts;
- ``ForgettingSetState``: a set that forgets (``add_if_absent``).

Each event is applied at its partition's event time (the watermark), exactly as the
shipped topologies apply records, so a replay of the same events gives the same
state byte for byte. Driving it (docs/embedding.md):

- **Faust**: ``grudge_stream.faust.attach(app, state)`` — restore on assignment,
  snapshots on a timer, on revocation and at shutdown, commits that never pass a
  snapshot; your agents call ``state.update(key, delta)`` and the event's
  partition, offset and timestamp come from the event being processed.
- **Your own loop** (confluent-kafka or any other): ``start()``, ``assign(partitions)``
  in your assignment callback (seek each partition to the offset it returns),
  ``update(..., partition=, offset=, timestamp_ms=)`` per event, ``checkpoint()``
  whenever you want to commit (commit exactly the offsets it returns), ``revoke``,
  ``close``. ``examples/own_loop.py`` is a complete one.

A state added to an app that already ran is filled from its source topic's history first
with ``state.backfill(value_of)`` or ``grudge-stream backfill`` (``grudge_stream.backfill``).

What is guaranteed: a snapshot never covers an output (alert, decision) that was not
delivered; the state a restore rebuilds, once the records after its snapshot are
applied again, is byte-identical to a run that never stopped; events below a
restored snapshot's offset are skipped, so nothing is counted twice.
"""
from __future__ import annotations

import logging
import threading
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Mapping, TypeVar, cast

from grudge_stream.checkpoint import SnapshotWrite
from grudge_stream.exceptions import ConfigError, GrudgeError
from grudge_stream.hashkey import HashKey
from grudge_stream.operators.base import Operator
from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.dedup import DedupOperator
from grudge_stream.operators.heavy import HeavyHitterOperator
from grudge_stream.operators.ratelimit import RateLimitOperator
from grudge_stream.operators.scores import FeedbackScoreOperator
from grudge_stream.operators.records import OutputRecord
from grudge_stream.settings import Settings, setting
from grudge_stream.topology import Topology

if TYPE_CHECKING:
    from grudge_stream.runtime.embedded import EmbeddedCore

OpT = TypeVar("OpT", bound=Operator)

__all__ = [
    "SketchState", "ScoreState", "RateLimitState", "HeavyHitterState", "ForgettingSetState",
    "StateNotReady",
]

log = logging.getLogger("grudge_stream.state")


class StateNotReady(GrudgeError, RuntimeError):
    """The state holds no restored sketch for the partition asked for: used before its
    runtime started, before the partition was assigned, or after it was revoked."""


def _key_bytes(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"key must be bytes or str, not {type(key).__name__}")


def _int_arg(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if v < 0:
        raise ValueError(f"{name} must be >= 0, not {v}")
    return v


class SketchState(Generic[OpT]):
    """Sketch-backed state of one source topic, one operator per partition (see the module
    docstring). Build one of the kinds below rather than this base.

    Common arguments:

    - ``name``: the state's name: its operator id, and the default of its topic names;
      unique per app (``<name>-snapshots``, ``<name>-dead-letters``);
    - ``source_topic``: the topic whose partitions split the state (its events must be
      keyed by the state's key, as Kafka's default partitioner places them);
    - ``hash_key``: the secret 128-bit SipHash key (``grudge_stream.hashkey.HashKey``),
      required when the keys come from the public (docs/security.md); ``None`` only
      with ``public_keys=False``;
    - ``snapshot_topic``, ``dead_letter_topic``: override the derived names;
    - ``bootstrap_servers``, ``client_config``: the cluster (confluent-kafka properties
      such as SASL and TLS); attached to a Faust app, each defaults to the app's own
      (``broker``, ``broker_credentials``), else ``KAFKA_BOOTSTRAP_SERVERS`` and the
      ``GRUDGE_*`` security settings;
    - ``checkpoint_interval_s``: how often the Faust binding snapshots (a loop of your
      own decides itself when to call ``checkpoint``);
    - ``overrides`` (scores, rate limits, heavy hitters): follow ``<alerts>-overrides``
      (``<decisions>-overrides``), the allow / deny entries ``grudge-stream override`` and
      ``grudge_stream.overrides.encode_override`` write, as the topologies do
      (docs/serving.md). Off by default.
    """

    kind = "state"

    def __init__(self, name: str, *, source_topic: str, make_operator: Callable[[int], OpT],
                 operator_id: str, outputs: Mapping[str, str | None],
                 snapshot_topic: str | None = None, dead_letter_topic: str | None = None,
                 bootstrap_servers: str | None = None, client_config: Mapping[str, Any] | None = None,
                 checkpoint_interval_s: float = 5.0, overrides: bool = False,
                 settings: Settings | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        if not isinstance(source_topic, str) or not source_topic:
            raise ValueError("source_topic must be a non-empty string")
        if not (checkpoint_interval_s > 0):
            raise ValueError(f"checkpoint_interval_s must be > 0, not {checkpoint_interval_s!r}")
        self.name = name
        self.source_topic = source_topic
        outs = {role: topic for role, topic in outputs.items() if topic}
        outs["dead_letters"] = dead_letter_topic or f"{name}-dead-letters"
        self.topology = Topology(
            name=name, source_topic=source_topic, make_operator=make_operator, outputs=outs,
            snapshot_topic=snapshot_topic or f"{name}-snapshots",
            checkpoint_interval_s=float(checkpoint_interval_s), restore_fallback="replay",
            description=f"embedded {self.kind} state", app_id=f"grudge-embedded-{name}",
            overrides_topic="" if overrides else None, operator_id=operator_id,
            needs_headers=False)  # the app's own code hands each event to the state
        self._settings = settings or Settings()
        self._bootstrap = bootstrap_servers
        self._client_config = dict(client_config or {})
        self._client_config_given = client_config is not None
        self.core: EmbeddedCore | None = None
        self._follower: Any = None
        # Restores and start-up run in a runtime's executor threads and, on first use, on its
        # event loop: one at a time.
        self._lock = threading.RLock()
        # Set by a runtime binding (grudge_stream.faust): where the current event comes from
        # when update() is called without partition/offset/timestamp_ms, and how a partition
        # the runtime has assigned but not yet restored is restored on first use.
        self.current_position: Callable[[], tuple[int, int, int]] | None = None
        self.restore_on_demand: Callable[[int], None] | None = None
        # Set by a runtime binding: the cluster of the app the state is attached to, as
        # ``(bootstrap servers, client properties, what could not be carried over)``; used for
        # whichever of bootstrap_servers / client_config was not given.
        self.app_connection: Callable[[], tuple[str, dict[str, Any], str | None]] | None = None
        # Set by a runtime binding: the consumer group of the app (a Faust app's id), the
        # position a backfill fills the state up to.
        self.app_group: str | None = None

    # What a backfill hands the operator for the value ``value_of`` gave (as the kind's
    # per-event call passes it on), and whether the column pipeline applies the batch.
    backfill_columns = False

    def backfill_value(self, value: Any) -> Any:
        return value

    # -- identity -------------------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings the state's clients read beside its own arguments (security, waits)."""
        return self._settings

    @property
    def operator_id(self) -> str:
        return self.topology.operator_id

    @property
    def snapshot_topic(self) -> str:
        return self.topology.snapshot_topic

    @property
    def outputs(self) -> dict[str, str]:
        """Output role -> topic (alerts, alert_state, dead_letters, ...)."""
        return dict(self.topology.outputs)

    # -- lifecycle ------------------------------------------------------------------------------

    def connection(self) -> tuple[str, dict[str, Any]]:
        """The bootstrap servers and client properties the state's clients use: those given,
        else its app's (a Faust app's ``broker`` and ``broker_credentials``), else the
        settings' (``KAFKA_BOOTSTRAP_SERVERS``, the ``GRUDGE_*`` security settings)."""
        bootstrap, props = self._bootstrap, dict(self._client_config)
        if self.app_connection is not None and (bootstrap is None or not self._client_config_given):
            app_bootstrap, app_props, unmapped = self.app_connection()
            if bootstrap is None:
                bootstrap = app_bootstrap
            if not self._client_config_given:
                props = app_props
                if unmapped:
                    log.info("state %s: the app's broker_credentials carried over, except: %s", self.name, unmapped)
        return bootstrap or self._settings.bootstrap_servers, props

    def start(self, *, create_topics: bool = True) -> "SketchState[OpT]":
        """Connect (blocking): check that the cluster answers (a ``ConfigError`` naming the
        address otherwise, after ``broker_wait_s``; at once for a failed login or TLS
        handshake), create the snapshot and output topics if missing (with the source's
        partition count), and the producer and snapshot store."""
        from grudge_stream.kafkaconf import check_connection, client_properties
        from grudge_stream.runtime.embedded import EmbeddedCore, ensure_topics

        with self._lock:
            if self.core is not None:
                return self
            self._bootstrap, self._client_config = self.connection()
            self._client_config_given = True
            check_connection(self._settings, wait_s=setting(self._settings, "broker_wait_s"),
                             bootstrap_servers=self._bootstrap,
                             properties={**client_properties(self._settings), **self._client_config})
            if create_topics:
                ensure_topics(self.topology, self._settings, self._bootstrap, self._client_config)
            core = EmbeddedCore(self.topology, self._settings, bootstrap_servers=self._bootstrap,
                                client_config=self._client_config)
            if self.topology.overrides_topic:
                from grudge_stream.overrides import start_override_follower

                # Before any partition is restored: every operator judges with the table.
                followed = start_override_follower(self.topology, core.bootstrap, core.client_config,
                                                   signing=getattr(core, "signing", None))
                self._follower = followed[1] if followed else None
            self.core = core
        return self

    def _core(self) -> EmbeddedCore:
        if self.core is None:
            raise StateNotReady(f"state {self.name!r} is not started: call start() (or attach it to a "
                                "Faust app, which starts it) before using it")
        return self.core

    def assign(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """Restore ``partitions`` from their newest usable snapshots (blocking). Returns, per
        partition, the offset to consume from (the snapshot's next offset; for a partition
        without one, the earliest retained offset if it was replayed, else None: wherever
        your consumer stands). Already assigned partitions keep their state."""
        core = self._core()
        out: dict[int, int | None] = {}
        for p in partitions:
            p = _int_arg("partition", p)
            with self._lock:
                slot = core.slots.get(p)
                if slot is None:
                    outcome = core.restore(p)
                    slot = core.adopt(p, outcome)
                    core.assigned.add(p)
            out[p] = slot.operator.next_offset
        core.record_assignment()
        return out

    def partitions(self) -> list[int]:
        """The partitions this state holds restored."""
        return sorted(self.core.slots) if self.core is not None else []

    def operator(self, partition: int) -> OpT:
        """The operator (sketch and latch) of an assigned partition."""
        core = self.core
        slot = core.slots.get(partition) if core is not None else None
        if slot is None and self.restore_on_demand is not None:
            self.restore_on_demand(partition)
            core = self.core
            slot = core.slots.get(partition) if core is not None else None
        core = self._core()
        if slot is None:
            raise StateNotReady(
                f"state {self.name!r} holds no restored partition {partition} of {self.source_topic!r} "
                f"(held: {sorted(core.slots)}); it is used before its partition was assigned "
                "and restored, or after it was revoked")
        return cast(OpT, slot.operator)

    def take_snapshots(self, positions: Mapping[int, int] | None = None) -> list[SnapshotWrite]:
        """The snapshots of every partition changed since its last one, the state copied now
        (call it where no event is being applied: a batch boundary; a sketch's copy is a
        memcpy) and serialized by ``write_snapshots``, off your loop. ``positions``: per partition,
        an offset every record below which your code has finished with (a consumer's
        processed position); the snapshot then covers them even if none changed the state."""
        core = self._core()
        if positions:
            for p, pos in positions.items():
                slot = core.slots.get(p)
                if slot is not None and pos is not None:
                    op = slot.operator
                    if op.next_offset is None or pos > op.next_offset:
                        op.next_offset = pos
        return core.take_snapshots()

    def write_snapshots(self, taken: list[SnapshotWrite], should_stop: Callable[[], bool] | None = None
                        ) -> dict[int, int]:
        """Deliver every output produced so far, then write ``taken`` (blocking: run it off
        an event loop). Returns the offsets now safe to commit, per partition."""
        return self._core().write_taken(taken, should_stop)

    def checkpoint(self, positions: Mapping[int, int] | None = None) -> dict[int, int]:
        """``take_snapshots`` then ``write_snapshots``: the offsets safe to commit (every
        partition held, up to its newest durable snapshot)."""
        core = self._core()
        self.write_snapshots(self.take_snapshots(positions))
        return {p: o for p, o in core.commit_limits.items() if p in core.slots}

    def commit_limit(self, partition: int) -> int | None:
        """The offset a commit of ``partition`` must not pass (its newest durable snapshot)."""
        return self.core.commit_limits.get(partition) if self.core is not None else None

    def revoke(self, partitions: Iterable[int], *, snapshot: bool = True) -> None:
        """Let ``partitions`` go, with a last snapshot of each first (unless ``snapshot``
        is false, when a snapshot could cover outputs that are lost)."""
        core = self._core()
        parts = [p for p in partitions if p in core.slots]
        if snapshot and parts:
            try:
                core.write_taken(core.take_snapshots(parts), None)
            except Exception as exc:  # noqa: BLE001 - they go either way; the next owner replays
                log.error("no snapshot on revocation of %s %s: %s", self.name, parts, exc)
        core.release(parts)
        core.record_assignment()

    def backfill(self, value_of: Callable[[Any, Any], Any], *, group: str | None = None, output: Any = None,
                 while_live: bool = False, uncommitted: str = "error", progress: bool = False) -> Any:
        """Fill the state from the retained history of its source topic, up to the committed
        offsets of ``group`` (default: the Faust app it is attached to), and write its
        snapshots there, for the app to restore when it starts the state (docs/embedding.md,
        "Backfill"). Run it before the app starts the state, with every instance of the app
        stopped (``while_live``: a first pass while it runs, then a second one stopped).

        ``value_of(key, value)``: what the app's code gives the state for a record (a delta,
        a cost, a count; None: the state is left alone), the function its agent calls.
        ``output``: None (publish nothing, the default), ``"live"`` (the state's own topics)
        or ``{role: topic}``. Returns a ``grudge_stream.backfill.BackfillReport``; bad
        arguments and refusals raise ``ConfigError``."""
        from grudge_stream.backfill import backfill

        return backfill(self, value_of, group=group, output=output, while_live=while_live,
                        uncommitted=uncommitted, progress=progress)

    def close(self, *, snapshot: bool = True) -> None:
        """A last snapshot of every partition (unless ``snapshot`` is false), outputs
        delivered, clients closed."""
        core = self.core
        if core is None:
            return
        try:
            if snapshot and core.slots:
                core.write_taken(core.take_snapshots(), lambda: True)
        finally:
            core.close()
            self.core = None
            if self._follower is not None:
                self._follower.stop()
                self._follower = None

    # -- per event ------------------------------------------------------------------------------

    def _position(self, partition: int | None, offset: int | None, timestamp_ms: int | None
                  ) -> tuple[int, int, int]:
        if partition is None and offset is None and timestamp_ms is None:
            if self.current_position is None:
                raise TypeError("partition, offset and timestamp_ms are required outside a Faust agent")
            return self.current_position()
        if partition is None or offset is None or timestamp_ms is None:
            raise TypeError("give partition, offset and timestamp_ms together (or none, inside a Faust agent)")
        return _int_arg("partition", partition), _int_arg("offset", offset), _int_arg("timestamp_ms", timestamp_ms)

    def apply(self, key: Any, value: Any, *, partition: int | None = None, offset: int | None = None,
              timestamp_ms: int | None = None) -> Any:
        """Apply one event and publish its outputs; what the operator computed for it (the
        kinds' methods name it), or None when the event was already reflected in the state
        (below a restored snapshot's offset) or dead-lettered for its time."""
        k = _key_bytes(key)
        p, o, t = self._position(partition, offset, timestamp_ms)
        op = self.operator(p)
        out = op.apply_event(k, value, offset=o, timestamp_ms=t)
        if out is None:
            return None
        if out:
            self._core().publish(out)
        return op.result

    def apply_many(self, events: Iterable[tuple[Any, Any, int, int, int]]) -> list[Any]:
        """``apply`` over ``(key, value, partition, offset, timestamp_ms)`` tuples, outputs
        published once for the batch; the results in order."""
        results: list[Any] = []
        outputs: list[OutputRecord] = []
        for key, value, p, o, t in events:
            op = self.operator(_int_arg("partition", p))
            out = op.apply_event(_key_bytes(key), value, offset=_int_arg("offset", o),
                                 timestamp_ms=_int_arg("timestamp_ms", t))
            if out is None:
                results.append(None)
                continue
            outputs.extend(out)
            results.append(op.result)
        if outputs:
            self._core().publish(outputs)
        return results

    def _apply_columns(self, keys: Any, values: Any, partitions: Any, offsets: Any, timestamps_ms: Any) -> int:
        """The batch form (see ``ScoreState.update_many``): every argument checked for every
        event first (a bad one raises and nothing changes), then per partition the column
        pipeline of the batch worker; outputs published once. The number of events applied
        (not below a restored snapshot's offset, not refused for their time)."""
        import numpy as np

        from grudge_stream.record_checks import EMPTY_KEY, MAX_TIMESTAMP_MS, key_too_long

        n = len(keys)
        if not (len(values) == len(partitions) == len(offsets) == len(timestamps_ms) == n):
            raise ValueError(f"keys, values, partitions, offsets and timestamps_ms must be as long as each other "
                             f"({n}, {len(values)}, {len(partitions)}, {len(offsets)}, {len(timestamps_ms)})")
        if n == 0:
            return 0
        if set(map(type, keys)) != {bytes}:
            keys = [_key_bytes(k) for k in keys]
        vals = _number_column("values", values, np.float64)
        if not np.isfinite(vals).all():
            i = int(np.flatnonzero(~np.isfinite(vals))[0])
            raise ValueError(f"values[{i}] is not finite ({vals[i]!r})")
        parts, offs, ts = (_number_column(name, col, np.int64) for name, col in
                           (("partitions", partitions), ("offsets", offsets), ("timestamps_ms", timestamps_ms)))
        for name, col, high in (("partitions", parts, None), ("offsets", offs, None),
                                ("timestamps_ms", ts, MAX_TIMESTAMP_MS)):
            if col.min() < 0 or (high is not None and col.max() > high):
                out_of_range = (col < 0) if high is None else ((col < 0) | (col > high))
                i = int(np.flatnonzero(out_of_range)[0])
                raise ValueError(f"{name}[{i}] is out of range ({int(col[i])})")
        first = int(parts[0])
        if (parts == first).all():
            groups: list[tuple[int, Any]] = [(first, None)]
        else:
            order = np.argsort(parts, kind="stable")
            cuts = np.flatnonzero(np.diff(parts[order])) + 1
            groups = [(int(parts[sel[0]]), sel) for sel in np.split(order, cuts)]
        ops = [(self.operator(p), sel) for p, sel in groups]  # StateNotReady before any change
        codec = ops[0][0].codec
        lengths = list(map(len, keys))
        if not codec.allow_empty_keys and min(lengths) == 0:
            raise ValueError(f"keys[{lengths.index(0)}]: {EMPTY_KEY}")
        if codec.max_key_bytes and max(lengths) > codec.max_key_bytes:
            i = next(j for j, m in enumerate(lengths) if m > codec.max_key_bytes)
            raise ValueError(f"keys[{i}]: {key_too_long(lengths[i], codec.max_key_bytes)}")
        columns = []
        for op, sel in ops:
            o, t, k, v = (offs, ts, keys, vals) if sel is None else (
                offs[sel], ts[sel], list(itemgetter(*sel.tolist())(keys)) if len(sel) > 1 else [keys[sel[0]]],
                vals[sel])
            if len(o) > 1 and not (np.diff(o) > 0).all():
                raise ValueError(f"offsets of partition {op.partition} must increase, event by event")
            columns.append((op, o.tolist(), t.tolist(), np.ascontiguousarray(t), k, np.ascontiguousarray(v)))
        outputs: list[OutputRecord] = []
        applied = 0
        for op, o, t_list, t, k, v in columns:
            before = op.counters["events"]
            out = op.process_values(o, t_list, t, k, v)
            if out is None:  # an operator that applies event by event: the per-call path
                out = []
                for j in range(len(o)):
                    out.extend(op.apply_event(k[j], float(v[j]), offset=o[j], timestamp_ms=t_list[j]) or ())
            outputs.extend(out)
            applied += op.counters["events"] - before
        if outputs:
            self._core().publish(outputs)
        return applied

    def describe(self, key: Any, partition: int, debug: bool = False) -> dict[str, Any]:
        """The key's current state in ``partition`` (score, raised, ...), read at the
        partition's watermark without changing anything; ``debug`` adds the per-level reads
        and cell indexes (``detail``, docs/serving.md: never hand them to the public)."""
        describe_key = getattr(self.operator(partition), "describe_key", None)
        if describe_key is None:
            raise TypeError(f"{self.kind} state answers no per-key reads")
        return cast("dict[str, Any]", describe_key(_key_bytes(key), debug))


class ScoreState(SketchState[FeedbackScoreOperator]):
    """Decaying feedback scores per key (``ScoreSketch``; ``score_mode="split"``: punishment
    and forgiveness apart, so colliding keys' forgiveness cannot hide an abuser), with an
    alert latch: a key is raised at ``raise_at`` and cleared at ``clear_at``.

    ``update(key, delta)`` adds ``delta`` at the event's time and returns the new score.
    Alerts go to ``alerts_topic`` (and the raised set to ``<alerts_topic>-state``, which
    ``grudge_stream.client.AlertView`` follows); ``scores_topic`` gets score records on
    crossings (``emit_scores``)."""

    kind = "scores"
    backfill_columns = True  # update_many's pipeline

    def __init__(self, name: str, *, source_topic: str, sketch: Any, raise_at: float, clear_at: float,
                 hash_key: HashKey | None, alerts_topic: str | None = None, scores_topic: str | None = None,
                 score_mode: str = "split", emit_scores: str = "crossings", latch_capacity: int | None = None,
                 sweep_interval_ms: int = 10_000, max_future_ms: int | str | None = "auto",
                 max_late_ms: int | str | None = "auto", public_keys: bool = True, **kw: Any) -> None:
        from grudge_stream.operators.alerts import LATCH_CAPACITY
        common = _common(name, source_topic, hash_key, public_keys, max_future_ms, max_late_ms)
        codec = EventCodec(value_field="delta")
        capacity = LATCH_CAPACITY if latch_capacity is None else latch_capacity

        def make_operator(partition: int) -> FeedbackScoreOperator:
            return FeedbackScoreOperator(operator_id=name, source_topic=source_topic, partition=partition,
                                         sketch=sketch, codec=codec, raise_at=raise_at, clear_at=clear_at,
                                         emit_scores=emit_scores, score_mode=score_mode,
                                         latch_capacity=capacity, sweep_interval_ms=sweep_interval_ms,
                                         **common)

        _check_config(make_operator)
        alerts = alerts_topic or f"{name}-alerts"
        super().__init__(name, source_topic=source_topic, make_operator=make_operator, operator_id=name,
                         outputs={"alerts": alerts, "scores": scores_topic}, **kw)

    def update(self, key: Any, delta: float, *, partition: int | None = None, offset: int | None = None,
               timestamp_ms: int | None = None) -> float | None:
        """Add ``delta`` to ``key``'s score at the event's time; the new score (None: the
        event was already reflected, or refused for its time)."""
        if partition is None and offset is None and timestamp_ms is None and self.current_position is not None:
            partition, offset, timestamp_ms = self.current_position()
        core = self.core
        # The common event (bytes key, float delta, int position, in order, no timer due)
        # in as few steps as the sketch allows; any other through ``apply``, the same rules.
        if (core is not None and type(key) is bytes and type(delta) is float and type(partition) is int
                and type(offset) is int and type(timestamp_ms) is int and offset >= 0):
            slot = core.slots.get(partition)
            if slot is not None:
                op = cast(FeedbackScoreOperator, slot.operator)
                out = op.update_in_order(key, delta, offset, timestamp_ms)
                if out is not None:
                    if out:
                        core.publish(out)
                    return op.result  # type: ignore[no-any-return]
        result = self.apply(key, delta, partition=partition, offset=offset, timestamp_ms=timestamp_ms)
        return None if result is None else float(result)

    def update_many(self, keys: Any, deltas: Any, *, partitions: Any, offsets: Any, timestamps_ms: Any) -> int:
        """The batch form of ``update``: columns of what a loop already has (lists or numpy
        arrays, one entry per event: keys as bytes or str, deltas, partitions, offsets,
        timestamps in ms), applied as the batch worker applies a batch: per partition, one
        pass of the column pipeline (the sketch updated by one call, only the events that can
        change an alert looked at one by one). Each partition's events in offset order; any
        bad entry raises ``TypeError`` / ``ValueError`` naming it, and nothing changes.
        Returns how many events were applied (those below a restored snapshot's offset are
        skipped, those refused for their time dead-lettered); outputs are published once."""
        return self._apply_columns(keys, deltas, partitions, offsets, timestamps_ms)

    def update_messages(self, messages: Any, deltas: Any) -> int:
        """``update_many`` over confluent-kafka ``Message`` objects of the source topic (a
        ``consume()`` batch without its error messages) and one delta per message."""
        if {m.topic() for m in messages} - {self.source_topic}:
            raise ValueError(f"messages of other topics than {self.source_topic!r}")
        return self._apply_columns([m.key() for m in messages], deltas, [m.partition() for m in messages],
                                   [m.offset() for m in messages], [m.timestamp()[1] for m in messages])

    def score(self, key: Any, partition: int) -> float:
        return float(self.describe(key, partition)["score"])

    def raised(self, key: Any, partition: int) -> bool:
        return _key_bytes(key) in self.operator(partition).latch


class RateLimitState(SketchState[RateLimitOperator]):
    """Token buckets per key (``TokenBucketConfig``: ``rate_per_s``, ``burst``):
    ``try_update(key, cost)`` spends ``cost`` tokens if the key has them and returns
    ``(allowed, retry_after_ms)``. Decisions go to ``decisions_topic`` if one is given."""

    kind = "rate_limit"

    def __init__(self, name: str, *, source_topic: str, bucket: Any, hash_key: HashKey | None,
                 decisions_topic: str | None = None, emit: str = "all",
                 max_future_ms: int | str | None = "auto", max_late_ms: int | str | None = "auto",
                 public_keys: bool = True, **kw: Any) -> None:
        common = _common(name, source_topic, hash_key, public_keys, max_future_ms, max_late_ms)
        if kw.get("overrides") and not decisions_topic:
            raise ValueError("overrides: a rate limiter follows <decisions_topic>-overrides; give decisions_topic")
        codec = EventCodec(value_field="cost")

        def make_operator(partition: int) -> RateLimitOperator:
            return RateLimitOperator(operator_id=name, source_topic=source_topic, partition=partition,
                                     bucket=bucket, codec=codec, emit=emit, request_id_field=None,
                                     request_id_header=None, **common)

        _check_config(make_operator)
        super().__init__(name, source_topic=source_topic, make_operator=make_operator, operator_id=name,
                         outputs={"decisions": decisions_topic}, **kw)

    def try_update(self, key: Any, cost: float = 1.0, *, partition: int | None = None,
                   offset: int | None = None, timestamp_ms: int | None = None) -> tuple[bool, int | None] | None:
        """Spend ``cost`` tokens of ``key``'s bucket if it has them: ``(allowed,
        retry_after_ms)`` (None: the event was already reflected, or refused for its time)."""
        return cast("tuple[bool, int | None] | None",
                    self.apply(key, cost, partition=partition, offset=offset, timestamp_ms=timestamp_ms))


class HeavyHitterState(SketchState[HeavyHitterOperator]):
    """Decayed counts per key (``DecayingCountMin``, ``CountMinConfig``) with top-k and an
    alert latch on the estimate: ``add(key, count)`` returns the key's estimate."""

    kind = "heavy_hitters"

    def backfill_value(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"count must be an int, not {type(value).__name__}")
        return value

    def __init__(self, name: str, *, source_topic: str, sketch: Any, raise_at: float, clear_at: float,
                 hash_key: HashKey | None, top_k: int = 100, alerts_topic: str | None = None,
                 reports_topic: str | None = None, report_interval_ms: int = 10_000,
                 max_future_ms: int | str | None = "auto", max_late_ms: int | str | None = "auto",
                 public_keys: bool = True, **kw: Any) -> None:
        common = _common(name, source_topic, hash_key, public_keys, max_future_ms, max_late_ms)
        codec = EventCodec(value_field="count")

        def make_operator(partition: int) -> HeavyHitterOperator:
            return HeavyHitterOperator(operator_id=name, source_topic=source_topic, partition=partition,
                                       sketch=sketch, codec=codec, raise_at=raise_at, clear_at=clear_at,
                                       top_k=top_k, report_interval_ms=report_interval_ms, **common)

        _check_config(make_operator)
        super().__init__(name, source_topic=source_topic, make_operator=make_operator, operator_id=name,
                         outputs={"alerts": alerts_topic or f"{name}-alerts", "reports": reports_topic}, **kw)

    def add(self, key: Any, count: int = 1, *, partition: int | None = None, offset: int | None = None,
            timestamp_ms: int | None = None) -> int | None:
        """Count ``key`` ``count`` times at the event's time; its estimate."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an int, not {type(count).__name__}")
        est = self.apply(key, count, partition=partition, offset=offset, timestamp_ms=timestamp_ms)
        return None if est is None else int(est)

    def top(self, partition: int, k: int | None = None) -> list[tuple[bytes, int]]:
        """The partition's heaviest keys at its watermark, heaviest first."""
        op = self.operator(partition)
        if op.watermark is None:
            return []
        return [(key, int(est)) for key, est in op.sketch.top(k or op.top_k, now_ms=op.watermark)]


class ForgettingSetState(SketchState[DedupOperator]):
    """A set that forgets (``ForgettingBloom``, ``BloomConfig``): ``add_if_absent(key)``
    returns True the first time a key is seen inside the window (false positives
    possible: a new key may be taken for a known one, at the configured rate)."""

    kind = "forgetting_set"

    def backfill_value(self, value: Any) -> Any:
        return None  # any value but None adds the key, as add_if_absent

    def __init__(self, name: str, *, source_topic: str, bloom: Any, hash_key: HashKey | None,
                 max_future_ms: int | str | None = "auto", max_late_ms: int | str | None = "auto",
                 public_keys: bool = True, **kw: Any) -> None:
        common = _common(name, source_topic, hash_key, public_keys, max_future_ms, max_late_ms)
        codec = EventCodec(encoding="raw")

        def make_operator(partition: int) -> DedupOperator:
            return DedupOperator(operator_id=name, source_topic=source_topic, partition=partition,
                                 bloom=bloom, codec=codec, **common)

        _check_config(make_operator)
        super().__init__(name, source_topic=source_topic, make_operator=make_operator, operator_id=name,
                         outputs={}, **kw)

    def add_if_absent(self, key: Any, *, partition: int | None = None, offset: int | None = None,
                      timestamp_ms: int | None = None) -> bool | None:
        """Add ``key``; True if it was not in the set (None: the event was already reflected)."""
        result = self.apply(key, None, partition=partition, offset=offset, timestamp_ms=timestamp_ms)
        return None if result is None else bool(result)

    def contains(self, key: Any, partition: int) -> bool:
        return bool(self.describe(key, partition)["seen"])


def _number_column(name: str, column: Any, dtype: Any) -> Any:
    """``column`` (a list, tuple or 1-d numpy array) as a contiguous array of ``dtype``
    (``np.float64``: numbers; ``np.int64``: ints); anything else in it (strings, None,
    booleans, floats for ints) is a TypeError. A list is converted with its type known,
    which costs a fraction of numpy's guessing."""
    import numpy as np

    ints = dtype is np.int64
    what = "ints" if ints else "numbers"
    if isinstance(column, np.ndarray):
        if column.ndim != 1 or column.dtype.kind not in ("iu" if ints else "fiu"):
            raise TypeError(f"{name} must be a column of {what}, not of {column.dtype} (shape {column.shape})")
        return np.ascontiguousarray(column, dtype=dtype)
    allowed = (int, np.integer) if ints else (int, float, np.integer, np.floating)
    for t in set(map(type, column)):
        if t is bool or not issubclass(t, allowed):
            raise TypeError(f"{name} must be a column of {what}, not of {t.__name__}")
    try:
        return np.fromiter(column, dtype=dtype, count=len(column))
    except OverflowError:
        raise ValueError(f"{name}: a value out of the int64 range") from None


def _common(name: str, source_topic: str, hash_key: HashKey | None, public_keys: bool,
            max_future_ms: int | str | None, max_late_ms: int | str | None) -> dict[str, Any]:
    """The operator arguments every kind takes, checked before anything is built."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, not {name!r}")
    if not isinstance(source_topic, str) or not source_topic:
        raise ValueError(f"source_topic must be a non-empty string, not {source_topic!r}")
    if hash_key is not None and not isinstance(hash_key, HashKey):
        raise TypeError(f"hash_key must be a grudge_stream.hashkey.HashKey, not {type(hash_key).__name__}")
    if hash_key is None and public_keys:
        raise ConfigError(
            f"state {name!r} needs a secret hash_key: its keys come from the public, and with a known "
            "key anyone can frame a key or hide one (docs/security.md). Pass "
            "hash_key=HashKey.parse(<32 hex digits>), or public_keys=False for keys you choose yourself")
    return {"hash_key": hash_key, "max_future_ms": max_future_ms, "max_late_ms": max_late_ms}


def _check_config(make_operator: Callable[[int], Operator]) -> None:
    """Build one operator now, so a bad config is refused where the state is declared.
    (A one-off cost at declaration, as a sketch's size; reading the state's names later
    builds nothing.)"""
    try:
        make_operator(0)
    except ValueError as exc:
        if "siphash" in str(exc):
            raise ConfigError("the sketch config's hasher must be 'siphash' when a hash_key is given "
                              "(hasher=\"siphash\")") from None
        raise
