"""The machinery of every embedded state (``grudge_stream.state``): ``SketchState``.

A ``SketchState`` holds one operator per partition of its source topic, in the slots of a
worker core of its own (``core``, a ``grudge_stream.runtime.core.WorkerCore``, held by its
``grudge_stream.runtime.embedded.EmbeddedCore``, ``embedded``), started on first
use: connecting and creating its topics (``start``), restores on assignment (``assign``),
snapshots taken at a batch boundary and written off the caller's loop (``take_snapshots``,
``write_snapshots``, ``checkpoint``), revocation and ``close``; per event, ``apply`` and
the batch forms (``apply_many``, the column pipeline behind ``update_many``). The kinds
(``ScoreState``, ``RateLimitState``, ...) are in ``grudge_stream.state``, which also
exposes this base and ``StateNotReady``.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Mapping, TypeVar, cast

from grudge_stream.checkpoint import SnapshotWrite
from grudge_stream.exceptions import GrudgeError
from grudge_stream.operators.base import Operator
from grudge_stream.operators.records import OutputRecord
from grudge_stream.sections import (Checkpointing, EventTime, Group, Identity, KafkaClient, Sections, Serving,
                                    overrides, sections)
from grudge_stream.settings import Settings
from grudge_stream.state_checks import int_arg, key_bytes, number_column
from grudge_stream.topology import Topology

if TYPE_CHECKING:
    from grudge_stream.runtime.core import WorkerCore
    from grudge_stream.runtime.embedded import EmbeddedCore

OpT = TypeVar("OpT", bound=Operator)

__all__ = ["OpT", "SketchState", "StateNotReady"]

log = logging.getLogger("grudge_stream.state")


class StateNotReady(GrudgeError, RuntimeError):
    """The state holds no restored sketch for the partition asked for: used before its
    runtime started, before the partition was assigned, or after it was revoked."""


@dataclass(frozen=True)
class StateContext:
    """What a runtime binding tells a state it attaches (``SketchState.bind_context``); a
    state not attached to a runtime has the empty context.

    - ``current_position``: the (partition, offset, timestamp_ms) of the event being handled,
      for calls that give none (inside a Faust agent);
    - ``restore_on_demand``: restore a partition the runtime has assigned but not yet
      restored, on its first use;
    - ``app_connection``: the cluster of the app, as ``(bootstrap servers, client properties,
      what could not be carried over)``, used for whichever of bootstrap_servers /
      client_config the state was not given;
    - ``app_group``: the app's consumer group, the position a backfill fills the state up to.
    """

    current_position: Callable[[], tuple[int, int, int]] | None = None
    restore_on_demand: Callable[[int], None] | None = None
    app_connection: Callable[[], tuple[str, dict[str, Any], str | None]] | None = None
    app_group: str | None = None


# Settings an embedded state takes as its kind's arguments instead (event time, the hash key)
# or never reads (the topics' shape): refused by name rather than ignored.
_NOT_EMBEDDED = {f for cls in (EventTime, Identity) for f in cls.__dataclass_fields__} | {"event_time", "identity"}


def _embedded_settings(settings: Settings | None, given: dict[str, Any]) -> tuple[Settings, dict[str, Any]]:
    """``settings`` (default: the environment's), with the sections and keyword arguments
    given over its overrides; and those (parsed)."""
    refused = sorted(name for name in given if name in _NOT_EMBEDDED)
    if refused:
        raise TypeError(f"an embedded state does not take {', '.join(refused)}: its event-time bounds and hash "
                        "key are the kind's own arguments (max_future_ms, max_late_ms, hash_key)")
    extra = overrides(given)
    if settings is None:
        return Settings(extra), extra
    if not extra:
        return settings, extra
    return Settings({**settings.overrides, **extra}, environ=settings.environ), extra


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
      own decides itself when to call ``checkpoint``); default that of ``checkpointing``,
      else 5;
    - the worker settings the state's clients read (docs/embedding.md, "Settings"): as
      sections, ``kafka=KafkaClient(...)``, ``group=Group(...)``,
      ``checkpointing=Checkpointing(...)``, ``serving=Serving(...)``
      (``grudge_stream.sections``), and one by one by their names
      (``broker_wait_s=30``, ``sasl_username="app"``), the latter over the former; what is
      not given comes from the ``GRUDGE_<NAME>`` environment variables, else the declared
      defaults. A bad value is a ``ConfigError`` of one line, here. Event-time bounds and
      the hash key are the kind's own arguments (``max_future_ms``, ``hash_key``, ...);
    - ``settings``: the old way, a whole ``grudge_stream.settings.Settings`` (the sections
      and keyword arguments go over its overrides);
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
                 checkpoint_interval_s: float | None = None, overrides: bool = False,
                 settings: Settings | None = None, kafka: KafkaClient | None = None, group: Group | None = None,
                 checkpointing: Checkpointing | None = None, serving: Serving | None = None,
                 **common: Any) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        if not isinstance(source_topic, str) or not source_topic:
            raise ValueError("source_topic must be a non-empty string")
        self._settings, given = _embedded_settings(settings, dict(kafka=kafka, group=group, checkpointing=checkpointing,
                                                           serving=serving, **common))
        # Every worker setting the state reads, parsed and checked once (a bad one fails here).
        self.sections: Sections = sections(self._settings)
        if checkpoint_interval_s is None:
            checkpoint_interval_s = self.sections.checkpointing.checkpoint_interval_s
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
        # Brokers given as an argument (or in ``kafka``) go before those of an app the state attaches to.
        self._bootstrap = bootstrap_servers or given.get("bootstrap_servers")
        self._client_config = dict(client_config or {})
        self._client_config_given = client_config is not None
        self.core: WorkerCore | None = None  # the worker core (None until started), held by:
        self.embedded: EmbeddedCore | None = None
        self._follower: Any = None
        # Restores and start-up run in a runtime's executor threads and, on first use, on its
        # event loop: one at a time.
        self._lock = threading.RLock()
        # What the runtime binding the state is attached to tells it (bind_context); none yet.
        self.context = StateContext()

    def bind_context(self, context: StateContext) -> None:
        """Called by a runtime binding (grudge_stream.faust, grudge_stream.quix) when it
        attaches the state, and again when it changes what it tells (the Faust binding's
        pages sample the agents' keys): the one way a state learns about its runtime."""
        self.context = context

    @property
    def current_position(self) -> Callable[[], tuple[int, int, int]] | None:
        """The runtime's position of the event being handled, if it has one (``StateContext``)."""
        return self.context.current_position

    @property
    def restore_on_demand(self) -> Callable[[int], None] | None:
        """How the runtime restores an assigned partition on first use (``StateContext``)."""
        return self.context.restore_on_demand

    @property
    def app_connection(self) -> Callable[[], tuple[str, dict[str, Any], str | None]] | None:
        """The cluster of the app the state is attached to (``StateContext``)."""
        return self.context.app_connection

    @property
    def app_group(self) -> str | None:
        """The consumer group of the app the state is attached to (``StateContext``)."""
        return self.context.app_group

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
            check_connection(self._settings, wait_s=self.sections.kafka.broker_wait_s,
                             bootstrap_servers=self._bootstrap,
                             properties={**client_properties(self._settings), **self._client_config})
            if create_topics:
                ensure_topics(self.topology, self._settings, self._bootstrap, self._client_config)
            embedded = EmbeddedCore(self.topology, self._settings, bootstrap_servers=self._bootstrap,
                                    client_config=self._client_config)
            core = embedded.core
            if self.topology.overrides_topic:
                from grudge_stream.overrides import start_override_follower

                # Before any partition is restored: every operator judges with the table.
                followed = start_override_follower(self.topology, core.bootstrap, core.client_config,
                                                   signing=getattr(core, "signing", None))
                self._follower = followed[1] if followed else None
            self.core, self.embedded = core, embedded
        return self

    def _embedded(self) -> EmbeddedCore:
        self._core()
        return cast("EmbeddedCore", self.embedded)

    def _core(self) -> WorkerCore:
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
            p = int_arg("partition", p)
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
        return self._embedded().take_snapshots()

    def write_snapshots(self, taken: list[SnapshotWrite], should_stop: Callable[[], bool] | None = None
                        ) -> dict[int, int]:
        """Deliver every output produced so far, then write ``taken`` (blocking: run it off
        an event loop). Returns the offsets now safe to commit, per partition."""
        return self._embedded().write_taken(taken, should_stop)

    def checkpoint(self, positions: Mapping[int, int] | None = None) -> dict[int, int]:
        """``take_snapshots`` then ``write_snapshots``: the offsets safe to commit (every
        partition held, up to its newest durable snapshot)."""
        core = self._core()
        self.write_snapshots(self.take_snapshots(positions))
        return {p: o for p, o in core.limits.limits.items() if p in core.slots}

    def commit_limit(self, partition: int) -> int | None:
        """The offset a commit of ``partition`` must not pass (its newest durable snapshot)."""
        return self.core.limits.limits.get(partition) if self.core is not None else None

    def revoke(self, partitions: Iterable[int], *, snapshot: bool = True) -> None:
        """Let ``partitions`` go, with a last snapshot of each first (unless ``snapshot``
        is false, when a snapshot could cover outputs that are lost)."""
        core, embedded = self._core(), self._embedded()
        parts = [p for p in partitions if p in core.slots]
        if snapshot and parts:
            try:
                embedded.write_taken(embedded.take_snapshots(parts), None)
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
        core, embedded = self.core, self.embedded
        if core is None or embedded is None:
            return
        try:
            if snapshot and core.slots:
                embedded.write_taken(embedded.take_snapshots(), lambda: True)
        finally:
            embedded.close()
            self.core = self.embedded = None
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
        return int_arg("partition", partition), int_arg("offset", offset), int_arg("timestamp_ms", timestamp_ms)

    def apply(self, key: Any, value: Any, *, partition: int | None = None, offset: int | None = None,
              timestamp_ms: int | None = None) -> Any:
        """Apply one event and publish its outputs; what the operator computed for it (the
        kinds' methods name it), or None when the event was already reflected in the state
        (below a restored snapshot's offset) or dead-lettered for its time."""
        k = key_bytes(key)
        p, o, t = self._position(partition, offset, timestamp_ms)
        op = self.operator(p)
        out = op.apply_event(k, value, offset=o, timestamp_ms=t)
        if out is None:
            return None
        if out:
            self._core().publisher.publish(out)
        return op.result

    def apply_many(self, events: Iterable[tuple[Any, Any, int, int, int]]) -> list[Any]:
        """``apply`` over ``(key, value, partition, offset, timestamp_ms)`` tuples, outputs
        published once for the batch; the results in order."""
        results: list[Any] = []
        outputs: list[OutputRecord] = []
        for key, value, p, o, t in events:
            op = self.operator(int_arg("partition", p))
            out = op.apply_event(key_bytes(key), value, offset=int_arg("offset", o),
                                 timestamp_ms=int_arg("timestamp_ms", t))
            if out is None:
                results.append(None)
                continue
            outputs.extend(out)
            results.append(op.result)
        if outputs:
            self._core().publisher.publish(outputs)
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
            keys = [key_bytes(k) for k in keys]
        vals = number_column("values", values, np.float64)
        if not np.isfinite(vals).all():
            i = int(np.flatnonzero(~np.isfinite(vals))[0])
            raise ValueError(f"values[{i}] is not finite ({vals[i]!r})")
        parts, offs, ts = (number_column(name, col, np.int64) for name, col in
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
            self._core().publisher.publish(outputs)
        return applied

    def describe(self, key: Any, partition: int, debug: bool = False) -> dict[str, Any]:
        """The key's current state in ``partition`` (score, raised, ...), read at the
        partition's watermark without changing anything; ``debug`` adds the per-level reads
        and cell indexes (``detail``, docs/serving.md: never hand them to the public)."""
        describe_key = getattr(self.operator(partition), "describe_key", None)
        if describe_key is None:
            raise TypeError(f"{self.kind} state answers no per-key reads")
        return cast("dict[str, Any]", describe_key(key_bytes(key), debug))

