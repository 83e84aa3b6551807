"""Pinned snapshots of DecayingCountMin and ForgettingBloom: a change of the byte
format, the hashing, the sizing or the update rules shows up here as a diff.

Regenerate deliberately with ``GRUDGE_REGEN_GOLDEN=1 pytest tests/golden`` and say
why in the commit; old blobs must then still load or be refused with a clear error.

``countmin_v1.bin`` and ``bloom_v2.bin`` were written by grudge-stream 0.2 (Kirsch-Mitzenmacher
indexes): built with ``index_scheme="km"`` today they are still the same bytes. The
``*_independent.bin`` blobs pin the default scheme.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from grudge_stream import DecayingCountMin, ForgettingBloom

DATA = Path(__file__).parent / "data"
REGEN = os.environ.get("GRUDGE_REGEN_GOLDEN") == "1"


def _countmin(scheme: str = "km") -> DecayingCountMin:
    c = DecayingCountMin(
        depth=3, width=16, epoch_ms=1000, counter_bits=12, seed=42, hasher="murmur3", top_k=3,
        index_scheme=scheme,
    )
    c.increment(b"client-42", 100, now_ms=0)
    c.increment("caf\u00e9", 7, now_ms=500)
    c.increment_many([b"a", b"b", b"a"], counts=[3, 4, 5], now_ms=2_000)
    c.increment_many(np.array([0x0123456789ABCDEF], dtype=np.uint64), counts=9, now_ms=2_100)
    c.increment(b"late", 2, now_ms=100)  # an old event: applied at the current epoch
    return c


def _bloom(scheme: str = "km") -> ForgettingBloom:
    b = ForgettingBloom(
        capacity=12, fp_rate=0.05, generations=3, period_ms=1000, seed=42, hasher="siphash",
        index_scheme=scheme,
    )
    b.add_many([b"s-%d" % i for i in range(10)], now_ms=0)
    b.add_if_absent_many([b"s-1", b"n-1", b"n-2"], now_ms=1_200)
    for i in range(12):
        b.add(b"cap-%d" % i, now_ms=1_300)  # reaches capacity: one more rotation
    return b


@pytest.mark.parametrize(
    "name,build,cls,scheme",
    [("countmin_v1.bin", _countmin, DecayingCountMin, "km"), ("bloom_v2.bin", _bloom, ForgettingBloom, "km"),
     ("countmin_independent.bin", _countmin, DecayingCountMin, "independent"),
     ("bloom_independent.bin", _bloom, ForgettingBloom, "independent")],
)
def test_snapshot_is_pinned(name, build, cls, scheme) -> None:
    blob = build(scheme).to_bytes()
    path = DATA / name
    if REGEN:
        path.write_bytes(blob)
    assert blob == path.read_bytes(), f"{name}: the serialized form changed"
    loaded = cls.from_bytes(path.read_bytes())
    assert loaded.to_bytes() == blob and loaded.index_scheme == scheme
    assert (b'"index_scheme"' in blob) == (scheme == "independent")


@pytest.mark.parametrize("name", ["countmin_v1.bin", "countmin_independent.bin"])
def test_pinned_countmin_answers(name) -> None:
    c = DecayingCountMin.from_bytes((DATA / name).read_bytes())
    assert c.epoch == 2 and c.config.epoch_ms == 1000
    if name == "countmin_v1.bin":  # 3 x 16 cells: collisions show, and differ by scheme
        assert c.query(b"client-42", now_ms=2_000) == 25
        assert c.query(b"a", now_ms=2_000) == 8
        assert c.query("caf\u00e9", now_ms=500) == 7 >> 2  # a read at an older time reads epoch 2
        assert c.query(b"late", now_ms=2_000) == 2
        assert c.query(b"b", now_ms=3_000) == 2
        assert c.top() == [(b"client-42", 25), (0x0123456789ABCDEF, 9), (b"a", 8)]
    else:
        assert c.query(b"client-42", now_ms=2_000) == 25
        assert c.query(b"a", now_ms=2_000) >= 8 and c.query(b"late", now_ms=2_000) >= 2
        assert [k for k, _ in c.top()][:1] == [b"client-42"]


@pytest.mark.parametrize("name", ["bloom_v1.bin", "bloom_v2.bin", "bloom_independent.bin"])
def test_pinned_bloom_answers(name) -> None:
    """bloom_v1.bin: header format 1 (before generation starts were kept), still loaded."""
    b = ForgettingBloom.from_bytes((DATA / name).read_bytes())
    assert b.rotations == 2 and b.period_index == 1 and b.hashes == 6
    assert b.contains(b"cap-3", now_ms=1_300) and b.contains(b"n-2", now_ms=1_300)
    assert b.contains(b"s-4", now_ms=1_300)
    # the capacity rotation at 1_300 started the newest generation there (format 2);
    # format 1 knew only the grid
    assert b.generation_starts_ms == ([-1000, 0, 1000] if name == "bloom_v1.bin" else [0, 1000, 1300])
