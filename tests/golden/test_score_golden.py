"""Pinned snapshots: any change to the ScoreSketch / Rotator byte format is a deliberate diff.

If one of these fails, the serialized format (or the semantics that produced the
state) changed. Either revert, or bump the envelope's format version, document
the new layout in docs/score-sketch.md and re-pin these blobs in the same commit.

The hex blobs were written by grudge-stream 0.2 (Kirsch-Mitzenmacher indexes); built with
``index_scheme="km"`` they are still the same bytes. ``data/*_independent.bin`` pin the
default scheme (regenerate with ``GRUDGE_REGEN_GOLDEN=1``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from grudge_stream import Exponential, Linear, Rotator, ScoreSketch

DATA = Path(__file__).parent / "data"
REGEN = os.environ.get("GRUDGE_REGEN_GOLDEN") == "1"

SKETCH_HEX = (
    "4752445301000100b40000007b22636f6e666967223a7b2261676772656761746f72223a226d696e222c2263"
    "656c6c735f7065725f6c6576656c223a342c226465636179223a7b226b696e64223a226578706f6e656e7469"
    "616c222c226c616d6264615f7065725f73223a302e357d2c22686173686572223a226d75726d757233222c22"
    "6869223a322e302c226c6576656c73223a322c226c6f223a2d312e302c2273656564223a34327d2c22776174"
    "65726d61726b5f6d73223a323530307d80000000000000000000000000000040d00700000000000000000000"
    "00000000c4090000000000000000000000000000000000000000008000000000000000000000000000000080"
    "0000000000000040d0070000000000000a966ffcb268c3bfc409000000000000000000000000000000000000"
    "000000800000000000000000000000000000008030533053"
)
ROTATOR_HEX = (
    "4752445301000200320100007b22636f6e666967223a7b2267656e65726174696f6e73223a322c2270657269"
    "6f645f6d73223a313030302c22736b65746368223a7b2261676772656761746f72223a226d6178222c226365"
    "6c6c735f7065725f6c6576656c223a332c226465636179223a7b226b696e64223a226c696e656172222c2272"
    "6174655f7065725f73223a302e357d2c22686173686572223a2273697068617368222c226869223a496e6669"
    "6e6974792c226c6576656c73223a322c226c6f223a302e302c2273656564223a377d7d2c2265706f6368223a"
    "312c2267656e65726174696f6e5f7365656473223a5b31303735333136353932383330313437323230332c38"
    "3334363037393834353530303732333637345d2c22726f746174696f6e73223a312c2277617465726d61726b"
    "5f6d73223a313530307dc000000000000000000000000000f63fdc0500000000000000000000000000000000"
    "00000000008000000000000000000000000000000080000000000000f63fdc05000000000000000000000000"
    "0000000000000000008000000000000000000000000000000080000000000000000000000000000000800000"
    "00000000e03fe20400000000000000000000000000000000000000000080000000000000e03fe20400000000"
    "000000000000000000000000000000000080000000000000000000000000000000801006abc6"
)


def build_sketch(scheme: str = "km") -> ScoreSketch:
    s = ScoreSketch(
        index_scheme=scheme,
        levels=2,
        cells_per_level=4,
        decay=Exponential(0.5),
        lo=-1.0,
        hi=2.0,
        aggregator="min",
        hasher="murmur3",
        seed=42,
    )
    s.update(b"client-7", 0.75, now_ms=1_000)
    s.update(b"client-42", -0.25, now_ms=1_500)
    s.update(b"client-7", 2.0, now_ms=2_000)
    s.query(b"client-9", now_ms=2_500)
    return s


def build_rotator(scheme: str = "km") -> Rotator:
    r = Rotator(
        index_scheme=scheme,
        generations=2,
        period_ms=1_000,
        levels=2,
        cells_per_level=3,
        decay=Linear(0.5),
        lo=0.0,
        hi=float("inf"),
        aggregator="max",
        hasher="siphash",
        seed=7,
    )
    r.update(b"a", 1.5, now_ms=250)
    r.update(b"b", 0.5, now_ms=1_250)
    r.try_update(b"a", 1.0, 2.0, now_ms=1_500)
    return r


def test_score_sketch_bytes_are_pinned() -> None:
    pinned = bytes.fromhex("".join(SKETCH_HEX))
    assert build_sketch().to_bytes() == pinned
    loaded = ScoreSketch.from_bytes(pinned)
    assert loaded.to_bytes() == pinned
    assert loaded.watermark_ms == 2_500
    # client-7: 0.75 decayed over 1 s, + 2.0, clamped to hi = 2.0; then 0.5 s more decay.
    assert loaded.query(b"client-7", now_ms=2_500) == 2.0 * math.exp(-0.5 * (500 / 1000.0))


def test_rotator_bytes_are_pinned() -> None:
    pinned = bytes.fromhex("".join(ROTATOR_HEX))
    assert build_rotator().to_bytes() == pinned
    loaded = Rotator.from_bytes(pinned)
    assert loaded.to_bytes() == pinned
    assert (loaded.rotations, loaded.epoch, loaded.watermark_ms) == (1, 1, 1_500)
    # In the oldest generation a and b share both cells: a's 1.5 at 250 ms drains to 1.0 by
    # 1250 ms, b adds 0.5, and by 1500 ms the cells hold 1.375; 1.375 + 1.0 > 2.0, so the
    # try_update at 1500 ms was refused and wrote nothing.
    assert loaded.query_detailed(b"a", now_ms=1_500) == (1.375, (1.375, 1.375), (0, 0))


@pytest.mark.parametrize("name,build,cls", [("score_independent.bin", build_sketch, ScoreSketch),
                                            ("rotator_independent.bin", build_rotator, Rotator)])
def test_independent_scheme_bytes_are_pinned(name, build, cls) -> None:
    blob = build("independent").to_bytes()
    path = DATA / name
    if REGEN:
        path.write_bytes(blob)
    assert blob == path.read_bytes(), f"{name}: the serialized form changed"
    loaded = cls.from_bytes(blob)
    assert loaded.to_bytes() == blob and loaded.index_scheme == "independent"
    assert b'"index_scheme":"independent"' in blob


def test_the_pinned_km_blobs_restore_with_their_scheme() -> None:
    for hexes, cls in ((SKETCH_HEX, ScoreSketch), (ROTATOR_HEX, Rotator)):
        assert cls.from_bytes(bytes.fromhex(hexes)).index_scheme == "km"
    s = ScoreSketch.from_bytes((DATA / "score_independent.bin").read_bytes())
    assert s.query(b"client-7", now_ms=2_500) == 2.0 * math.exp(-0.5 * (500 / 1000.0))
