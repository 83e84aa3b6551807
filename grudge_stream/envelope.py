"""The versioned, checksummed container every serialized sketch travels in.

Layout (all integers little-endian; documented in docs/formats.md)::

    offset  size  field
    0       4     magic  b"GRDS"
    4       2     format version (u16, currently 1)
    6       2     kind (u16): 1 ScoreSketch, 2 Rotator, 3 DecayingCountMin, 4 ForgettingBloom,
                  16 operator snapshot
    8       4     header length H (u32)
    12      H     header: canonical JSON (UTF-8, sorted keys, no spaces) holding the
                  full config, seed(s) and scalar state (clock state, counters)
    12+H    8     payload length P (u64)
    20+H    P     payload: the kind's little-endian arrays
    20+H+P  4     CRC-32C over bytes [0, 20+H+P)

``unpack`` checks, in this order, the length, magic, version, kind, the
exact total size and the checksum, and only then parses the header: a
truncated, bit-flipped, foreign or future blob raises ``SnapshotError`` and
never yields a half-valid sketch.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Sequence

from grudge_stream._cyext._hashing import crc32c
from grudge_stream._cyext._pack import Envelope as Envelope  # the type of ``later``
from grudge_stream._cyext._pack import build as _build
from grudge_stream._cyext._pack import pack as _pack
from grudge_stream.exceptions import SnapshotError

MAGIC = b"GRDS"
FORMAT_VERSION = 1

KIND_SCORE_SKETCH = 1
KIND_ROTATOR = 2
KIND_COUNT_MIN = 3
KIND_FORGETTING_BLOOM = 4
KIND_SPLIT_SCORE = 5
KIND_OPERATOR = 16

KIND_NAMES = {
    KIND_SCORE_SKETCH: "ScoreSketch",
    KIND_ROTATOR: "Rotator",
    KIND_COUNT_MIN: "DecayingCountMin",
    KIND_FORGETTING_BLOOM: "ForgettingBloom",
    KIND_SPLIT_SCORE: "SplitScoreSketch",
    KIND_OPERATOR: "operator state",
}

_HEAD = struct.Struct("<4sHHI")  # magic, version, kind, header length
_PLEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
MIN_SIZE = _HEAD.size + _PLEN.size + _CRC.size


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON: sorted keys, no whitespace; floats as repr (exact round trip)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True).encode("utf-8")


def pack(kind: int, header: dict, payload: Any) -> bytes:
    """Wrap a header dict and a payload (bytes-like) into a checksummed blob.

    The payload is copied into the blob and checksummed in the kernel without the GIL
    (``grudge_stream._cyext._pack``): a snapshot of megabytes made on one thread does not stop
    the others. ``payload`` must not change meanwhile (bytes, or a private copy)."""
    return _pack(kind, canonical_json(header), (payload,), FORMAT_VERSION)


def pack_parts(kind: int, header: dict, parts: Sequence[Any]) -> bytes:
    """``pack(kind, header, b"".join(parts))`` without the join: each part is copied once,
    straight into the blob, without the GIL. A part may be an envelope not built yet
    (``later``): it is built in place."""
    return _pack(kind, canonical_json(header), parts, FORMAT_VERSION)


def later(kind: int, header: dict, parts: Sequence[Any]) -> Envelope:
    """The envelope ``pack_parts`` would make, not built yet: ``build`` makes its bytes, and
    an envelope that holds it among its parts writes it in place (one blob for a snapshot
    of envelopes within envelopes, no copy or free of the inner ones). ``len()`` is its size."""
    return Envelope(kind, canonical_json(header), parts, FORMAT_VERSION)


def build(env: Envelope) -> bytes:
    """The bytes of an envelope made by ``later`` (and of those within it): one allocation,
    every part copied once and every checksum computed, without the GIL."""
    return _build(env)


def pack_py(kind: int, header: dict, payload: Any) -> bytes:
    """``pack`` in Python, as earlier releases made it (every copy with the GIL held): the
    reference the kernel's bytes are tested against, and the old path of
    benchmarks/bench_snapshot_stall.py."""
    hdr = canonical_json(header)
    body = b"".join(
        (_HEAD.pack(MAGIC, FORMAT_VERSION, kind, len(hdr)), hdr,
         _PLEN.pack(memoryview(payload).nbytes), payload)
    )
    return body + _CRC.pack(crc32c(body))


def unpack(data: Any, expected_kind: int) -> tuple[dict, memoryview]:
    """Validate a blob and return ``(header, payload)``; raise SnapshotError on anything off."""
    name = KIND_NAMES.get(expected_kind, f"kind {expected_kind}")
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise SnapshotError(f"{name} snapshot must be bytes-like, not {type(data).__name__}") from None
    n = view.nbytes
    if n < MIN_SIZE:
        raise SnapshotError(f"{name} snapshot truncated: {n} bytes, need at least {MIN_SIZE}")
    magic, version, kind, hlen = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise SnapshotError(f"not a grudge-stream snapshot (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise SnapshotError(
            f"{name} snapshot has format version {version}; this grudge-stream reads version "
            f"{FORMAT_VERSION}. Operator action: load it with the release that wrote it."
        )
    if kind != expected_kind:
        other = KIND_NAMES.get(kind, f"unknown kind {kind}")
        raise SnapshotError(f"snapshot holds a {other}, not a {name}")
    if _HEAD.size + hlen + _PLEN.size + _CRC.size > n:
        raise SnapshotError(f"{name} snapshot truncated inside its header")
    (plen,) = _PLEN.unpack_from(view, _HEAD.size + hlen)
    end = _HEAD.size + hlen + _PLEN.size + plen
    if end + _CRC.size != n:
        raise SnapshotError(
            f"{name} snapshot size mismatch: {n} bytes, header says {end + _CRC.size} (truncated or padded)"
        )
    (stored,) = _CRC.unpack_from(view, end)
    actual = crc32c(view[:end])
    if stored != actual:
        raise SnapshotError(f"{name} snapshot checksum mismatch (stored {stored:#010x}, computed {actual:#010x})")
    try:
        header = json.loads(bytes(view[_HEAD.size:_HEAD.size + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotError(f"{name} snapshot header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SnapshotError(f"{name} snapshot header must be a JSON object")
    return header, view[_HEAD.size + hlen + _PLEN.size:end]


def fingerprint(config: dict) -> str:
    """A stable identity for a config dict: the first 16 hex digits of SHA-256 of its canonical JSON."""
    return hashlib.sha256(canonical_json(config)).hexdigest()[:16]
