"""Per-partition operator state with checkpoints, under the worker core.

The worker core (``grudge_stream.runtime.core``, shared by the Faust and the
confluent-kafka batch runtimes) holds one ``PartitionSlot`` per assigned source
partition and calls the same three things: ``restore_partition`` on assignment
(blocking: run it in an executor from asyncio code), ``process`` for each batch
of that partition's records, and ``checkpoint_slots`` for a checkpoint round
(on the cadence, on revocation and on shutdown).

Restore rules (docs/checkpoints.md):

- the newest snapshot whose checksum, config fingerprint, topic and partition
  match is adopted; the partition is then processed from exactly its
  ``next_offset`` (records below it are skipped, whatever the committed
  consumer offset says);
- a refused newest snapshot falls back to the previous generation; when no
  generation is usable the topology's ``restore_fallback`` decides: ``replay``
  (a fresh operator that replays the partition from its earliest retained
  offset, logged at ERROR level and counted) or ``fail`` (the worker refuses
  the partition with an explanation) — never a silent empty sketch;
- a snapshot taken when the source topic had another partition count is
  refused with ``PartitionCountChanged``: keys would have moved between sketches;
- a snapshot whose state differs from the worker's only in the sketches' index
  scheme is adopted with its own scheme when the topology's ``index_scheme`` setting
  was left at its default (logged once per operator and scheme): a deployment keeps
  its scheme until it resets its state. An explicitly set scheme refuses it like any
  other state-shaping setting (docs/hashing.md, "Upgrading").
"""
from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from grudge_stream.checkpoint import CheckpointStore, SnapshotRef, SnapshotWrite
from grudge_stream.exceptions import (ForeignDeployment, MismatchError, PartitionCountChanged,
                                     SnapshotRefused)
from grudge_stream.metrics import Metrics
from grudge_stream.operators.base import Operator
from grudge_stream.operators.deadletters import DEFAULT_DEAD_LETTER_LIMIT
from grudge_stream.operators.records import OutputRecord, SourceRecord
from grudge_stream.operators.snapshots import differences, read_snapshot
from grudge_stream.outputs import OutputPublisher
from grudge_stream.topology import Topology

log = logging.getLogger("grudge_stream.partitions")


# Sketch fill is read (cells copied) at most this often per partition, and a sketch past
# its target is logged at most once per SATURATION_LOG_S.
SATURATION_INTERVAL_S = 10.0
SATURATION_LOG_S = 300.0


def foreign_deployment_message(topology: Topology, ref: SnapshotRef, settings_hint: str = "") -> str:
    """One line: whose state the snapshot topic holds, and what to change."""
    writer = f"app_id {ref.app_id!r}, source topic {ref.source_topic!r}" if ref.app_id else \
        f"source topic {ref.source_topic!r}"
    same_group = ref.app_id and ref.app_id == topology.app_id
    return (f"the topics of this deployment belong to another one: snapshot topic {topology.snapshot_topic!r} "
            f"holds operator {topology.operator_id!r} of {writer}, and this one (app_id {topology.app_id!r}) "
            f"reads {topology.source_topic!r}"
            + (" under the same app_id, whose committed offsets are of the other topic" if same_group else "")
            + f". Give it topics of its own ({settings_hint or 'snapshot_topic and the output topics'}, "
            "or operator_id), or point it back at its own source topic")


_SCHEMES_LOGGED: set[tuple[str, str]] = set()


def snapshot_index_scheme(topology: Topology, op: Operator, blob: bytes) -> str | None:
    """The index scheme of ``blob``'s sketches when the topology may adopt it: its
    ``index_scheme`` was left at the default, and the snapshot's state settings differ from
    ``op``'s in the index scheme only. None otherwise (the snapshot stays foreign)."""
    if topology.with_index_scheme is None:
        return None
    try:
        header, _ = read_snapshot(blob)
    except Exception:  # a corrupt blob is refused by the restore itself
        return None
    theirs = header.get("state_config")
    if not isinstance(theirs, dict):
        return None
    diff = differences(theirs, op.state_config())
    if not diff or any(path.rsplit(".", 1)[-1] != "index_scheme" for path, _, _ in diff):
        return None
    schemes = {"km" if a is None else a for _, a, _ in diff}
    if len(schemes) != 1:
        return None
    scheme = schemes.pop()
    return scheme if scheme in ("independent", "km") else None


@dataclass
class RestoreOutcome:
    operator: Operator
    start_offset: int | None  # where processing must start; None = wherever the consumer is
    mode: str  # "snapshot", "previous", "fresh", "replay"
    seconds: float


def restore_partition(topology: Topology, store: CheckpointStore, partition: int,
                      partition_count: int, low_watermark: Callable[[], int],
                      metrics: Metrics | None = None,
                      dead_letter_limit: int = DEFAULT_DEAD_LETTER_LIMIT) -> RestoreOutcome:
    """Build partition ``partition``'s operator from its newest usable snapshot."""
    t0 = time.perf_counter()
    op = topology.operator(partition, partition_count, dead_letter_limit)
    labels = (op.operator_id, str(partition))

    def accept(ref: SnapshotRef, blob: bytes) -> None:
        if ref.source_topic != topology.source_topic:
            raise ForeignDeployment(foreign_deployment_message(topology, ref))
        if ref.partition_count != partition_count:
            raise PartitionCountChanged(
                f"the snapshot of {topology.source_topic}[{partition}] was taken when the topic had "
                f"{ref.partition_count} partitions; it now has {partition_count}. Keys have moved "
                "between partitions, so no partition's sketch describes its keys any more. Operator "
                "action: restore the old partition count, or start this topology under a new "
                "operator id / snapshot topic and replay the history."
            )
        probe = topology.operator(partition, partition_count, dead_letter_limit)
        adopted.clear()
        try:
            probe.restore(blob)  # SnapshotError / MismatchError refuse it
        except MismatchError as exc:
            scheme = snapshot_index_scheme(topology, probe, blob)
            if scheme is None:
                foreign.append(str(exc))
                raise
            other = topology.with_index_scheme(scheme)  # type: ignore[misc]
            try:
                other.operator(partition, partition_count, dead_letter_limit).restore(blob)
            except MismatchError as exc2:
                foreign.append(str(exc2))
                raise
            adopted.append((other, scheme))

    foreign: list[str] = []
    adopted: list[tuple[Topology, str]] = []
    result = store.restore(op.operator_id, partition, accept=accept)
    if metrics is not None and result.refused:
        metrics.snapshots_refused.labels(*labels).inc(len(result.refused))
    if result.blob is not None:
        if adopted:
            other, scheme = adopted[0]
            op = other.operator(partition, partition_count, dead_letter_limit)
            if (op.operator_id, scheme) not in _SCHEMES_LOGGED:
                _SCHEMES_LOGGED.add((op.operator_id, scheme))
                log.warning("%s %s[%d]: the snapshots hold sketches with index_scheme=%s; keeping it (the "
                            "index_scheme setting is at its default). Set index_scheme=%s to keep it for "
                            "good, or reset_state=true to rebuild under the default scheme (docs/hashing.md)",
                            op.operator_id, topology.source_topic, partition, scheme, scheme)
        op.restore(result.blob)
        mode = "previous" if result.refused else "snapshot"
        if mode == "previous" and metrics is not None:
            metrics.restore_fallbacks.labels(*labels, "previous").inc()
        start = op.next_offset
    elif result.refused:
        reasons = "; ".join(f"generation {g}: {why}" for g, why in result.refused)
        if foreign and not topology.reset_state:
            # Other state-shaping settings (or another hash key): the operator decides, never
            # a silent replay that would republish every old output.
            raise SnapshotRefused(f"{topology.source_topic}[{partition}]: {foreign[0]}")
        if foreign:
            log.warning("reset_state: dropping the snapshots of %s[%d] taken under other settings (%s); "
                        "rebuilding the state from the earliest retained offset", topology.source_topic,
                        partition, foreign[0])
        elif topology.restore_fallback == "fail":
            raise SnapshotRefused(
                f"no usable snapshot for {op.operator_id} {topology.source_topic}[{partition}] ({reasons}). "
                "Operator action: fix the configuration to match the snapshot, or set "
                "restore_fallback=replay to rebuild the state from the earliest retained offset."
            )
        start = low_watermark()
        log.error("no usable snapshot for %s %s[%d] (%s); replaying from the earliest retained offset %d",
                  op.operator_id, topology.source_topic, partition, reasons, start)
        if metrics is not None:
            metrics.restore_fallbacks.labels(*labels, "replay").inc()
        op.next_offset = start
        mode = "replay"
    else:
        start, mode = None, "fresh"
    seconds = time.perf_counter() - t0
    if metrics is not None:
        metrics.restore_seconds.labels(*labels).set(seconds)
        metrics.sketch_memory.labels(*labels).set(op.memory_bytes())
    log.info("restored %s %s[%d] mode=%s next_offset=%s watermark=%s in %.3fs", op.operator_id,
             topology.source_topic, partition, mode, op.next_offset, op.watermark, seconds)
    return RestoreOutcome(op, start, mode, seconds)


class PartitionSlot:
    """One assigned partition: its operator, and what its last snapshot covered."""

    def __init__(self, topology: Topology, partition: int, outcome: RestoreOutcome,
                 partition_count: int, metrics: Metrics | None = None) -> None:
        self.topology = topology
        self.partition = partition
        self.operator = outcome.operator
        self.restore_mode = outcome.mode
        self.start_offset = outcome.start_offset
        self.partition_count = partition_count
        self.metrics = metrics
        self.snapshotted_offset = self.operator.next_offset
        self.last_snapshot_wall = time.monotonic()
        # Records applied since the state the last snapshot holds: the replay a restore would
        # need (the batch runtime's snapshot budget).
        self.unsnapshotted = 0
        self.unsnapshotted_at_take = 0
        # Records below this offset were processed before, and their outputs delivered and
        # committed (the group's committed offset lies past the snapshot): they are applied
        # again, their outputs dropped (``suppress_below``).
        self.replay_until: int | None = None
        self._labels = (self.operator.operator_id, str(partition))
        self._seen = dict(self.operator.counters)
        self._seen_reasons = dict(getattr(self.operator, "dead_letter_reasons", {}))
        self._children: dict = {}
        self._next_saturation = 0.0
        self._saturation_logged: dict[str, float] = {}
        # Held by the batch runtime's loop while it processes a batch of this partition and by
        # a live score query while it reads the operator (grudge_stream.serving): a query never
        # sees a batch half applied. Uncontended it costs ~50 ns per batch.
        self.lock = threading.Lock()
        # grudge_stream.serving.PartitionerCheck of the worker, or None: records' keys sampled.
        self.key_check: Any = None

    @property
    def dirty(self) -> bool:
        return self.operator.next_offset != self.snapshotted_offset

    def suppress_below(self, committed: int | None) -> None:
        """Outputs of records below ``committed`` (the group's committed offset, past where
        processing restarts) were delivered before: the replay up to it stays silent."""
        start = self.operator.next_offset
        if committed is not None and committed >= 0 and (start is None or committed > start):
            self.replay_until = committed
            log.info("%s[%d]: replaying offsets %s..%d silently (outputs delivered before)",
                     self.topology.source_topic, self.partition, start if start is not None else "earliest",
                     committed)

    def process(self, records: Sequence[SourceRecord]) -> list[OutputRecord]:
        if self.key_check is not None:
            self.key_check.check(self.partition, self.partition_count, [r.key for r in records[:64]])
        until = self.replay_until
        if until is not None:
            cut = bisect_left([r.offset for r in records], until)
            if cut:
                self._silent(self.operator.process(records[:cut]), cut)
            records = records[cut:]
            if not records:
                return []
            self.replay_until = None
        out = self.operator.process(records)
        self.unsnapshotted += len(records)
        if self.metrics is not None:
            self._update_metrics()
        return out

    def process_columns(self, topic: str, offsets: list, timestamps: list, keys: list,
                        values: list) -> list[OutputRecord]:
        if self.key_check is not None:
            self.key_check.check(self.partition, self.partition_count, keys)
        until = self.replay_until
        if until is not None:
            cut = bisect_left(offsets, until)
            if cut:
                self._silent(self.operator.process_columns(topic, self.partition, offsets[:cut], timestamps[:cut],
                                                           keys[:cut], values[:cut]), cut)
                offsets, timestamps, keys, values = offsets[cut:], timestamps[cut:], keys[cut:], values[cut:]
            if not offsets:
                return []
            self.replay_until = None
        out = self.operator.process_columns(topic, self.partition, offsets, timestamps, keys, values)
        self.unsnapshotted += len(offsets)
        if self.metrics is not None:
            self._update_metrics()
        return out

    def _silent(self, outputs: list, records: int) -> None:
        """A replayed stretch below ``replay_until``: its outputs were delivered before."""
        self.unsnapshotted += records
        if self.metrics is not None:
            self._child(self.metrics.replayed_silently).inc(records)
            if outputs:
                self._child(self.metrics.outputs_suppressed).inc(len(outputs))
            self._update_metrics()

    def _child(self, metric, *extra):
        """The metric's child for this partition (cached: ``labels()`` takes a lock and builds keys)."""
        key = (id(metric), extra)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*self._labels, *extra)
        return child

    def _update_metrics(self) -> None:
        m, c, seen = self.metrics, self.operator.counters, self._seen
        for name, counter in (("events", m.events), ("dead_letters", m.dead_letters),
                              ("future_clamped", m.future_clamped), ("late", m.late_applied),
                              ("late_dropped", m.late_dropped)):
            d = c.get(name, 0) - seen.get(name, 0)
            if d:
                self._child(counter).inc(d)
        if c.get("dead_letters", 0) != seen.get("dead_letters", 0):
            reasons, seen_reasons = getattr(self.operator, "dead_letter_reasons", {}), self._seen_reasons
            for name, n in reasons.items():
                if n > seen_reasons.get(name, 0):
                    m.dead_letter_reasons.labels(self._labels[0], name).inc(n - seen_reasons.get(name, 0))
            self._seen_reasons = dict(reasons)
        for state in ("raised", "cleared"):
            d = c.get("alerts_" + state, 0) - seen.get("alerts_" + state, 0)
            if d:
                self._child(m.alerts, state).inc(d)
        self._seen = dict(c)
        now = time.monotonic()
        if now >= self._next_saturation:
            self._next_saturation = now + SATURATION_INTERVAL_S
            self._report_saturation()
        wm = self.operator.watermark
        if wm is not None:
            self._child(m.watermark).set(wm / 1000.0)
            self._child(m.watermark_lag).set(time.time() - wm / 1000.0)

    def _report_saturation(self) -> None:
        try:
            reports = self.operator.saturation()
        except Exception:  # noqa: BLE001 - a read-out must never stop processing
            log.exception("saturation read-out of %s[%d] failed", self.topology.source_topic, self.partition)
            return
        for rep in reports:
            for measure, value in rep.measures.items():
                self._child(self.metrics.saturation, rep.sketch, measure).set(value)
            if rep.warning:
                self._child(self.metrics.saturation_warnings, rep.sketch).inc()
                if self._may_log(rep.sketch):
                    log.warning("%s %s[%d]: %s", self.operator.operator_id, self.topology.source_topic,
                                self.partition, rep.warning)

    def _may_log(self, sketch: str) -> bool:
        now = time.monotonic()
        if now - self._saturation_logged.get(sketch, -SATURATION_LOG_S) < SATURATION_LOG_S:
            return False
        self._saturation_logged[sketch] = now
        return True

    def set_log_end(self, high: int) -> None:
        """Record the partition's log end (high watermark): the consumer-lag gauge."""
        nxt = self.operator.next_offset
        if self.metrics is not None and high >= 0 and nxt is not None:
            self.metrics.consumer_lag.labels(*self._labels).set(max(0, high - nxt))


def snapshot_write(slot: PartitionSlot, deferred: bool = False) -> SnapshotWrite:
    """``slot``'s state serialized now, with the offset and watermark it reflects.
    ``deferred``: only copied now (``Operator.snapshot_taken``), serialized by
    ``SnapshotWrite.serialized`` later, off the loop."""
    op = slot.operator
    slot.unsnapshotted_at_take = slot.unsnapshotted
    if deferred:
        blob, make = b"", op.snapshot_taken()
    else:
        blob, make = op.snapshot(), None
    return SnapshotWrite(op.operator_id, slot.partition, blob, op.next_offset, op.watermark,
                         op.fingerprint, slot.topology.source_topic, slot.partition_count,
                         slot.topology.app_id, make)


def checkpoint_slots(slots: Sequence[PartitionSlot], store: CheckpointStore,
                     publisher: OutputPublisher | None,
                     should_stop: Callable[[], bool] | None = None,
                     taken: Sequence[SnapshotWrite] | None = None) -> list[SnapshotRef]:
    """One checkpoint round: snapshot every dirty slot of ``slots``; the refs, in slot order.

    Outputs are flushed once (a snapshot never covers an output that is not durable: the
    flush waits until every output is delivered or dead-lettered, and raises
    ``DeliveryError`` instead — writing no snapshot — if the worker stops meanwhile),
    then ``CheckpointStore.write_many`` sends every partition's chunks together, each blob
    serialized while the previous one's chunks are on their way. Afterwards each slot's
    ``snapshotted_offset`` is what its snapshot covers: commit up to it.

    ``taken``: the snapshots of ``slots`` (one each, in order) serialized earlier, at a
    batch boundary, by ``snapshot_write`` — so the state may change meanwhile.
    """
    dirty = list(slots) if taken is not None else [s for s in slots if s.dirty]
    if not dirty:
        return []
    t0 = time.perf_counter()
    if publisher is not None:
        publisher.flush(should_stop=should_stop)
    sizes: list[int] = []

    def writes():
        for slot, write in zip(dirty, taken) if taken is not None else ((s, None) for s in dirty):
            write = write.serialized() if write is not None else snapshot_write(slot)
            sizes.append(len(write.blob))
            yield write

    refs = store.write_many(writes())
    snapshots_written(dirty, refs, sizes, time.perf_counter() - t0)
    return refs


def snapshots_written(slots: Sequence[PartitionSlot], refs: Sequence[SnapshotRef], sizes: Sequence[int],
                      seconds: float) -> None:
    """Bookkeeping after a round wrote the snapshots of ``slots`` (``refs``, ``sizes``)."""
    now_wall, now_mono = time.time(), time.monotonic()
    for slot, ref, size in zip(slots, refs, sizes):
        slot.snapshotted_offset = ref.next_offset
        slot.last_snapshot_wall = now_mono
        slot.unsnapshotted = max(0, slot.unsnapshotted - slot.unsnapshotted_at_take)
        slot.unsnapshotted_at_take = 0
        if slot.metrics is not None:
            slot.metrics.snapshots.labels(*slot._labels).inc()
            slot.metrics.snapshot_bytes.labels(*slot._labels).set(size)
            slot.metrics.snapshot_bytes_written.labels(*slot._labels).inc(size)
            slot.metrics.snapshot_time.labels(*slot._labels).set(now_wall)
    metrics = slots[0].metrics if slots else None
    if metrics is not None:
        metrics.snapshot_seconds.labels(slots[0].operator.operator_id).observe(seconds)
