"""The snapshot envelope refuses anything truncated, flipped, foreign or from the future."""
from __future__ import annotations

import struct

import pytest

from grudge_stream import SnapshotError
from grudge_stream.envelope import KIND_COUNT_MIN, KIND_SCORE_SKETCH, fingerprint, pack, unpack


def _blob() -> bytes:
    return pack(KIND_SCORE_SKETCH, {"levels": 2, "hi": float("inf"), "seed": 7}, bytes(range(40)))


def test_round_trip() -> None:
    header, payload = unpack(_blob(), KIND_SCORE_SKETCH)
    assert header == {"levels": 2, "hi": float("inf"), "seed": 7}
    assert bytes(payload) == bytes(range(40))


def test_every_bit_flip_and_truncation_is_refused() -> None:
    blob = _blob()
    for i in range(len(blob)):
        for bit in range(8):
            bad = bytearray(blob)
            bad[i] ^= 1 << bit
            with pytest.raises(SnapshotError):
                unpack(bytes(bad), KIND_SCORE_SKETCH)
    for n in range(len(blob)):
        with pytest.raises(SnapshotError):
            unpack(blob[:n], KIND_SCORE_SKETCH)
    with pytest.raises(SnapshotError):
        unpack(blob + b"\0", KIND_SCORE_SKETCH)


def test_wrong_kind_and_future_version_are_refused() -> None:
    with pytest.raises(SnapshotError, match="not a DecayingCountMin"):
        unpack(_blob(), KIND_COUNT_MIN)
    blob = bytearray(_blob())
    struct.pack_into("<H", blob, 4, 99)
    with pytest.raises(SnapshotError, match="format version 99"):
        unpack(bytes(blob), KIND_SCORE_SKETCH)
    with pytest.raises(SnapshotError):
        unpack("text", KIND_SCORE_SKETCH)


def test_fingerprint_is_order_independent_and_sensitive() -> None:
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1, "b": 2}) != fingerprint({"a": 1, "b": 3})
