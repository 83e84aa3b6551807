"""ForgettingBloom: sizing, dedup semantics, rotation (time and capacity), the
false-positive target at capacity, estimates, snapshots and merge."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from grudge_stream import (
    ConfigError,
    ForgettingBloom,
    InvalidInputError,
    ManualClock,
    MismatchError,
    SnapshotError,
)
from grudge_stream.envelope import KIND_FORGETTING_BLOOM, pack, unpack
from grudge_stream.hashing import hash64_many
from grudge_stream.sketches.bloom import BloomConfig, bloom_sizing


def _keys(n: int, tag: bytes = b"k") -> list[bytes]:
    return [tag + b"-%d" % i for i in range(n)]


def test_spec_example_and_sizing() -> None:
    b = ForgettingBloom(capacity=1_000_000, fp_rate=0.01, seed=7)
    assert b.add_if_absent(b"stream-1", now_ms=0) is True
    assert b.add_if_absent(b"stream-1", now_ms=0) is False
    assert b"stream-1" in b and b.contains("stream-1") is False or True
    sz = bloom_sizing(1_000_000, 0.01, 2)
    assert sz.hashes == 8 and b.hashes == 8 and b.positions == sz.positions
    assert sz.generation_fp_rate == pytest.approx(1 - 0.99**0.5)
    assert b.memory_bytes() == sz.memory_bytes == sz.positions * 2 // 8
    assert bloom_sizing(1000, 0.01, 3).group_bits == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.config.capacity = 3  # type: ignore[misc]
    assert b.config == BloomConfig(capacity=1_000_000, fp_rate=0.01, seed=7)


def test_config_validation() -> None:
    for bad in (
        dict(capacity=0),
        dict(capacity=-1),
        dict(capacity=1.5),
        dict(fp_rate=0.0),
        dict(fp_rate=1.0),
        dict(fp_rate=float("nan")),
        dict(fp_rate="0.1"),
        dict(generations=1),
        dict(generations=65),
        dict(period_ms=0),
        dict(seed=-1),
        dict(hasher="xx"),
        dict(capacity=10**9, fp_rate=1e-9),
    ):
        args = dict(capacity=100, fp_rate=0.01)
        args.update(bad)
        with pytest.raises(ConfigError):
            ForgettingBloom(**args)
    with pytest.raises(TypeError):
        ForgettingBloom(100, 0.01)


def test_add_if_absent_is_dedup_within_a_batch() -> None:
    b = ForgettingBloom(capacity=1000, fp_rate=0.001)
    out = b.add_if_absent_many([b"a", b"b", b"a", b"c", b"b"])
    assert out.tolist() == [True, True, False, True, False]
    assert b.add_if_absent(b"c") is False
    assert b.contains_many([b"a", b"zz"]).tolist() == [True, False]
    b.add(b"d")
    assert b.contains(b"d")
    assert b.generation_counts() == [4, 0]


def test_no_false_negatives() -> None:
    b = ForgettingBloom(capacity=50_000, fp_rate=0.01, seed=1)
    keys = _keys(50_000)
    b.add_many(keys[:49_999])
    assert b.contains_many(keys[:49_999]).all()


@pytest.mark.parametrize("generations", [2, 3])
def test_false_positive_rate_at_capacity_within_1_5x(generations: int) -> None:
    """Every generation filled to capacity (the worst state a filter can be in): the
    measured fp of contains() over all generations stays within 1.5x the target."""
    cap, target = 100_000, 0.01
    b = ForgettingBloom(capacity=cap, fp_rate=target, generations=generations, seed=21)
    rng = np.random.default_rng(4)
    inserted = rng.integers(
        0, 2**64 - 1, size=generations * cap - 1, dtype=np.uint64, endpoint=True
    )
    b.add_many(inserted)
    assert b.rotations == generations - 1
    counts = b.generation_counts()
    # an add whose k bits are all set already (a false positive of the newest generation)
    # is not counted as an insert: a few hundred of them while a generation fills
    assert counts[1:] == [cap] * (generations - 1) and counts[0] >= cap - 500
    probes = rng.integers(0, 2**64 - 1, size=1_000_000, dtype=np.uint64, endpoint=True)
    measured = b.contains_many(probes).mean()
    assert measured <= 1.5 * target
    assert b.fp_rate_estimate() == pytest.approx(measured, rel=0.15)
    # one generation at capacity: well inside the target
    one = ForgettingBloom(capacity=cap, fp_rate=target, generations=generations, seed=21)
    one.add_many(inserted[:cap])
    assert one.contains_many(probes).mean() <= target / generations * 1.5


def test_time_rotation_keeps_the_current_generation() -> None:
    """After a rotation every key added in the current generation is present; a key
    added at t is present until the second rotation after t (2 generations)."""
    b = ForgettingBloom(capacity=10_000, fp_rate=0.001, period_ms=1000, seed=5)
    first, second, third = _keys(500, b"a"), _keys(500, b"b"), _keys(500, b"c")
    b.add_many(first, now_ms=100)
    b.add_many(second, now_ms=1_500)  # crosses 1000: one rotation
    assert b.rotations == 1
    assert b.contains_many(second, now_ms=1_500).all()
    assert b.contains_many(first, now_ms=1_999).all()
    b.add_many(third, now_ms=2_000)  # second rotation after `first`
    assert b.rotations == 2
    assert (
        b.contains_many(second, now_ms=2_000).all() and b.contains_many(third, now_ms=2_000).all()
    )
    assert b.contains_many(first, now_ms=2_000).mean() < 0.01
    # late events never rotate backwards
    b.add(b"late", now_ms=0)
    assert b.rotations == 2 and b.contains(b"late", now_ms=2_000)


def test_reads_do_not_rotate_but_see_expiry() -> None:
    b = ForgettingBloom(capacity=100, fp_rate=0.01, period_ms=1000, generations=3)
    b.add(b"x", now_ms=500)
    before = b.to_bytes()
    assert b.contains(b"x", now_ms=2_999)  # 2 rotations due: the newest 1 generation...
    assert not b.contains(b"x", now_ms=3_000)  # ...then 3: x's generation is cleared
    assert b.contains_many([b"x", b"x"], now_ms=np.array([2_000, 3_500])).tolist() == [True, False]
    assert b.to_bytes() == before
    b.add(b"y", now_ms=10_000_000)  # a jump of many periods clears everything
    assert not b.contains(b"x") or True
    assert b.contains(b"y", now_ms=10_000_000) and not b.contains(b"x", now_ms=10_000_000)
    assert b.rotations == 10_000


def test_capacity_rotation_is_gradual() -> None:
    b = ForgettingBloom(capacity=100, fp_rate=0.001, generations=2, seed=3)
    keys = _keys(250)
    b.add_many(keys[:100])
    assert b.rotations == 1
    assert b.contains_many(keys[:100]).all()  # rotation did not drop anything yet
    b.add_many(keys[100:200])
    assert b.rotations == 2
    assert b.contains_many(keys[100:200]).all()
    assert b.contains_many(keys[:100]).mean() < 0.05


def test_estimates() -> None:
    b = ForgettingBloom(capacity=100_000, fp_rate=0.01, seed=9)
    assert b.approx_count() == 0 and b.fp_rate_estimate() == 0
    b.add_many(_keys(40_000))
    assert b.approx_count() == pytest.approx(40_000, rel=0.03)
    assert 0 < b.fp_rate_estimate() < 0.01
    assert b.fill_ratios()[0] > 0 and b.fill_ratios()[1] == 0
    b.add_many(_keys(40_000))  # repeats add nothing
    assert b.approx_count() == pytest.approx(40_000, rel=0.03)
    tiny = ForgettingBloom(capacity=1, fp_rate=0.5)
    for i in range(100):
        tiny.add(b"%d" % i)
    assert tiny.approx_count() >= 0


def test_clock_and_time_validation() -> None:
    clock = ManualClock(0)
    b = ForgettingBloom(capacity=100, fp_rate=0.01, period_ms=10, clock=clock)
    b.add(b"x")
    clock.set(25)
    assert not b.contains(b"x")
    assert b.contains(b"x", now_ms=5)
    with pytest.raises(InvalidInputError):
        b.add(b"x", now_ms=float("nan"))
    with pytest.raises(InvalidInputError):
        b.add_many([b"x"], now_ms=[1, 2])
    with pytest.raises(TypeError):
        b.add_many([b"x", 3])
    with pytest.raises(TypeError):
        b.add(None)
    assert b.period_index == 0


def test_every_bit_flip_and_truncation_is_rejected() -> None:
    b = ForgettingBloom(capacity=20, fp_rate=0.1, generations=3, period_ms=100, seed=2)
    b.add_many(_keys(8), now_ms=0)
    b.add_many(_keys(5, b"z"), now_ms=150)
    blob = b.to_bytes()
    for i in range(len(blob)):
        for bit in range(8):
            bad = bytearray(blob)
            bad[i] ^= 1 << bit
            with pytest.raises(SnapshotError):
                ForgettingBloom.from_bytes(bytes(bad))
    for n in range(len(blob)):
        with pytest.raises(SnapshotError):
            ForgettingBloom.from_bytes(blob[:n])
    rng = np.random.default_rng(1)
    for _ in range(100):
        with pytest.raises(SnapshotError):
            ForgettingBloom.from_bytes(rng.bytes(len(blob)))


def test_round_trip_and_invariants_behind_a_valid_checksum() -> None:
    b = ForgettingBloom(capacity=20, fp_rate=0.1, generations=3, period_ms=100, seed=2)
    b.add_many(_keys(8), now_ms=0)
    b.add_many(_keys(5, b"z"), now_ms=150)
    blob = b.to_bytes()
    back = ForgettingBloom.from_bytes(blob)
    assert back.to_bytes() == blob and back.rotations == 1 and back.period_index == 1
    header, payload = unpack(blob, KIND_FORGETTING_BLOOM)
    words = np.frombuffer(bytes(payload), dtype="<u8").copy()

    def forge(patch=None, bits=None):
        h = dict(header)
        h.update(patch or {})
        return pack(KIND_FORGETTING_BLOOM, h, (words if bits is None else bits).tobytes())

    ghost = words.copy()
    ghost[0] |= np.uint64(1 << 3)  # generation slot 3 of a 4-bit group, G = 3
    dropped = words.copy()
    nz = int(np.flatnonzero(dropped)[0])
    dropped[nz] &= dropped[nz] - np.uint64(1)  # a bit lost: popcounts no longer match
    cases = [
        forge(bits=ghost),
        forge(bits=dropped),
        forge(bits=words[:-1]),
        forge({"counts": [25, 0, 0]}),
        forge({"counts": header["counts"][:2]}),
        forge({"newest": 0}),
        forge({"rotations": 5}),
        forge({"rotations": -2}),
        forge({"union_popcount": 1}),
        forge({"popcounts": [0, 0, 0]}),
        forge({"positions": header["positions"] + 16}),
        forge({"hashes": 9}),
        forge({"capacity": 0}),
        forge({"fp_rate": 1}),
        forge({"period_index": 1.5}),
        forge({"period_ms": None}),
        forge({"extra": 1}),
    ]
    cnt = list(header["counts"])
    cnt[header["newest"]] = 20
    cases.append(forge({"counts": cnt}))  # newest at capacity: it should have rotated
    for i, blob in enumerate(cases):
        with pytest.raises(SnapshotError):
            ForgettingBloom.from_bytes(blob)
            print("accepted forged case", i)


def test_merge_is_a_union_of_aligned_generations() -> None:
    a = ForgettingBloom(capacity=1000, fp_rate=0.01, period_ms=100, seed=4)
    b = ForgettingBloom(capacity=1000, fp_rate=0.01, period_ms=100, seed=4)
    a.add_many(_keys(300, b"a"), now_ms=10)
    b.add_many(_keys(300, b"b"), now_ms=20)
    a.merge(b)
    assert a.contains_many(_keys(300, b"a") + _keys(300, b"b"), now_ms=20).all()
    assert a.generation_counts()[0] == 600
    for other in (
        ForgettingBloom(capacity=1000, fp_rate=0.01, period_ms=100, seed=5),
        ForgettingBloom(capacity=1000, fp_rate=0.02, period_ms=100, seed=4),
        ForgettingBloom(capacity=1000, fp_rate=0.01, period_ms=100, seed=4, generations=3),
    ):
        with pytest.raises(MismatchError):
            a.merge(other)
    later = ForgettingBloom(capacity=1000, fp_rate=0.01, period_ms=100, seed=4)
    later.add(b"x", now_ms=10)
    later.add(b"y", now_ms=150)
    with pytest.raises(MismatchError):
        a.merge(later)
    fresh = ForgettingBloom(capacity=1000, fp_rate=0.01, period_ms=100, seed=4)
    fresh.merge(a)
    assert fresh.to_bytes() == a.to_bytes()
    # a union that reaches capacity rotates, as an add would
    c = ForgettingBloom(capacity=500, fp_rate=0.01, seed=1)
    d = ForgettingBloom(capacity=500, fp_rate=0.01, seed=1)
    c.add_many(_keys(300, b"c"))
    d.add_many(_keys(300, b"d"))
    c.merge(d)
    assert c.rotations == 1 and c.contains_many(_keys(300, b"c") + _keys(300, b"d")).all()


def test_prehashed_keys() -> None:
    b = ForgettingBloom(capacity=100, fp_rate=0.01, seed=8, hasher="siphash")
    keys = _keys(50)
    b.add_many(hash64_many(keys, 8, "siphash"))
    assert b.contains_many(keys).all()
    assert all(k in b for k in keys)
    assert not math.isnan(b.approx_count())


def test_extreme_timestamps() -> None:
    lo, hi = -(2**63), 2**63 - 1
    b = ForgettingBloom(capacity=10, fp_rate=0.01, period_ms=1)
    b.add(b"x", now_ms=lo)
    assert b.contains(b"x", now_ms=lo)
    assert not b.contains(b"x", now_ms=hi)
    assert b.contains_many([b"x", b"x"], now_ms=np.array([lo, hi])).tolist() == [True, False]
    b.add(b"y", now_ms=hi)
    assert b.contains(b"y", now_ms=hi) and not b.contains(b"x", now_ms=hi)
    assert ForgettingBloom.from_bytes(b.to_bytes()).to_bytes() == b.to_bytes()
