"""Reading the upgrade fixture (tests/data/upgrade-0.2.0, written by tools/make_upgrade_fixture.py
with the released 0.2.0 package): its records, and the snapshot generations its manifests name,
assembled with the current checkpoint format code. Shared by tests/unit/test_upgrade_fixture.py
and tests/integration/test_upgrade.py."""
from __future__ import annotations

import base64
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from grudge_stream.checkpoint.format import Manifest, SnapshotRef, chunk_key, decode_chunk, join_chunks, manifest_key
from grudge_stream.operators.records import SourceRecord
from grudge_stream.topology import Settings, load_topology

FIXTURE = Path(__file__).resolve().parent / "data" / "upgrade-0.2.0"
NAMES = sorted(p.stem for p in FIXTURE.glob("*.json"))


def sha(b: bytes | None) -> str | None:
    return None if b is None else hashlib.sha256(b).hexdigest()


def _b(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class Fixture:
    """One topology's file."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.doc = json.loads((FIXTURE / f"{name}.json").read_text())
        self.settings: dict[str, str] = self.doc["settings"]
        self.partitions: int = self.doc["partitions"]
        self.topics: dict[str, str] = self.doc["topics"]
        self.expected: dict = self.doc["expected"]
        assert self.doc["record_fields"] == ["partition", "offset", "timestamp", "key", "value", "headers"]
        self.records: dict[str, list[Rec]] = {
            role: [Rec(p, off, ts, _b(k), _b(v), tuple((h, _b(hv)) for h, hv in headers))
                   for p, off, ts, k, v, headers in recs]
            for role, recs in self.doc["records"].items()}

    def topology(self, **extra: str):
        # 0.2.0 knew one index scheme, Kirsch-Mitzenmacher: its state is read as ``km`` (a
        # worker left at the default adopts it from the snapshots; test_upgrade.py runs that).
        return load_topology(self.name, Settings({**self.settings, "index_scheme": "km", **extra}, environ={}))

    def source_records(self, partition: int, below: int | None = None) -> list[SourceRecord]:
        topic = self.topics["source"]
        return [SourceRecord(topic, r.partition, r.offset, r.timestamp, r.key, r.value, list(r.headers) or None)
                for r in self.records["source"]
                if r.partition == partition and (below is None or r.offset < below)]

    def snapshot_partition(self, partition: int) -> int:
        return partition % self.partitions  # the snapshot topic has the source's partition count

    def manifests(self, partition: int) -> list[Manifest]:
        """Every manifest of ``partition`` in the snapshot topic, oldest first (current code)."""
        key = manifest_key(self.topics_operator_id, partition)
        sp = self.snapshot_partition(partition)
        return [Manifest.decode(r.value, r.offset) for r in self.records["snapshots"]
                if r.partition == sp and r.key == key]

    @property
    def topics_operator_id(self) -> str:
        return self.settings["operator_id"]

    def refs(self, partition: int) -> dict[int, SnapshotRef]:
        """generation -> its ref, from every manifest (current and previous)."""
        out: dict[int, SnapshotRef] = {}
        for man in self.manifests(partition):
            for ref in (man.current, man.previous):
                if ref is not None:
                    out.setdefault(ref.generation, ref)
        return out

    def assemble(self, partition: int, ref: SnapshotRef) -> bytes:
        """The blob of generation ``ref`` from the chunk records it names (current format code)."""
        sp = self.snapshot_partition(partition)
        by_offset = {r.offset: r for r in self.records["snapshots"] if r.partition == sp}
        parts: list[bytes | None] = []
        for i, off in enumerate(ref.offsets):
            r = by_offset.get(off)
            if r is None or r.key != chunk_key(self.topics_operator_id, partition, ref.slot, i):
                parts.append(None)
                continue
            parts.append(decode_chunk(r.value, ref, i))
        return join_chunks(parts, ref)

    def generations(self, partition: int) -> list[dict]:
        return self.expected["partitions"][str(partition)]["generations"]

    def raised(self) -> set[bytes] | None:
        got = self.expected.get("raised")
        return None if got is None else {base64.b64decode(k) for k in got}


def by_partition(recs: list[Rec]) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = defaultdict(list)
    for r in recs:
        out[r.partition].append(r)
    return out
