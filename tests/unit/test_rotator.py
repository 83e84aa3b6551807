"""Rotator: event-time rotation, reads from the oldest, writes to all, forgetting."""

from __future__ import annotations

import pytest

from grudge_stream import ConfigError, Linear, ManualClock, NoDecay, Rotator
from grudge_stream.hashing import splitmix64
from grudge_stream.sketches import RotatorConfig

GOLDEN = 0x9E3779B97F4A7C15
P = 15_000


def rot(**kw) -> Rotator:
    base = dict(
        generations=2,
        period_ms=P,
        levels=3,
        cells_per_level=4096,
        decay=NoDecay(),
        lo=0.0,
        hi=1e6,
        seed=11,
    )
    base.update(kw)
    return Rotator(**base)


def test_rotation_at_multiples_of_the_period_from_origin_zero() -> None:
    r = rot()
    r.update(b"k", 1.0, now_ms=0)
    assert r.rotations == 0 and r.epoch == 0
    r.query(b"k", now_ms=14_999)
    assert r.rotations == 0
    r.query(b"k", now_ms=15_000)
    assert r.rotations == 1 and r.epoch == 1
    r.query(b"k", now_ms=29_999)
    assert r.rotations == 1
    r.query(b"k", now_ms=30_000)
    assert r.rotations == 2
    r.query(b"k", now_ms=100_000)  # crosses 45, 60, 75 and 90 s: four more
    assert r.rotations == 6 and r.epoch == 6


def test_time_jumps_forget_everything_and_late_events_never_rotate_back() -> None:
    r = rot(generations=3)
    r.update(b"k", 5.0, now_ms=1_000)
    r.update(b"k", 1.0, now_ms=500)  # late event: applied, no rotation
    assert r.query(b"k", now_ms=1_000) == 6.0 and r.rotations == 0
    r.query(b"k", now_ms=10 * P)  # 10 boundaries >= 3 generations: all gone
    assert r.rotations == 10 and r.query(b"k", now_ms=10 * P) == 0.0
    r.update(b"k", 2.0, now_ms=3 * P)  # late by many periods: no rotation back
    assert r.rotations == 10 and r.query(b"k", now_ms=10 * P) == 2.0
    r.update(b"neg", 1.0, now_ms=-5 * P)  # before the origin: no rotation
    assert r.rotations == 10


def test_reads_come_from_the_oldest_and_writes_go_to_all() -> None:
    r = rot()
    r.update(b"k", 1.0, now_ms=1_000)  # both generations
    r.update(b"j", 1.0, now_ms=14_000)  # both, just before the rotation
    assert r.query(b"k", now_ms=15_000) == 1.0  # the promoted generation saw both writes
    assert r.query(b"j", now_ms=15_000) == 1.0
    r.update(b"k", 2.0, now_ms=20_000)  # oldest: 3, youngest: 2
    assert r.query(b"k", now_ms=20_000) == 3.0
    r.query(b"k", now_ms=30_000)  # promotion forgets the write at 1 s
    assert r.query(b"k", now_ms=30_000) == 2.0
    assert r.query(b"j", now_ms=30_000) == 0.0


def test_a_debt_stays_conservative_across_promotion() -> None:
    r = rot(decay=Linear(1.0), hi=100.0)
    single = rot(decay=Linear(1.0), hi=100.0, period_ms=None)
    for t, d in ((10_000, 8.0), (14_500, 6.0), (16_000, 3.0)):
        r.update(b"k", d, now_ms=t)
        single.update(b"k", d, now_ms=t)
    for t in (15_000, 16_000, 20_000, 29_999):
        assert r.query(b"k", now_ms=t) == single.query(b"k", now_ms=t)
    # History older than (generations - 1) * period is forgotten at promotion; by then a
    # debt drained at >= 1/s with a period >= debt / rate is already 0 in a single sketch too.
    assert r.query(b"k", now_ms=30_000) == single.query(b"k", now_ms=30_000) == 0.0


def test_state_lives_between_generations_minus_one_and_generations_periods() -> None:
    for g in (2, 3, 4):
        r = rot(generations=g)
        r.update(b"k", 1.0, now_ms=7 * P - 1)  # just before a boundary: shortest life
        r.update(b"j", 1.0, now_ms=7 * P)  # just after one: longest life
        assert r.query(b"k", now_ms=(7 + g - 1) * P - 1) == 1.0
        assert r.query(b"k", now_ms=(7 + g - 1) * P) == 0.0  # lived ~(g-1) periods
        assert r.query(b"j", now_ms=(7 + g) * P - 1) == 1.0
        assert r.query(b"j", now_ms=(7 + g) * P) == 0.0  # lived g periods


def test_try_update_writes_younger_generations_only_when_the_oldest_admits() -> None:
    r = rot(levels=2, cells_per_level=64)
    r.update(b"k", 5.0, now_ms=1_000)
    r.rotate()  # oldest has 5, youngest is empty
    assert r.try_update(b"k", 1.0, limit=3.0, now_ms=2_000) is False
    cells = r._cells()
    assert (cells[1]["score"] == 0).all() and (cells[1]["last_ms"] == -(2**63)).all()
    assert r.try_update(b"k", 1.0, limit=10.0, now_ms=2_000) is True
    assert r.query(b"k", now_ms=2_000) == 6.0
    r.rotate()
    assert r.query(b"k", now_ms=2_000) == 1.0  # the youngest got only the admitted delta


def test_forced_rotation_and_counters() -> None:
    r = rot(period_ms=None)
    r.update(b"k", 1.0, now_ms=10**9)
    assert r.rotations == 0 and r.epoch == 0  # no period: time never rotates
    r.rotate()
    assert r.rotations == 1 and r.query(b"k", now_ms=10**9) == 1.0
    r.rotate()
    assert r.rotations == 2 and r.query(b"k", now_ms=10**9) == 0.0
    r2 = rot()
    r2.rotate()
    assert r2.rotations == 1 and r2.epoch == 0
    r2.advance(now_ms=2 * P)
    assert r2.rotations == 3 and r2.epoch == 2


def test_generation_seeds_are_derived_with_splitmix64() -> None:
    r = rot(generations=3, seed=99)
    expect = [splitmix64((99 + (g + 2) * GOLDEN) % 2**64) for g in range(3)]
    assert list(r.generation_seeds) == expect
    r.rotate()
    assert list(r.generation_seeds) == [
        splitmix64((99 + (g + 3) * GOLDEN) % 2**64) for g in range(3)
    ]
    assert len(set(r.generation_seeds)) == 3
    a, b = rot(seed=5), rot(seed=5)
    for t in range(0, 60_000, 777):
        a.update(b"x%d" % (t % 13), 0.5, now_ms=t)
        b.update(b"x%d" % (t % 13), 0.5, now_ms=t)
    assert a.to_bytes() == b.to_bytes()


def test_generations_index_keys_independently() -> None:
    r = rot(generations=2, levels=4, cells_per_level=1 << 20)
    r.update(b"key", 1.0, now_ms=0)
    cells = r._cells()
    old = {(lvl, int(j)) for lvl in range(4) for j in cells[0][lvl]["score"].nonzero()[0]}
    young = {(lvl, int(j)) for lvl in range(4) for j in cells[1][lvl]["score"].nonzero()[0]}
    assert len(old) == len(young) == 4 and old != young


def test_clock_prehashed_input_and_memory() -> None:
    clock = ManualClock(0)
    r = rot(clock=clock)
    r.update(b"k", 1.0)
    clock.set(P)
    assert r.query(b"k") == 1.0 and r.rotations == 1
    h = r.key_hashes([b"k", b"q"])
    assert r.query_many(h).tolist() == [1.0, 0.0]
    assert r.memory_bytes() == 2 * 16 * 3 * 4096 + Rotator.__basicsize__
    assert isinstance(r.config, RotatorConfig) and r.config.sketch.levels == 3 and r.seed == 11
    assert r.generations == 2 and r.period_ms == P


@pytest.mark.parametrize(
    "kw",
    [
        dict(generations=1),
        dict(generations=17),
        dict(period_ms=0),
        dict(period_ms=-5),
        dict(period_ms=1.5),
        dict(levels=0),
        dict(unknown=3),
        dict(decay=NoDecay(), hi=float("inf")),
    ],
)
def test_invalid_rotator_configs(kw) -> None:
    with pytest.raises(ConfigError):
        rot(**kw)


def test_period_is_required() -> None:
    with pytest.raises(TypeError):
        Rotator(levels=1, cells_per_level=8, decay=NoDecay(), hi=1.0)  # type: ignore[call-arg]
