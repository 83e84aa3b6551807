"""The operator contract: a batch of source records in, output records out.

Operators are transport-free: they import nothing from Faust or Kafka, so the
Faust runtime, the replay runner and unit tests all drive the same code. One
operator instance serves one source partition and holds that partition's
sketch(es).

Per record, in offset order:

1. records below ``next_offset`` are skipped (they are already reflected in
   the state, e.g. after a restore from a snapshot);
2. the record is decoded and validated; a bad one becomes a dead letter (the
   original bytes, its source coordinates and a reason) and touches nothing;
3. the partition's watermark advances to ``max(watermark, event time)``; the
   sketch runs at the watermark, never at wall-clock time, so a replay of the
   same records reproduces the same state and outputs;
4. ``next_offset`` becomes ``offset + 1``.

Processing is split-invariant: feeding records in one batch or in any
sequence of smaller batches gives identical outputs and identical snapshots.
"""
from __future__ import annotations

import abc
import base64
import json
import struct
from typing import Any, ClassVar, Sequence

from grudge_stream import envelope
from grudge_stream.exceptions import ConfigError, MismatchError, SnapshotError
from grudge_stream.operators.codec import BadRecord, Event, EventCodec
from grudge_stream.operators.records import OutputRecord, SourceRecord

SNAPSHOT_VERSION = 1
_SECTION = struct.Struct("<Q")


class Operator(abc.ABC):
    """Base class of every grudge-stream operator (one instance per source partition)."""

    kind: ClassVar[str] = "operator"

    def __init__(self, *, operator_id: str, source_topic: str, partition: int,
                 codec: EventCodec, max_future_ms: int | None = 3_600_000) -> None:
        if not operator_id:
            raise ConfigError("operator_id must be a non-empty string")
        if partition < 0:
            raise ConfigError("partition must be >= 0")
        if max_future_ms is not None and max_future_ms < 0:
            raise ConfigError("max_future_ms must be >= 0 or None")
        self.operator_id = operator_id
        self.source_topic = source_topic
        self.partition = partition
        self.codec = codec
        self.max_future_ms = max_future_ms
        self.next_offset: int | None = None
        self.watermark: int | None = None
        # Deterministic functions of the record stream: part of the snapshot.
        self.counters: dict[str, int] = {"events": 0, "dead_letters": 0, "late": 0}
        # Records below next_offset that a runtime re-delivered (not state: differs per run).
        self.skipped = 0

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
            **self.config_dict(),
        }

    @property
    def fingerprint(self) -> str:
        return envelope.fingerprint(self.full_config())

    # -- processing ---------------------------------------------------------------------------

    def process(self, records: Sequence[SourceRecord]) -> list[OutputRecord]:
        out: list[OutputRecord] = []
        for rec in records:
            if rec.partition != self.partition or rec.topic != self.source_topic:
                raise ValueError(
                    f"operator for {self.source_topic}[{self.partition}] got a record of "
                    f"{rec.topic}[{rec.partition}]"
                )
            if self.next_offset is not None and rec.offset < self.next_offset:
                self.skipped += 1
                continue
            try:
                ev = self.codec.decode(rec.key, rec.value, rec.timestamp_ms)
                self._check_future(ev, rec)
                self.validate_event(ev)
            except BadRecord as exc:
                out.append(self.dead_letter(rec, str(exc)))
            else:
                wm = self.watermark
                if wm is None or ev.ts_ms > wm:
                    wm = self.watermark = ev.ts_ms
                    late = 0
                else:
                    late = wm - ev.ts_ms
                    if late:
                        self.counters["late"] += 1
                self.counters["events"] += 1
                self.apply(ev, rec, wm, late, out)
            self.next_offset = rec.offset + 1
        return out

    def process_columns(self, topic: str, partition: int, offsets: list, timestamps: list,
                        keys: list, values: list) -> list[OutputRecord]:
        """``process`` over one partition's records given as columns (what batch runtimes
        read). Operators with a vectorized path override it; results are identical."""
        return self.process([SourceRecord(topic, partition, o, t, k, v)
                             for o, t, k, v in zip(offsets, timestamps, keys, values)])

    def _check_future(self, ev: Event, rec: SourceRecord) -> None:
        if self.max_future_ms is None:
            return
        ref = rec.timestamp_ms if self.watermark is None else max(self.watermark, rec.timestamp_ms)
        if ev.ts_ms > ref + self.max_future_ms:
            raise BadRecord(
                f"event time {ev.ts_ms} is {ev.ts_ms - ref} ms ahead of the stream "
                f"(limit {self.max_future_ms} ms)"
            )

    def validate_event(self, ev: Event) -> None:
        """Operator-specific checks beyond the codec's; raise BadRecord to dead-letter."""

    @abc.abstractmethod
    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        """Apply one valid event at the watermark ``now_ms``; append outputs to ``out``."""

    def dead_letter(self, rec: SourceRecord, reason: str) -> OutputRecord:
        self.counters["dead_letters"] += 1
        body = {
            "reason": reason,
            "operator": self.operator_id,
            "source": {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset,
                       "timestamp_ms": rec.timestamp_ms},
            "key_b64": None if rec.key is None else base64.b64encode(rec.key).decode("ascii"),
            "value_b64": None if rec.value is None else base64.b64encode(rec.value).decode("ascii"),
        }
        return OutputRecord("dead_letters", rec.key, json.dumps(body, separators=(",", ":")).encode())

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

    def snapshot(self) -> bytes:
        """The full state as one checksummed blob, tagged with the next offset it reflects."""
        sections = self.state_sections()
        header = {
            "snapshot_version": SNAPSHOT_VERSION,
            "operator_kind": self.kind,
            "operator_id": self.operator_id,
            "fingerprint": self.fingerprint,
            "source_topic": self.source_topic,
            "partition": self.partition,
            "next_offset": self.next_offset,
            "watermark": self.watermark,
            "counters": self.counters,
            "scalars": self.state_scalars(),
            "sections": [[name, len(data)] for name, data in sections],
        }
        return envelope.pack(envelope.KIND_OPERATOR, header, b"".join(d for _, d in sections))

    def restore(self, blob: bytes) -> None:
        """Adopt a snapshot of this very operator (same config, topic and partition).

        Raises SnapshotError for a corrupt blob and MismatchError for one taken under
        another configuration, topic or partition; the current state is untouched then.
        """
        header, payload = read_snapshot(blob)
        if header.get("fingerprint") != self.fingerprint:
            raise MismatchError(
                f"snapshot of {header.get('operator_id')!r} has config fingerprint "
                f"{header.get('fingerprint')}, the running operator has {self.fingerprint}. "
                "Operator action: restore it with the configuration that wrote it, or replay "
                "the partition from its earliest retained offset."
            )
        if header.get("source_topic") != self.source_topic or header.get("partition") != self.partition:
            raise MismatchError(
                f"snapshot is of {header.get('source_topic')}[{header.get('partition')}], "
                f"not {self.source_topic}[{self.partition}]"
            )
        sections: dict[str, memoryview] = {}
        pos = 0
        try:
            for name, length in header["sections"]:
                sections[name] = payload[pos:pos + length]
                pos += length
            if pos != len(payload):
                raise SnapshotError("operator snapshot sections do not cover the payload")
            next_offset = header["next_offset"]
            watermark = header["watermark"]
            counters = {k: int(v) for k, v in header["counters"].items()}
            self.load_sections(sections, header["scalars"])
        except SnapshotError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"operator snapshot state is invalid: {exc}") from None
        self.next_offset = next_offset
        self.watermark = watermark
        self.counters = counters

    def status(self) -> dict[str, Any]:
        return {"operator": self.operator_id, "partition": self.partition,
                "next_offset": self.next_offset, "watermark": self.watermark, **self.counters}


def read_snapshot(blob: bytes) -> tuple[dict, memoryview]:
    """Validate an operator snapshot and return (header, payload)."""
    header, payload = envelope.unpack(blob, envelope.KIND_OPERATOR)
    if header.get("snapshot_version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"operator snapshot version {header.get('snapshot_version')} is not supported")
    for field in ("operator_id", "fingerprint", "source_topic", "partition", "next_offset", "sections"):
        if field not in header:
            raise SnapshotError(f"operator snapshot header lacks {field!r}")
    return header, payload
