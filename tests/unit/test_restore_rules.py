"""Which snapshot a partition restores from, without a broker: the real
``CheckpointStore.restore`` and ``restore_partition`` over a store whose manifest and
chunks live in memory."""
from __future__ import annotations

import dataclasses
import json

import pytest

from grudge_stream.checkpoint import CheckpointStore, Manifest, SnapshotRef
from grudge_stream.exceptions import CheckpointError, ConfigError, PartitionCountChanged, SnapshotError
from grudge_stream.operators import EventCodec, SourceRecord
from grudge_stream.operators.scores import FeedbackScoreOperator
from grudge_stream.partitions import restore_partition
from grudge_stream.replay.ranges import Position, parse_position
from grudge_stream.topology import Topology

SKETCH = {"levels": 2, "cells_per_level": 1000, "decay": {"kind": "exponential", "lambda_per_s": 0.01},
          "lo": 0.0, "hi": 1.0, "aggregator": "min", "hasher": "siphash", "seed": 1}
CODEC = EventCodec(value_field="outcome", outcomes={"bad": 0.1, "good": -0.01}, allow_numbers=False)


def make_op(p: int, cells: int = 1000) -> FeedbackScoreOperator:
    return FeedbackScoreOperator(operator_id="op", source_topic="src", partition=p,
                                 sketch={**SKETCH, "cells_per_level": cells}, codec=CODEC, raise_at=0.5,
                                 clear_at=0.2)


def topology(cells: int = 1000, **kw) -> Topology:
    return Topology(name="t", source_topic="src", make_operator=lambda p: make_op(p, cells),
                    outputs={"dead_letters": "dlq"}, snapshot_topic="snaps", **kw)


def blob_at(next_events: int, cells: int = 1000) -> bytes:
    op = make_op(0, cells)
    op.process([SourceRecord("src", 0, i, 1000 + i, b"k", b'{"outcome":"bad"}') for i in range(next_events)])
    return op.snapshot()


def ref(generation: int, blob: bytes, partition_count: int = 4) -> SnapshotRef:
    return SnapshotRef(generation=generation, slot=generation % 2, offsets=(generation,), size=len(blob), crc=0,
                       next_offset=None, watermark=None, fingerprint="f", source_topic="src",
                       partition_count=partition_count, written_ms=0)


class MemoryStore(CheckpointStore):
    """The real restore rules over an in-memory manifest; blobs by generation."""

    def __init__(self, current: bytes | None = None, previous: bytes | None = None, partition_count: int = 4):
        self._last = {}
        self.blobs: dict[int, bytes] = {}
        self.manifest = None
        if current is not None:
            self.blobs[2] = current
            prev = None
            if previous is not None:
                self.blobs[1] = previous
                prev = ref(1, previous, partition_count)
            self.manifest = Manifest("op", 0, ref(2, current, partition_count), prev)

    def _consumer(self):
        class Closing:
            def close(self) -> None:
                pass
        return Closing()

    def read_manifest(self, operator_id, partition, consumer=None):
        return self.manifest

    def load_ref(self, operator_id, partition, ref, consumer=None):
        blob = self.blobs[ref.generation]
        if blob == b"corrupt":
            raise SnapshotError("checksum mismatch")
        return blob


def restore(store: MemoryStore, topo: Topology | None = None, partition_count: int = 4):
    return restore_partition(topo or topology(), store, 0, partition_count, low_watermark=lambda: 17)


def test_no_manifest_is_a_fresh_start() -> None:
    out = restore(MemoryStore())
    assert out.mode == "fresh" and out.start_offset is None and out.operator.next_offset is None


def test_the_newest_usable_generation_wins() -> None:
    out = restore(MemoryStore(blob_at(5), blob_at(3)))
    assert out.mode == "snapshot" and out.start_offset == 5 == out.operator.next_offset


def test_a_corrupt_newest_falls_back_to_the_previous() -> None:
    out = restore(MemoryStore(b"corrupt", blob_at(3)))
    assert out.mode == "previous" and out.start_offset == 3


def test_nothing_usable_replays_or_fails_as_configured() -> None:
    out = restore(MemoryStore(b"corrupt", b"corrupt"))
    assert out.mode == "replay" and out.start_offset == 17 and out.operator.next_offset == 17
    with pytest.raises(CheckpointError, match="no usable snapshot"):
        restore(MemoryStore(b"corrupt", b"corrupt"), topology(restore_fallback="fail"))


def test_foreign_settings_stop_the_worker_unless_reset_state() -> None:
    store = MemoryStore(blob_at(5, cells=2000), blob_at(3, cells=2000))
    with pytest.raises(CheckpointError, match="cells_per_level|settings that shape the state"):
        restore(store)
    out = restore(store, dataclasses.replace(topology(), reset_state=True))
    assert out.mode == "replay" and out.start_offset == 17


def test_a_foreign_newest_with_a_matching_previous_restores_the_previous() -> None:
    out = restore(MemoryStore(blob_at(5, cells=2000), blob_at(3)))
    assert out.mode == "previous" and out.start_offset == 3


def test_a_changed_partition_count_is_refused_with_its_own_error() -> None:
    with pytest.raises(PartitionCountChanged, match="4 partitions; it now has 6"):
        restore(MemoryStore(blob_at(5), blob_at(3)), partition_count=6)


def test_manifest_round_trip_and_refusals() -> None:
    m = Manifest("op", 3, ref(7, b"x" * 10), ref(6, b"y" * 4))
    again = Manifest.decode(m.encode(), offset=42)
    assert again.current == m.current and again.previous == m.previous and again.offset == 42
    assert Manifest.decode(Manifest("op", 3, ref(1, b"z"), None).encode()).previous is None
    body = json.loads(m.encode())
    for bad, why in ((dict(body, magic="nope"), "not a snapshot manifest"),
                     (dict(body, version=999), "version 999"),
                     ({k: v for k, v in body.items() if k != "current"}, "malformed"),
                     (dict(body, current={**body["current"], "offsets": "x"}), "malformed")):
        with pytest.raises(SnapshotError, match=why):
            Manifest.decode(json.dumps(bad).encode())
    with pytest.raises(SnapshotError, match="malformed"):
        Manifest.decode(b"{not json")


@pytest.mark.parametrize("text, expected", [
    ("earliest", Position("earliest")), ("beginning", Position("earliest")),
    ("now", Position("now")), ("latest", Position("now")), ("end", Position("now")),
    ("0", Position("offset", 0)), (" 1234 ", Position("offset", 1234)),
    ("@1700000000000", Position("time", 1_700_000_000_000)),
    ("2023-11-14T22:13:20Z", Position("time", 1_700_000_000_000)),
    ("2023-11-14T22:13:20", Position("time", 1_700_000_000_000)),  # no zone: UTC
    ("2023-11-14T23:13:20+01:00", Position("time", 1_700_000_000_000)),
])
def test_parse_position(text: str, expected: Position) -> None:
    assert parse_position(text) == expected


@pytest.mark.parametrize("text, why", [("-5", "offsets are >= 0"), ("@soon", "epoch milliseconds"),
                                       ("yesterday", "expected earliest, now")])
def test_parse_position_refusals(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_position(text)


@pytest.mark.parametrize("text, expected", [
    ("20231114", Position("offset", 20_231_114)),  # digits are an offset, never a basic-format date
    ("0000", Position("offset", 0)),
    ("\tearliest\n", Position("earliest")),
    ("2023-11-14", Position("time", 1_699_920_000_000)),  # a date alone: its midnight UTC
    ("2023-11-14T22:13:20.5Z", Position("time", 1_700_000_000_500)),
])
def test_parse_position_edge_cases(text: str, expected: Position) -> None:
    assert parse_position(text) == expected


@pytest.mark.parametrize("text, why", [("@", "epoch milliseconds"), ("", "expected earliest, now"),
                                       ("   ", "expected earliest, now"), ("EARLIEST", "expected earliest"),
                                       ("+5", "expected earliest"), ("1e3", "expected earliest"),
                                       ("1_000", "expected earliest"),
                                       # int() takes these; a position must not
                                       ("--5", "expected earliest"), ("\u00b2", "expected earliest"),
                                       ("\u0661\u0662", "expected earliest"),
                                       ("@-1", "digits only"), ("@1_000", "digits only"),
                                       ("@ 5", "digits only"), ("@+5", "digits only"),
                                       ("1969-12-31T23:59:59Z", "before 1970")])
def test_parse_position_refuses_near_misses(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_position(text)


def test_restore_refuses_a_candidate_on_snapshot_or_value_errors_only() -> None:
    """``accept`` restores the blob into a probe operator, whose kernels refuse a bad one with
    a plain ValueError: that is a refusal (fall back), anything else stops the restore."""
    store = MemoryStore(blob_at(5), blob_at(3))
    seen: list[int] = []

    def refuse_newest(exc: Exception):
        def accept(ref: SnapshotRef, blob: bytes) -> None:
            seen.append(ref.generation)
            if ref.generation == 2:
                raise exc
        return accept

    for exc in (ValueError("bad sketch section"), SnapshotError("bad envelope"), ConfigError("geometry")):
        seen.clear()
        result = store.restore("op", 0, accept=refuse_newest(exc))
        assert seen == [2, 1] and result.ref.generation == 1 and result.blob == store.blobs[1]
        assert result.refused == [(2, str(exc))]
    for exc in (PartitionCountChanged("moved"), RuntimeError("bug")):
        with pytest.raises(type(exc)):
            store.restore("op", 0, accept=refuse_newest(exc))


def test_error_types_keep_what_their_callers_catch() -> None:
    """The runtimes catch CheckpointError and DeliveryError separately (an undelivered output
    is no failed checkpoint); config and mismatch errors are still ValueErrors for callers
    that caught those."""
    from grudge_stream.exceptions import DeliveryError, GrudgeError, InvalidInputError, MismatchError

    assert issubclass(DeliveryError, GrudgeError) and not issubclass(DeliveryError, CheckpointError)
    assert issubclass(PartitionCountChanged, CheckpointError)
    assert not issubclass(PartitionCountChanged, ValueError)  # stops the restore, never a fallback
    for cls in (ConfigError, MismatchError, SnapshotError, InvalidInputError):
        assert issubclass(cls, GrudgeError) and issubclass(cls, ValueError), cls
    assert not issubclass(CheckpointError, ValueError)
