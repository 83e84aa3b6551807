"""The records of the snapshot topic: keys, chunk headers, manifests (docs/checkpoints.md).

Pure: bytes in, bytes out, no Kafka client. ``grudge_stream.checkpoint.store``
produces and reads these records.

- **chunk records**, keyed ``operator \\0 partition \\0 "chunk" \\0 slot \\0 index``:
  a 32-byte header (magic ``GRDC``, generation u64, index u32, count u32,
  CRC-32C of the data u32, data length u32, reserved u32) and at most
  ``chunk_bytes`` of the snapshot blob. Generation ``g`` writes into slot
  ``g % 2``, so the chunks of generation ``g - 1`` stay intact (compaction keeps
  the newest record per key) while ``g`` is being written.
- **one manifest record**, keyed ``operator \\0 partition`` — the record the
  spec calls the snapshot record, written only after every chunk is
  acknowledged: JSON with the generation, slot, the chunks' offsets, the
  blob's size and CRC-32C, the next source offset it reflects, the watermark,
  the config fingerprint, the source topic and its partition count, and the
  same facts for the previous generation.

Versions: the manifest carries ``version`` (1), and a reader refuses any other.
The chunk header has no version of its own: chunks are only ever read through
the manifest that names them, so a change to the chunk layout is a new manifest
version. The reserved header field is written 0 and not checked on read.

Every check here raises ``SnapshotError``: the store then refuses that
generation and falls back to the previous one.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Sequence

from grudge_stream._cyext._pack import encode_chunk as _encode_chunk
from grudge_stream.exceptions import SnapshotError
from grudge_stream.hashing import crc32c

CHUNK_MAGIC = b"GRDC"
CHUNK_HEADER = struct.Struct("<4sQIIIII")  # magic, generation, index, count, crc, length, reserved
_CHUNK = CHUNK_HEADER  # the name the store used for it
MANIFEST_MAGIC = "grudge-stream-snapshot"
MANIFEST_VERSION = 1
DEFAULT_CHUNK_BYTES = 512 * 1024  # well under Kafka's ~1 MB default message limit


def manifest_key(operator_id: str, partition: int) -> bytes:
    return f"{operator_id}\x00{partition}".encode()


def chunk_key(operator_id: str, partition: int, slot: int, index: int) -> bytes:
    return f"{operator_id}\x00{partition}\x00chunk\x00{slot}\x00{index}".encode()


@dataclass(frozen=True)
class SnapshotRef:
    """Where one complete snapshot generation lives, as a manifest records it."""

    generation: int
    slot: int
    offsets: tuple[int, ...]
    size: int
    crc: int
    next_offset: int | None
    watermark: int | None
    fingerprint: str
    source_topic: str
    partition_count: int
    written_ms: int
    app_id: str = ""  # the deployment that wrote it; "" in snapshots of earlier releases

    def to_dict(self) -> dict:
        d = {
            "generation": self.generation, "slot": self.slot, "offsets": list(self.offsets),
            "size": self.size, "crc": self.crc, "next_offset": self.next_offset,
            "watermark": self.watermark, "fingerprint": self.fingerprint,
            "source_topic": self.source_topic, "partition_count": self.partition_count,
            "written_ms": self.written_ms,
        }
        if self.app_id:  # an added field: readers of earlier releases ignore it
            d["app_id"] = self.app_id
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SnapshotRef":
        if not isinstance(d["offsets"], list):
            raise TypeError(f"offsets must be a list, got {type(d['offsets']).__name__}")
        return cls(
            generation=int(d["generation"]), slot=int(d["slot"]),
            offsets=tuple(int(o) for o in d["offsets"]), size=int(d["size"]), crc=int(d["crc"]),
            next_offset=None if d["next_offset"] is None else int(d["next_offset"]),
            watermark=None if d["watermark"] is None else int(d["watermark"]),
            fingerprint=str(d["fingerprint"]), source_topic=str(d["source_topic"]),
            partition_count=int(d["partition_count"]), written_ms=int(d["written_ms"]),
            app_id=str(d.get("app_id") or ""),
        )


@dataclass
class Manifest:
    operator_id: str
    partition: int
    current: SnapshotRef
    previous: SnapshotRef | None
    offset: int = -1  # where the manifest itself was read from

    def encode(self) -> bytes:
        body = {
            "magic": MANIFEST_MAGIC, "version": MANIFEST_VERSION,
            "operator_id": self.operator_id, "partition": self.partition,
            "current": self.current.to_dict(),
            "previous": None if self.previous is None else self.previous.to_dict(),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes, offset: int = -1) -> "Manifest":
        """The manifest in ``value``; SnapshotError if it is not one, of another version, or
        malformed."""
        try:
            d = json.loads(value)
            if not isinstance(d, dict) or d.get("magic") != MANIFEST_MAGIC:
                raise SnapshotError("not a snapshot manifest")
            if d.get("version") != MANIFEST_VERSION:
                raise SnapshotError(f"snapshot manifest version {d.get('version')} is not supported")
            return cls(
                operator_id=str(d["operator_id"]), partition=int(d["partition"]),
                current=SnapshotRef.from_dict(d["current"]),
                previous=None if d["previous"] is None else SnapshotRef.from_dict(d["previous"]),
                offset=offset,
            )
        except SnapshotError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"snapshot manifest is malformed: {exc}") from None


def encode_chunk(generation: int, index: int, count: int, data: bytes | memoryview) -> bytes:
    """Chunk ``index`` of ``count`` of a generation: the header, then ``data`` (a slice of the
    blob, say), copied once and checksummed in the kernel without the GIL."""
    return _encode_chunk(generation, index, count, data)


def encode_chunk_py(generation: int, index: int, count: int, data: bytes | memoryview) -> bytes:
    """``encode_chunk`` in Python, as earlier releases made it (two copies with the GIL held):
    the reference the kernel's bytes are tested against."""
    return CHUNK_HEADER.pack(CHUNK_MAGIC, generation, index, count, crc32c(data), len(data), 0) + bytes(data)


def decode_chunk(value: bytes | None, ref: SnapshotRef, index: int) -> bytes:
    """The data of chunk ``index`` of generation ``ref``, once its header and CRC-32C check out."""
    if value is None or len(value) < CHUNK_HEADER.size:
        raise SnapshotError(f"chunk {index} of generation {ref.generation} is truncated")
    magic, gen, idx, count, crc, length, _reserved = CHUNK_HEADER.unpack_from(value, 0)
    data = value[CHUNK_HEADER.size:]
    if magic != CHUNK_MAGIC:
        raise SnapshotError(f"chunk {index} of generation {ref.generation} is not a snapshot chunk "
                            f"(magic {magic!r})")
    if gen != ref.generation or idx != index or count != len(ref.offsets):
        raise SnapshotError(f"chunk {index} belongs to another snapshot generation ({gen}, chunk {idx} "
                            f"of {count})")
    if length != len(data):
        raise SnapshotError(f"chunk {index} of generation {ref.generation} holds {len(data)} bytes, "
                            f"its header says {length}")
    if crc32c(data) != crc:
        raise SnapshotError(f"chunk {index} of generation {ref.generation} fails its CRC-32C check")
    return data


def join_chunks(parts: Sequence[bytes | None], ref: SnapshotRef) -> bytes:
    """The blob of generation ``ref`` from its chunks' data, checked against the manifest's size
    and CRC-32C; a chunk not found (None) refuses it."""
    if len(parts) != len(ref.offsets) or any(p is None for p in parts):
        raise SnapshotError(f"chunks of generation {ref.generation} are missing (compacted or truncated)")
    blob = b"".join(parts)  # type: ignore[arg-type]
    if len(blob) != ref.size or crc32c(blob) != ref.crc:
        raise SnapshotError(f"snapshot generation {ref.generation} fails its size/CRC-32C check")
    return blob
