"""The operator contract: a batch of source records in, output records out.

Operators are transport-free: they import nothing from Faust or Kafka, so the
Faust runtime, the replay runner and unit tests all drive the same code. One
operator instance serves one source partition and holds that partition's
sketch(es).

Per record, in offset order:

1. records below ``next_offset`` are skipped (they are already reflected in
   the state, e.g. after a restore from a snapshot);
2. the record is decoded and validated; a bad one becomes a dead letter (the
   original bytes, cut to fit the dead-letter topic, its source coordinates and
   a reason) and touches nothing;
3. event time is bounded (docs/runtime.md, "Event time under attack"): a
   timestamp more than ``max_future_ms`` ahead of processing time is not
   trusted: the event is applied at the current watermark (or dead-lettered,
   ``future_policy``), so a skewed record never drags the watermark ahead,
   whatever the partition's lag; one more than ``max_late_ms`` behind the
   watermark is dead-lettered (or only counted, ``late_policy``) instead of
   being applied with a weight of about zero;
4. the partition's watermark advances to ``max(watermark, event time)``; the
   sketch runs at the watermark, never at wall-clock time, so a replay of the
   same records reproduces the same state and outputs;
5. ``next_offset`` becomes ``offset + 1``.

Every consumed record so ends one way: applied, dead-lettered, or counted in
``late_dropped`` (``late_policy="count"``).

Processing is split-invariant: feeding records in one batch or in any
sequence of smaller batches gives identical outputs and identical snapshots.
"""
from __future__ import annotations

import abc
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from grudge_stream import envelope
from grudge_stream.exceptions import ConfigError
from grudge_stream.hashkey import HashKey, key_fingerprint
from grudge_stream.operators.codec import BadRecord, Event, EventCodec
from grudge_stream.operators.columns import Columns, Run
# The dead letters, the snapshot format and the column path have modules of their own; their
# names stay importable from here.
from grudge_stream.operators.deadletters import (DEAD_LETTER_KEY_BYTES, DEFAULT_DEAD_LETTER_LIMIT, REASON_CLASSES,
                                                 dead_letter_record, reason_class)
from grudge_stream.operators.pipeline import columnar
from grudge_stream.operators.records import TICK_KEY, OutputRecord, SourceRecord
from grudge_stream.operators.snapshots import (SNAPSHOT_VERSION, differences, read_snapshot, restore_snapshot,
                                               take_snapshot)

__all__ = ["AUTO", "DEAD_LETTER_KEY_BYTES", "DEFAULT_DEAD_LETTER_LIMIT", "FUTURE_POLICIES", "LATE_POLICIES",
           "REASON_CLASSES", "SNAPSHOT_VERSION", "Operator", "OperatorContext", "dead_letter_record",
           "default_time_bounds", "differences", "read_snapshot", "reason_class"]

FUTURE_POLICIES = ("clamp", "dead_letter")
LATE_POLICIES = ("dead_letter", "count")
AUTO = "auto"


@dataclass(frozen=True)
class OperatorContext:
    """What a runtime hands each operator it builds (``Topology.operator``), as Kafka
    Streams hands a processor its ``ProcessorContext``: where the operator runs and what
    the deployment around it provides. The operator's own settings come with its
    constructor; none of this is state, and none of it is snapshotted.

    - ``partition``: the source partition it serves;
    - ``partition_count``: the source topic's partition count (None: not known yet);
      reports that merge over partitions carry it;
    - ``overrides``: the deployment's allow / deny table (``grudge_stream.overrides``),
      None without one; operators that judge keys consult it first;
    - ``dead_letter_limit``: the largest dead letter the dead-letter topic takes (bytes).
    """

    partition: int
    partition_count: int | None = None
    overrides: Any = None
    dead_letter_limit: int = DEFAULT_DEAD_LETTER_LIMIT


def default_time_bounds(time_scale_ms: float | None) -> tuple[int, int]:
    """``(max_future_ms, max_late_ms)`` scaled to an operator's decay time constant.

    Future: 5% of the time constant, within [1 s, 60 s]: records stamped that far ahead
    cost at most ~5% of a late event's weight. Late: 14 time constants (a weight of
    e^-14 ~ 1e-6 is noise), within [60 s, 1 day]. Without a time constant: 60 s and 1 day.
    """
    if not time_scale_ms or time_scale_ms <= 0 or time_scale_ms != time_scale_ms:
        return 60_000, 86_400_000
    fut = int(min(60_000, max(1_000, 0.05 * time_scale_ms)))
    late = int(min(86_400_000, max(60_000, 14 * time_scale_ms)))
    return fut, late


class Operator(abc.ABC):
    """Base class of every grudge-stream operator (one instance per source partition)."""

    kind: ClassVar[str] = "operator"
    # Keys of config_dict() that shape the state (the rest is policy: thresholds, emit modes,
    # intervals); a snapshot is only adopted under the same state-shaping settings.
    state_keys: ClassVar[tuple[str, ...]] = ()
    # True for operators that forward source records (their headers travel on): the runtimes
    # then hand them SourceRecords with ``headers``; the others get the header-free columns.
    needs_headers: ClassVar[bool] = False
    # The deployment's allow / deny table, from the context (``init``); None without one.
    overrides: Any = None

    def __init__(self, *, operator_id: str, source_topic: str, partition: int,
                 codec: EventCodec, max_future_ms: int | str | None = AUTO,
                 future_policy: str = "clamp", max_late_ms: int | str | None = AUTO,
                 late_policy: str = "dead_letter", hash_key: HashKey | None = None) -> None:
        """Common operator settings.

        - ``max_future_ms``: how far ahead of processing time (the wall clock when the
          record is processed) an event time may be; ``"auto"`` scales it to the decay
          (``default_time_bounds``), ``None`` disables the bound.
        - ``future_policy``: ``clamp`` (default: the event is applied at the current
          watermark — its evidence kept, its timestamp ignored) or ``dead_letter``.
        - ``max_late_ms``: how far behind the watermark an event may be and still be
          applied (``"auto"``: scaled to the decay; ``None``: no bound).
        - ``late_policy``: ``dead_letter`` (default) or ``count`` (only counted).
        - ``hash_key``: the secret SipHash key of sketches over public keys; never
          serialized, only its fingerprint (``grudge_stream.hashkey``).
        """
        if not operator_id:
            raise ConfigError("operator_id must be a non-empty string")
        if partition < 0:
            raise ConfigError("partition must be >= 0")
        for name, v in (("max_future_ms", max_future_ms), ("max_late_ms", max_late_ms)):
            if v is not None and v != AUTO and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"{name} must be 'auto', None or an integer >= 0, not {v!r}")
        if future_policy not in FUTURE_POLICIES:
            raise ConfigError(f"future_policy must be one of {FUTURE_POLICIES}, not {future_policy!r}")
        if late_policy not in LATE_POLICIES:
            raise ConfigError(f"late_policy must be one of {LATE_POLICIES}, not {late_policy!r}")
        if hash_key is not None and not isinstance(hash_key, HashKey):
            raise ConfigError("hash_key must be a grudge_stream.hashkey.HashKey")
        self.operator_id = operator_id
        self.source_topic = source_topic
        self.partition = partition
        self.codec = codec
        self._time_bounds_raw = (max_future_ms, max_late_ms)
        self._time_bounds: tuple[int | None, int | None] | None = None
        self.future_policy = future_policy
        self.late_policy = late_policy
        self.hash_key = hash_key
        # The dead-letter topic's message limit; runtimes set it from the broker.
        self.dead_letter_limit = DEFAULT_DEAD_LETTER_LIMIT
        # The source topic's partition count, when a runtime knows it (reports that a merge
        # over partitions needs carry it); not state: a count change is refused at restore.
        self.source_partition_count: int | None = None
        self.next_offset: int | None = None
        self.watermark: int | None = None
        # Deterministic functions of the record stream: part of the snapshot.
        # Dead letters per reason class (``reason_class``), for the metrics: not snapshotted.
        self.dead_letter_reasons: dict[str, int] = {}
        self.counters: dict[str, int] = {"events": 0, "dead_letters": 0, "late": 0,
                                         "future_clamped": 0, "late_dropped": 0}
        # Records below next_offset that a runtime re-delivered (not state: differs per run).
        self.skipped = 0
        # What the last applied event computed (a score, a decision, ...), for embedded state:
        # ``apply`` sets it, ``apply_event`` clears it first (None: not applied).
        self.result: Any = None
        # Event-time timers (``every``): name -> interval, and name -> next due time.
        self._timer_intervals: dict[str, int] = {}
        self.timers: dict[str, int | None] = {}

    def init(self, context: OperatorContext) -> None:
        """Take what the runtime provides (``OperatorContext``); called once, before the
        first record or restore, by ``Topology.operator``."""
        if context.partition != self.partition:
            raise ValueError(f"operator for {self.source_topic}[{self.partition}] got the context of "
                             f"partition {context.partition}")
        self.source_partition_count = context.partition_count
        self.dead_letter_limit = context.dead_letter_limit
        self.overrides = context.overrides

    # -- event-time timers --------------------------------------------------------------------

    def every(self, name: str, interval_ms: int) -> None:
        """Call ``on_timer(name, ...)`` each time the watermark crosses a multiple of
        ``interval_ms``: before the first event at or past the due time, at that event's
        watermark, once however many multiples it crossed. The first event only arms it.
        Due times are state (snapshot scalar ``next_<name>``)."""
        if interval_ms < 1:
            raise ConfigError(f"{name}_interval_ms must be >= 1")
        self._timer_intervals[name] = int(interval_ms)
        self.timers[name] = None

    def on_timer(self, name: str, now_ms: int, rec: SourceRecord, out: list[OutputRecord]) -> None:
        """A timer of ``every`` is due at watermark ``now_ms``; ``rec`` is the record whose
        event made it due (outputs cite it as their source)."""

    def fire_timers(self, now_ms: int, rec: SourceRecord, out: list[OutputRecord]) -> None:
        """Arm or fire every timer for an event at watermark ``now_ms`` (before it is applied)."""
        for name, interval in self._timer_intervals.items():
            due = self.timers[name]
            if due is None:
                self.timers[name] = (now_ms // interval + 1) * interval
            elif now_ms >= due:
                self.on_timer(name, now_ms, rec, out)
                self.timers[name] = (now_ms // interval + 1) * interval

    def next_timer(self) -> int | None:
        """The earliest armed due time (None: none armed, or no timers)."""
        due = [t for t in self.timers.values() if t is not None]
        return min(due) if due else None

    def time_scale_ms(self) -> float | None:
        """The operator's decay time constant in ms (None: no decay); scales the time bounds."""
        return None

    def _bounds(self) -> tuple[int | None, int | None]:
        if self._time_bounds is None:
            fut, late = self._time_bounds_raw
            dfut, dlate = default_time_bounds(self.time_scale_ms())
            self._time_bounds = (dfut if fut == AUTO else fut, dlate if late == AUTO else late)
        return self._time_bounds

    @property
    def max_future_ms(self) -> int | None:
        return self._bounds()[0]

    @property
    def max_late_ms(self) -> int | None:
        return self._bounds()[1]

    def _keyed(self, sketch: Any) -> Any:
        """``sketch`` hashing under this operator's secret key (if it has one)."""
        if self.hash_key is not None:
            sketch.use_hash_key(self.hash_key.material)
        return sketch

    # -- identity -----------------------------------------------------------------------------

    @abc.abstractmethod
    def config_dict(self) -> dict:
        """Everything that decides this operator's state, the sketch seed included."""

    def full_config(self) -> dict:
        return {
            "kind": self.kind,
            "operator_id": self.operator_id,
            "codec": self.codec.to_dict(),
            "max_future_ms": self.max_future_ms,
            "future_policy": self.future_policy,
            "max_late_ms": self.max_late_ms,
            "late_policy": self.late_policy,
            "hash_key": key_fingerprint(self.hash_key),
            **self.config_dict(),
        }

    def state_config(self) -> dict:
        """The settings that shape the state: a snapshot taken under others is foreign.

        The codec's key, time and encoding choices decide which key an event counts for;
        outcome values, bounds and key checks only decide what future events do."""
        codec = self.codec.to_dict()
        conf = self.config_dict()
        return {
            "kind": self.kind,
            "operator_id": self.operator_id,
            "codec": {k: codec[k] for k in ("encoding", "key_field", "time_field")},
            "hash_key": key_fingerprint(self.hash_key),
            **{k: conf[k] for k in self.state_keys},
        }

    @property
    def fingerprint(self) -> str:
        """Identity of the state's shape (``state_config``); policy settings are not part of it."""
        return envelope.fingerprint(self.state_config())

    # -- processing: one pipeline ---------------------------------------------------------------

    # A late event's value is weighted by exp(-late_decay_per_ms * lateness) on the column path
    # (``Run.weighted``, for a vectorized ``apply_columns``); ``apply`` gets the lateness itself.
    late_decay_per_ms: float = 0.0
    # True when ``validate_event`` reads state that applying the batch's earlier events changes:
    # such an operator's events are checked and applied one record at a time.
    validates_against_state: ClassVar[bool] = False
    # (``_columns_pay()``, ``validate_event`` overridden): set by the first batch.
    _traits: tuple[bool, bool] | None = None

    def process(self, records: Sequence[SourceRecord], processing_ms: int | None = None) -> list[OutputRecord]:
        """Process records of this partition in offset order; ``processing_ms`` is the
        processing time the future bound is measured from (default: the wall clock now).
        The records keep their headers (what ``needs_headers`` operators read); otherwise
        this is ``process_columns``: one pipeline."""
        topic, partition = self.source_topic, self.partition
        for rec in records:
            if rec.partition != partition or rec.topic != topic:
                raise ValueError(
                    f"operator for {topic}[{partition}] got a record of {rec.topic}[{rec.partition}]"
                )
        if not records:
            return []
        return self._pipeline(Columns.of_records(topic, partition, records), processing_ms)

    def process_columns(self, topic: str, partition: int, offsets: list, timestamps: list,
                        keys: list, values: list, processing_ms: int | None = None) -> list[OutputRecord]:
        """``process`` over one partition's records given as columns (what batch runtimes
        read, without headers)."""
        if partition != self.partition or topic != self.source_topic:
            raise ValueError(f"operator for {self.source_topic}[{self.partition}] got {topic}[{partition}]")
        if not offsets:
            return []
        return self._pipeline(Columns(topic, partition, (offsets, timestamps, keys, values)), processing_ms)

    def process_values(self, offsets: list, timestamps: list, ts: np.ndarray, keys: list, values: np.ndarray,
                       processing_ms: int | None = None) -> list[OutputRecord] | None:
        """Events its caller decoded and checked itself (embedded state's batch form,
        ``grudge_stream.state``), one partition's, in offset order: ``values`` (float64) and
        ``ts`` (int64, the ``timestamps`` list as an array) as ``process_columns`` would have
        decoded them from payloads, and from there the same column pipeline. None (nothing
        changed) for an operator that does not apply events by columns: apply them one by one."""
        if self._traits is None:
            self._traits = (self._columns_pay(), type(self).validate_event is not Operator.validate_event)
        if not self._traits[0] or not self.codec.numeric_values:
            return None
        if not offsets:
            return []
        batch = Columns(self.source_topic, self.partition, (offsets, timestamps, keys, [None] * len(offsets)))
        return self._columnar(batch, self._limits(processing_ms), decoded=(values, ts))

    def _pipeline(self, batch: Columns, processing_ms: int | None) -> list[OutputRecord]:
        """The operator pipeline, per (non-empty) batch: records below ``next_offset`` skipped; the rest
        decoded as a column (numeric payload codecs: one Cython pass over cached payloads)
        and checked, bad ones dead-lettered; event times bounded and the watermark run in
        one Cython loop; timers fired at the events that make them due; the events between
        two timers applied by ``apply_columns`` (vectorized where an operator can, ``apply``
        per event otherwise); outputs in offset order. A batch holding a tick record, or an
        operator whose checks read state its own events change (``validates_against_state``),
        takes the same steps one record at a time (``_per_record``): the results are
        identical either way."""
        limits = self._limits(processing_ms)
        traits = self._traits
        if traits is None:  # what each batch asks, worked out once
            traits = self._traits = (self._columns_pay(), type(self).validate_event is not Operator.validate_event)
        if traits[0]:
            out = self._columnar(batch, limits)
            if out is not None:
                return out
        return self._per_record(batch, limits)

    def _columns_pay(self) -> bool:
        """Whether the column steps beat the record-by-record ones for this operator: it
        applies a segment of events at once (it overrides ``apply_columns``). An operator
        that applies event by event runs the same steps one record at a time, which costs
        less than building columns for per-event work (benchmarks/bench_operators.py)."""
        return not self.validates_against_state and type(self).apply_columns is not Operator.apply_columns

    def _per_record(self, batch: Columns, limits: tuple[int | None, int | None]) -> list[OutputRecord]:
        out: list[OutputRecord] = []
        for rec in batch.iter_records():
            if self.next_offset is not None and rec.offset < self.next_offset:
                self.skipped += 1
                continue
            self.next_offset = rec.offset + 1
            if rec.key == TICK_KEY and rec.value is None:
                self._tick(rec, limits, out)
                continue
            try:
                ev = self.codec.decode(rec.key, rec.value, rec.timestamp_ms)
            except BadRecord as exc:
                out.append(self.dead_letter(rec, str(exc)))
                continue
            self._admit(ev, rec, limits, out)
        return out

    def _columnar(self, batch: Columns, limits: tuple[int | None, int | None],
                  decoded: tuple[np.ndarray, np.ndarray] | None = None) -> list[OutputRecord] | None:
        """The column path of ``_pipeline`` (``grudge_stream.operators.pipeline.columnar``);
        None (nothing changed) for a batch with a tick. ``decoded``: the values and times of
        events already decoded (``process_values``)."""
        return columnar(self, batch, limits, decoded)

    def apply_columns(self, run: Run, a: int, b: int) -> None:
        """Apply events ``a`` to ``b`` of ``run``: one segment, in which no timer falls due.
        Operators with a vectorized update override it; this one calls ``apply`` per event,
        exactly as the record path does."""
        values = run.values[a:b]
        if isinstance(values, np.ndarray):
            values = values.tolist()
        batch = run.batch
        recs = batch.records
        if recs is None:
            offsets, timestamps, keys, raw = batch.columns()
            topic, partition = batch.topic, batch.partition
        apply, emit = self.apply, run.emit
        for i, key, ts, value, now, late in zip(run.idx[a:b].tolist(), run.keys_of(a, b), run.ts[a:b].tolist(),
                                                values, run.now[a:b].tolist(), run.late[a:b].tolist()):
            rec = recs[i] if recs is not None else SourceRecord(topic, partition, offsets[i], timestamps[i],
                                                                keys[i], raw[i])
            out: list[OutputRecord] = []
            apply(Event(key, ts, value), rec, now, late, out)
            if out:
                emit(rec.offset, out)

    def apply_event(self, key: bytes, value: Any, *, offset: int, timestamp_ms: int,
                    processing_ms: int | None = None) -> list[OutputRecord] | None:
        """One event the caller has decoded itself (embedded state, ``grudge_stream.state``),
        under the rules ``process`` applies to a record: skipped below ``next_offset``
        (returns None), its event time bounded, timers fired, then applied; the outputs.

        ``key``, ``value`` and ``timestamp_ms`` are checked as the codec checks a record's
        (key length, empty keys, the value's type and range, the time's range): a bad one
        raises ``ValueError`` naming the argument, and nothing changes."""
        if self.next_offset is not None and offset < self.next_offset:
            self.skipped += 1
            return None
        try:
            ev = Event(key, timestamp_ms, self.codec.check_event(key, value, timestamp_ms))
        except BadRecord as exc:
            raise ValueError(str(exc)) from None
        self.next_offset = offset + 1
        rec = SourceRecord(self.source_topic, self.partition, offset, timestamp_ms, key, None)
        out: list[OutputRecord] = []
        self.result = None
        self._admit(ev, rec, self._limits(processing_ms), out)
        return out

    def _admit(self, ev: Event, rec: SourceRecord, limits: tuple[int | None, int | None],
               out: list[OutputRecord]) -> None:
        """A decoded event: validated, its time bounded (docs/runtime.md), applied at the
        watermark; or dead-lettered, or counted (``late_policy="count"``)."""
        fut_limit, late_limit = limits
        counters = self.counters
        try:
            self.validate_event(ev)
            ts = ev.ts_ms
            if fut_limit is not None and ts > fut_limit:
                if self.future_policy == "dead_letter":
                    raise BadRecord(self.time_reason(1, ts, self.watermark, fut_limit))
                counters["future_clamped"] += 1
                # Its time cannot be trusted: it happens "now" in stream terms, at the
                # watermark, and so never moves the partition's clock.
                ts = self.watermark if self.watermark is not None else fut_limit
            wm = self.watermark
            if wm is not None and late_limit is not None and wm - ts > late_limit:
                counters["late_dropped"] += 1
                if self.late_policy == "dead_letter":
                    raise BadRecord(self.time_reason(2, ts, wm, fut_limit))
                return
        except BadRecord as exc:
            out.append(self.dead_letter(rec, str(exc)))
            return
        if wm is None or ts > wm:
            wm = self.watermark = ts
            late = 0
        else:
            late = wm - ts
            if late:
                counters["late"] += 1
        counters["events"] += 1
        if self._timer_intervals:
            self.fire_timers(wm, rec, out)
        self.apply(ev if ts == ev.ts_ms else ev._replace(ts_ms=ts), rec, wm, late, out)

    def wants_tick(self) -> bool:
        """Whether a quiet partition's watermark should be moved on by tick records (a
        raised key waits for a sweep): ``idle_tick_s``."""
        return False

    def _tick(self, rec: SourceRecord, limits: tuple[int | None, int | None], out: list[OutputRecord]) -> None:
        """A tick record (``TICK_KEY``): the watermark moves to its time, the timers due fire
        (a sweep clears the keys gone quiet); no key changes. One behind the watermark, ahead
        of the future bound, or before the first event changes nothing. Counted either way."""
        self.counters["ticks"] = self.counters.get("ticks", 0) + 1
        ts, wm, fut_limit = rec.timestamp_ms, self.watermark, limits[0]
        if wm is None or ts <= wm or (fut_limit is not None and ts > fut_limit):
            return
        self.watermark = ts
        if self._timer_intervals:
            self.fire_timers(ts, rec, out)

    def time_reason(self, code: int, ts: int, wm: int | None, fut_limit: int | None) -> str:
        """The dead-letter reason of an event time out of bounds (code 1: future, 2: late)."""
        if code == 1:
            assert fut_limit is not None and self.max_future_ms is not None
            return (f"event time {ts} is {ts - fut_limit + self.max_future_ms} ms ahead of processing "
                    f"time (limit max_future_ms={self.max_future_ms})")
        return (f"event time {ts} is {wm - ts} ms behind the partition's watermark {wm} "  # type: ignore[operator]
                f"(limit max_late_ms={self.max_late_ms})")

    def _limits(self, processing_ms: int | None) -> tuple[int | None, int | None]:
        """(latest event time accepted as is, largest lateness) for one batch."""
        fut, late = self._bounds()
        if fut is None:
            return None, late
        if processing_ms is None:
            processing_ms = time.time_ns() // 1_000_000
        return processing_ms + fut, late

    def saturation(self) -> list:
        """How full each sketch is at the watermark, with a warning when one passed its
        target (``grudge_stream.operators.saturation``, docs/accuracy.md). Copies cells:
        runtimes call it every few seconds, not per batch."""
        return []

    def validate_event(self, ev: Event) -> None:
        """Operator-specific checks beyond the codec's; raise BadRecord to dead-letter."""

    @abc.abstractmethod
    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        """Apply one valid event at the watermark ``now_ms``; append outputs to ``out``."""

    def dead_letter(self, rec: SourceRecord, reason: str) -> OutputRecord:
        self.counters["dead_letters"] += 1
        # Per reason class, for the metrics only: never in ``counters``, which snapshots carry.
        cls = reason_class(reason)
        self.dead_letter_reasons[cls] = self.dead_letter_reasons.get(cls, 0) + 1
        return dead_letter_record(
            self.operator_id, reason,
            {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset,
             "timestamp_ms": rec.timestamp_ms},
            rec.key, rec.value, self.dead_letter_limit)

    # -- state --------------------------------------------------------------------------------

    @abc.abstractmethod
    def state_sections(self) -> list[tuple[str, bytes]]:
        """Named binary sections (serialized sketches, latches) of the state."""

    @abc.abstractmethod
    def load_sections(self, sections: dict[str, memoryview], scalars: dict) -> None:
        """Rebuild state from sections; raise ValueError/SnapshotError on anything off."""

    def state_scalars(self) -> dict:
        return {}

    def memory_bytes(self) -> int:
        return 0

    def state_sections_taken(self) -> list[tuple[str, bytes | Callable[[], Any]]]:
        """``state_sections`` as a consistent copy taken now, serialized later (maybe on
        another thread): each section its bytes, or a function of a private copy of the
        state that makes them (or their envelope not built yet, ``envelope.later``). The
        default serializes at once; an operator whose sketch can ``copy()`` (a memcpy) defers
        that sketch's serialization."""
        return list(self.state_sections())

    def snapshot(self) -> bytes:
        """The full state as one checksummed blob, tagged with the next offset it reflects."""
        return self.snapshot_taken()()

    def snapshot_taken(self) -> Callable[[], bytes]:
        """``snapshot`` in two steps: the state copied now (at a batch boundary, on the
        loop), the blob made by calling the result (off the loop: no later processing
        changes it). The format: ``grudge_stream.operators.snapshots``."""
        return take_snapshot(self)

    def restore(self, blob: bytes) -> None:
        """Adopt a snapshot of this very operator (same config, topic and partition).

        Raises SnapshotError for a corrupt blob and MismatchError for one taken under
        another configuration, topic or partition; the current state is untouched then.
        """
        restore_snapshot(self, blob)
