"""DecayingCountMin: halving, saturation, weights, validation, the four CL-TDS
regressions, snapshots, merge, and statistical guarantees on fixed seeds."""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections import Counter

import numpy as np
import pytest

from grudge_stream import (
    ConfigError,
    DecayingCountMin,
    EventClock,
    InvalidInputError,
    ManualClock,
    MismatchError,
    SnapshotError,
)
from grudge_stream.envelope import KIND_COUNT_MIN, pack, unpack
from grudge_stream.hashing import hash64, hash64_many
from grudge_stream.sketches.countmin import (
    CountMinConfig,
    countmin_dimensions,
    countmin_memory_bytes,
)

K = b"10.0.0.1"


def small(**kw) -> DecayingCountMin:
    args = dict(depth=2, width=8, epoch_ms=1000, counter_bits=8, seed=3, top_k=2)
    args.update(kw)
    return DecayingCountMin(**args)


# ---------------------------------------------------------------- config and API


def test_spec_example_and_defaults() -> None:
    c = DecayingCountMin(depth=4, width=65_536, epoch_ms=1_000, seed=7, top_k=100)
    c.increment(b"10.0.0.1", now_ms=0)
    assert c.query(b"10.0.0.1", now_ms=0) == 1
    assert c.top(10) == [(b"10.0.0.1", 1)]
    d = DecayingCountMin()
    assert d.memory_bytes() == 1 << 20
    assert d.config == CountMinConfig()
    eps, delta = d.parameters()
    assert eps == pytest.approx(math.e / 65_536) and delta == pytest.approx(math.exp(-4))
    assert d.error_bound(1_000_000) == pytest.approx(1_000_000 * math.e / 65_536)
    assert d.max_count == (1 << 24) - 1


def test_config_is_frozen_and_validated() -> None:
    c = DecayingCountMin(seed=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.config.depth = 3  # type: ignore[misc]
    assert c.seed == 5
    for bad in (
        dict(depth=0),
        dict(depth=33),
        dict(width=0),
        dict(width=2**32),
        dict(epoch_ms=0),
        dict(epoch_ms=-5),
        dict(counter_bits=3),
        dict(counter_bits=28),
        dict(seed=-1),
        dict(seed=2**64),
        dict(hasher="md5"),
        dict(top_k=-1),
        dict(depth=True),
        dict(width=1.5),
        dict(epoch_ms=2.0),
    ):
        with pytest.raises(ConfigError):
            DecayingCountMin(**bad)
    with pytest.raises(TypeError):
        DecayingCountMin(4, 1024)  # keyword-only
    with pytest.raises(ConfigError):
        DecayingCountMin(clock=object())


def test_sizing_helpers() -> None:
    assert countmin_dimensions(math.e / 65_536, math.exp(-4) + 1e-12) == (4, 65_536)
    assert countmin_memory_bytes(4, 65_536, 100) == DecayingCountMin(top_k=100).memory_bytes()
    with pytest.raises(ConfigError):
        countmin_dimensions(0.0, 0.1)


# ---------------------------------------------------------------- decay


def test_exact_halving_per_epoch() -> None:
    c = DecayingCountMin(epoch_ms=1000, seed=1)
    c.increment(K, 1_000_000, now_ms=0)
    for g in range(0, 40):
        assert c.query(K, now_ms=g * 1000 + 999) == (1_000_000 >> g if g < 24 else 0)
    # on touch, the halving is written: 1e6 -> 125000 after 3 epochs, plus 1
    c.increment(K, 1, now_ms=3000)
    assert c.query(K, now_ms=3000) == (1_000_000 >> 3) + 1
    assert c.query(K, now_ms=4000) == ((1_000_000 >> 3) + 1) >> 1


def test_manual_epochs_tick() -> None:
    c = DecayingCountMin(epoch_ms=None, seed=1)
    c.increment(K, 64, now_ms=123_456_789)  # now_ms is validated, then ignored
    assert c.epoch == 0
    assert c.tick() == 1
    assert c.query(K) == 32
    c.tick(5)
    assert c.query(K) == 1
    c.tick(0)
    assert c.query(K) == 1
    with pytest.raises(InvalidInputError):
        c.tick(-1)
    with pytest.raises(ConfigError):
        DecayingCountMin().tick()


def test_saturation() -> None:
    c = DecayingCountMin(counter_bits=8, epoch_ms=None)
    c.increment(K, 300)
    assert c.query(K) == 255
    c.increment(K)
    assert c.query(K) == 255
    c.increment(K, 2**70)
    assert c.query(K) == 255
    c.tick()
    assert c.query(K) == 127
    d = DecayingCountMin(epoch_ms=None)
    d.increment_many([K, K], counts=np.array([2**63, 2**64 - 1], dtype=np.uint64))
    assert d.query(K) == (1 << 24) - 1


def test_weights_and_count_validation() -> None:
    c = DecayingCountMin(epoch_ms=None, top_k=4)
    c.increment(K, 5)
    c.increment(K, 3.0)
    c.increment(K, np.int16(2))
    c.increment(K, 0)
    assert c.query(K) == 10
    before = c.to_bytes()
    for bad in (-1, 2.5, float("nan"), float("inf"), True, "3", None, [1]):
        with pytest.raises(ValueError):
            c.increment(K, bad)
    with pytest.raises(ValueError):
        c.increment_many([K, b"b"], counts=[1, -1])
    with pytest.raises(ValueError):
        c.increment_many([K, b"b"], counts=np.array([1.0, np.nan]))
    with pytest.raises(ValueError):
        c.increment_many([K, b"b"], counts=[1, 2, 3])
    with pytest.raises(ValueError):
        c.increment_many([K, b"b"], counts=np.array([True, False]))
    with pytest.raises(TypeError):
        c.increment_many([K, b"b", 7])  # bad key after good ones
    with pytest.raises(TypeError):
        c.increment(12)
    with pytest.raises(ValueError):
        c.increment(K, 1, now_ms=float("nan"))
    assert c.to_bytes() == before  # nothing was touched
    c.increment_many([K, b"b"], counts=np.array([4, 6], dtype=np.int32))
    c.increment_many([K], counts=2)
    assert c.query(K) == 16 and c.query(b"b") == 6


def test_event_time_from_clock() -> None:
    clock = ManualClock(0)
    c = DecayingCountMin(epoch_ms=100, clock=clock)
    c.increment(K, 8)
    clock.set(250)
    assert c.query(K) == 2
    ev = EventClock()
    d = DecayingCountMin(epoch_ms=100, clock=ev)
    ev.observe(1_000)
    d.increment(K, 8)
    ev.observe(1_100)
    assert d.query(K) == 4
    assert d.query(K, now_ms=0) == 8  # reads never go before the sketch's epoch


# ---------------------------------------------------------------- CL-TDS regressions


@pytest.mark.parametrize("bits", [24, 8, 27, 4])
@pytest.mark.parametrize("background", [False, True])
def test_a_long_idle_key_does_not_resurrect(bits: int, background: bool) -> None:
    """(a) a key idle for 256-279 epochs (and any other gap >= counter width, up to
    2**20 and beyond) reads 0 - with other keys keeping the sketch busy or not."""
    stamp_bits = 32 - bits
    gaps = list(range(256, 280)) + [
        bits,
        bits + 1,
        2**stamp_bits - 1,
        2**stamp_bits,
        2**stamp_bits + 1,
        2**stamp_bits + bits - 1,
        2**20,
        2**20 + 5,
        2**33,
    ]
    for gap in gaps:
        c = DecayingCountMin(depth=4, width=1024, epoch_ms=10, counter_bits=bits, seed=11)
        c.increment(K, (1 << bits) - 1, now_ms=0)
        if background and gap < 5000:
            for e in range(1, gap):
                c.increment(b"other", now_ms=e * 10)
        assert c.query(K, now_ms=gap * 10) == 0, gap
        c.increment(K, 1, now_ms=gap * 10)
        assert c.query(K, now_ms=gap * 10) == 1, gap


def test_a_manual_ticks_across_the_stamp_wrap() -> None:
    c = DecayingCountMin(epoch_ms=None, seed=2)
    c.increment(K, 1000)
    for _ in range(256):
        c.tick()
        assert c.base_epoch is not None
    assert c.query(K) == 0
    c.tick(2**20)
    c.increment(b"x")
    assert c.query(K) == 0 and c.query(b"x") == 1


def test_b_an_older_epoch_does_not_wipe() -> None:
    """(b) an operation carrying an epoch older than a cell's stamp keeps the cell."""
    c = DecayingCountMin(epoch_ms=1000, seed=4)
    c.increment(K, 40, now_ms=300_000)
    c.increment(K, 1, now_ms=1_000)  # 299 epochs late
    assert c.query(K, now_ms=300_000) == 41
    assert c.query(K, now_ms=0) == 41  # a read at an older time reads the current epoch
    assert c.epoch == 300
    c.increment_many([K, K, K], now_ms=np.array([301_000, 5_000, 300_500]))
    assert c.query(K, now_ms=301_000) == 20 + 3


def test_c_from_bytes_rejects_junk_of_the_right_length() -> None:
    c = small()
    blob = c.to_bytes()
    rng = np.random.default_rng(0)
    for _ in range(200):
        with pytest.raises(SnapshotError):
            DecayingCountMin.from_bytes(rng.bytes(len(blob)))
    with pytest.raises(SnapshotError):
        DecayingCountMin.from_bytes(bytes(len(blob)))


def test_d_restoring_keeps_epoch_mode_and_interval() -> None:
    m = DecayingCountMin(epoch_ms=None, seed=9)
    m.increment(K, 8)
    m.tick(2)
    back = DecayingCountMin.from_bytes(m.to_bytes())
    assert back.epoch_ms is None and back.config == m.config and back.epoch == 2
    assert back.query(K) == 2
    back.tick()
    assert back.query(K) == 1
    e = DecayingCountMin(epoch_ms=250, seed=9)
    e.increment(K, 8, now_ms=1_000)
    back = DecayingCountMin.from_bytes(e.to_bytes())
    assert back.epoch_ms == 250 and back.epoch == 4
    assert back.query(K, now_ms=1_250) == 4
    with pytest.raises(ConfigError):
        back.tick()


# ---------------------------------------------------------------- snapshots


def test_round_trip_is_bit_identical() -> None:
    c = small(top_k=3)
    for i, key in enumerate([b"a", "b\u00e9", bytearray(b"c"), b"a", b"d"]):
        c.increment(key, i + 1, now_ms=1000 * i)
    c.increment_many(np.array([5, 6], dtype=np.uint64), now_ms=4500)
    blob = c.to_bytes()
    back = DecayingCountMin.from_bytes(blob)
    assert back.to_bytes() == blob
    assert back.top() == c.top()
    assert {type(k) for k, _ in c.top()} <= {bytes, str, int}
    fresh = DecayingCountMin(epoch_ms=5)
    assert DecayingCountMin.from_bytes(fresh.to_bytes()).epoch is None


def test_every_bit_flip_and_truncation_is_rejected() -> None:
    c = small()
    c.increment(b"a", 3, now_ms=0)
    c.increment(b"b", 5, now_ms=2000)
    blob = c.to_bytes()
    for i in range(len(blob)):
        for bit in range(8):
            bad = bytearray(blob)
            bad[i] ^= 1 << bit
            with pytest.raises(SnapshotError):
                DecayingCountMin.from_bytes(bytes(bad))
    for n in range(len(blob)):
        with pytest.raises(SnapshotError):
            DecayingCountMin.from_bytes(blob[:n])
    with pytest.raises(SnapshotError):
        DecayingCountMin.from_bytes(blob + b"\0")


def _forge(c: DecayingCountMin, header_patch: dict | None = None, payload=None) -> bytes:
    header, body = unpack(c.to_bytes(), KIND_COUNT_MIN)
    header.update(header_patch or {})
    return pack(KIND_COUNT_MIN, header, bytes(body) if payload is None else payload)


def test_invariants_are_checked_behind_a_valid_checksum() -> None:
    c = small(top_k=2)
    c.increment(b"a", 3, now_ms=5000)
    c.increment(b"b", 9, now_ms=5000)
    _, body = unpack(c.to_bytes(), KIND_COUNT_MIN)
    body = bytearray(body)
    cells = np.frombuffer(bytes(body[:64]), dtype="<u4").copy()
    nz = int(np.flatnonzero(cells)[0])
    ahead = cells.copy()
    ahead[nz] = (((5 + 1) & 0xFFFFFF) << 8) | 3  # stamped one epoch ahead
    cases = [
        _forge(c, payload=ahead.tobytes() + bytes(body[64:])),
        _forge(c, {"epoch": 6}),  # candidates above their estimates
        _forge(c, {"base_epoch": 6}),  # base after epoch
        _forge(c, {"epoch": 5 + 300, "base_epoch": 5}),  # span wider than the stamp field
        _forge(c, {"epoch": None}),
        _forge(c, {"epoch": True}),
        _forge(c, {"width": 16}),
        _forge(c, {"counter_bits": 30}),
        _forge(c, {"extra": 1}),
        _forge(c, payload=bytes(body) + b"\0"),
        _forge(c, payload=bytes(body[:-1])),
        _forge(c, payload=bytes(body[:64]) + struct.pack("<I", 3) + bytes(body[68:])),  # 3 > top_k
    ]
    # a candidate whose stored value exceeds its estimate, and one whose key does not hash to it
    off = 64 + 4
    h, val, kind, klen = struct.unpack_from("<QIBI", body, off)
    hi = bytearray(body)
    struct.pack_into("<QIBI", hi, off, h, 200, kind, klen)
    cases.append(_forge(c, payload=bytes(hi)))
    wrong = bytearray(body)
    struct.pack_into("<QIBI", wrong, off, h ^ 1, val, kind, klen)
    cases.append(_forge(c, payload=bytes(wrong)))
    badkind = bytearray(body)
    struct.pack_into("<QIBI", badkind, off, h, val, 7, klen)
    cases.append(_forge(c, payload=bytes(badkind)))
    for blob in cases:
        with pytest.raises(SnapshotError):
            DecayingCountMin.from_bytes(blob)
    with pytest.raises(SnapshotError, match="not a DecayingCountMin"):
        from grudge_stream import ForgettingBloom

        DecayingCountMin.from_bytes(ForgettingBloom(capacity=10, fp_rate=0.1).to_bytes())


def test_header_is_readable_json() -> None:
    c = DecayingCountMin(epoch_ms=None, seed=3)
    header, _ = unpack(c.to_bytes(), KIND_COUNT_MIN)
    assert header == {
        "depth": 4,
        "width": 65536,
        "epoch_ms": None,
        "counter_bits": 24,
        "seed": 3,
        "hasher": "murmur3",
        "top_k": 0,
        "index_scheme": "independent",
        "epoch": 0,
        "base_epoch": 0,
    }
    json.dumps(header)
    km, _ = unpack(DecayingCountMin(epoch_ms=None, seed=3, index_scheme="km").to_bytes(), KIND_COUNT_MIN)
    assert km == {k: v for k, v in header.items() if k != "index_scheme"}  # as 0.2 wrote it


def test_not_picklable() -> None:
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(DecayingCountMin(width=8))


# ---------------------------------------------------------------- merge


def test_merge_requires_identical_config() -> None:
    a = small()
    for other in (
        small(seed=4),
        small(width=16),
        small(epoch_ms=None),
        small(hasher="siphash"),
        small(top_k=3),
        small(counter_bits=9),
    ):
        with pytest.raises(MismatchError):
            a.merge(other)
    with pytest.raises(TypeError):
        a.merge(None)


def test_merge_aligns_epochs_then_adds() -> None:
    a = DecayingCountMin(epoch_ms=1000, top_k=4, seed=1)
    b = DecayingCountMin(epoch_ms=1000, top_k=4, seed=1)
    a.increment(b"x", 80, now_ms=0)
    b.increment(b"x", 8, now_ms=2000)
    b.increment(b"y", 5, now_ms=2000)
    a.merge(b)
    assert a.epoch == 2
    assert a.query(b"x", now_ms=2000) == 20 + 8
    assert a.top() == [(b"x", 28), (b"y", 5)]
    empty = DecayingCountMin(epoch_ms=1000, top_k=4, seed=1)
    empty.merge(a)
    assert empty.to_bytes() == a.to_bytes() or empty.top() == a.top()
    before = a.to_bytes()
    a.merge(DecayingCountMin(epoch_ms=1000, top_k=4, seed=1))
    assert a.to_bytes() == before


# ---------------------------------------------------------------- top-k


def test_top_api() -> None:
    c = DecayingCountMin(epoch_ms=None, top_k=3, seed=1)
    with pytest.raises(ConfigError):
        DecayingCountMin().top()
    c.increment(b"a", 5)
    c.increment("s", 4)
    c.increment_many(np.array([hash64(b"zz", 1) ^ 1], dtype=np.uint64), counts=3)
    top = c.top()
    assert [v for _, v in top] == [5, 4, 3]
    assert top[0][0] == b"a" and top[1][0] == "s" and isinstance(top[2][0], int)
    assert c.top(1) == [(b"a", 5)]
    assert c.top(0) == []
    with pytest.raises(ValueError):
        c.top(4)
    c.tick(2)
    assert [v for _, v in c.top()] == [1, 1]
    c.tick(30)
    assert c.top() == []


def test_top_follows_what_is_hot_now() -> None:
    c = DecayingCountMin(epoch_ms=1000, top_k=2, seed=1)
    c.increment(b"old", 100_000, now_ms=0)
    c.increment(b"mid", 10, now_ms=0)
    for t in range(10_000, 10_010):
        c.increment(b"new", 50, now_ms=t)  # evicts "mid", decayed to 0
    assert c.top() == [(b"new", 500), (b"old", 97)]
    assert c.top(now_ms=12_000) == [(b"new", 125), (b"old", 24)]
    assert c.top(now_ms=5_000) == c.top()  # never before the sketch's epoch


def _zipf_stream(n_events: int, n_keys: int, s: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_keys + 1) ** s
    return rng.choice(n_keys, size=n_events, p=weights / weights.sum())


def test_never_undercounts_and_overcount_is_within_eps_n() -> None:
    """No decay: estimate >= truth for every key; estimate - truth <= eps*N for at least
    (1 - delta) of the keys."""
    width, depth = 2048, 4
    c = DecayingCountMin(depth=depth, width=width, epoch_ms=None, seed=12)
    ids = _zipf_stream(200_000, 50_000, 1.1, seed=5)
    counts = np.random.default_rng(6).integers(1, 4, size=ids.size)
    keys = [b"key-%d" % i for i in range(50_000)]
    c.increment_many([keys[i] for i in ids], counts=counts)
    truth = np.bincount(ids, weights=counts, minlength=50_000).astype(np.int64)
    est = c.query_many(keys)
    assert (est >= truth).all()
    eps, delta = c.parameters()
    n = int(counts.sum())
    assert np.mean(est - truth <= eps * n) >= 1 - delta


def test_never_undercounts_the_decayed_count() -> None:
    """With decay, estimates bound each key's own count under the same halving rule."""
    c = DecayingCountMin(depth=3, width=256, epoch_ms=100, seed=8)
    rng = np.random.default_rng(3)
    own: dict[int, tuple[int, int]] = {}
    for step in range(3000):
        now = step * 7
        k = int(rng.integers(0, 400))
        w = int(rng.integers(1, 20))
        e = now // 100
        last, v = own.get(k, (e, 0))
        own[k] = (e, (v >> (e - last) if e - last < 24 else 0) + w)
        c.increment(b"%d" % k, w, now_ms=now)
    now = 3000 * 7
    e = now // 100
    for k, (last, v) in own.items():
        assert c.query(b"%d" % k, now_ms=now) >= (v >> (e - last) if e - last < 24 else 0)


def test_heavy_hitters_recall_and_precision() -> None:
    n_keys = 100_000
    ids = _zipf_stream(400_000, n_keys, 1.1, seed=9)
    rng = np.random.default_rng(10)
    planted = np.arange(n_keys, n_keys + 10)
    stream = np.concatenate([ids, np.repeat(planted, 6_000)])
    rng.shuffle(stream)
    keys = [b"%016d" % i for i in range(n_keys + 10)]
    c = DecayingCountMin(depth=4, width=8192, epoch_ms=None, top_k=64, seed=2)
    for lo in range(0, stream.size, 50_000):
        c.increment_many([keys[i] for i in stream[lo : lo + 50_000]])
    exact = Counter(stream.tolist())
    true_top = {keys[k] for k, _ in exact.most_common(20)}
    got = [k for k, _ in c.top(20)]
    assert {keys[i] for i in planted} <= set(got)
    assert len(true_top & set(got)) / 20 >= 0.9  # recall == precision at equal sizes
    for k, v in c.top(20):
        assert v >= exact[keys.index(k)]  # estimates are upper bounds


def test_batch_forms_agree() -> None:
    keys = [b"%08d" % i for i in range(1000)]
    a = DecayingCountMin(epoch_ms=None, seed=77, hasher="siphash")
    b = DecayingCountMin(epoch_ms=None, seed=77, hasher="siphash")
    c = DecayingCountMin(epoch_ms=None, seed=77, hasher="siphash")
    d = DecayingCountMin(epoch_ms=None, seed=77, hasher="siphash")
    a.increment_many(keys)
    b.increment_many(hash64_many(keys, 77, "siphash"))
    c.increment_many(np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(1000, 8))
    d.increment_many(iter(keys))
    assert a.to_bytes() == b.to_bytes() == c.to_bytes() == d.to_bytes()
    assert a.query_many(hash64_many(keys, 77, "siphash")).tolist() == [1] * 1000
    before = a.to_bytes()
    with pytest.raises(TypeError, match="view"):  # signed: ids, not hashes (docs/hashing.md)
        a.increment_many(hash64_many(keys, 77, "siphash").view(np.int64))
    assert a.to_bytes() == before
    with pytest.raises(TypeError):
        a.increment_many(b"single")
    with pytest.raises(TypeError):
        a.increment_many(np.zeros(3, dtype=np.int32))
    assert a.query_many([]).tolist() == []
    a.increment_many([])


def test_extreme_timestamps() -> None:
    lo, hi = -(2**63), 2**63 - 1
    for epoch_ms in (1, 1000, 2**62):
        c = DecayingCountMin(epoch_ms=epoch_ms, width=64, top_k=2)
        c.increment(K, 5, now_ms=lo)
        assert c.query(K, now_ms=lo) == 5
        c.increment_many([K], now_ms=np.array([hi]))
        assert c.query(K, now_ms=hi) == 1  # 5 halved away (3 or more epochs), plus 1
        assert DecayingCountMin.from_bytes(c.to_bytes()).to_bytes() == c.to_bytes()
    with pytest.raises(ValueError):
        DecayingCountMin().increment(K, now_ms=2**63)
    with pytest.raises(ValueError):
        DecayingCountMin().increment_many([K], now_ms=np.array([2**63], dtype=np.uint64))


def test_query_many_into_out() -> None:
    c = DecayingCountMin(epoch_ms=None)
    c.increment_many([b"a", b"a", b"b"])
    out = np.full(3, -1, dtype=np.int64)
    assert c.query_many([b"a", b"b", b"c"], out=out) is out
    assert out.tolist() == [2, 1, 0]
    for bad in (np.zeros(2, dtype=np.int64), np.zeros(3, dtype=np.int32), [0, 0, 0]):
        with pytest.raises(ValueError):
            c.query_many([b"a", b"b", b"c"], out=bad)
    with pytest.raises(ValueError):
        c.query_many([b"a", b"b", b"c"], out=np.zeros(3, dtype=np.int64)[::-1].copy()[:2])


def test_calls_are_atomic_across_threads() -> None:
    """Threads sharing a sketch see whole calls: concurrent batches lose no increment (the
    result equals the same batches run one after another), and Bloom inserts likewise."""
    import threading

    from grudge_stream import ForgettingBloom

    batches = [[b"k%d" % ((t * 7919 + i) % 5000) for i in range(20_000)] for t in range(8)]
    shared = DecayingCountMin(depth=4, width=4096, epoch_ms=None, seed=3, top_k=0)
    alone = DecayingCountMin(depth=4, width=4096, epoch_ms=None, seed=3, top_k=0)
    bloom_shared = ForgettingBloom(capacity=100_000, fp_rate=0.01, seed=3)
    bloom_alone = ForgettingBloom(capacity=100_000, fp_rate=0.01, seed=3)
    for b in batches:
        for _ in range(5):
            alone.increment_many(b)
        bloom_alone.add_many(b)
    start = threading.Barrier(len(batches))

    def work(b):
        start.wait()
        for _ in range(5):
            shared.increment_many(b)
        bloom_shared.add_many(b)

    threads = [threading.Thread(target=work, args=(b,)) for b in batches]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert shared.to_bytes() == alone.to_bytes()
    assert bloom_shared.contains_many([k for b in batches for k in b]).all()
    assert bloom_shared.to_bytes() == bloom_alone.to_bytes()


def test_rows_are_hashed_with_the_secret_key_like_bytes_keys() -> None:
    """Fixed-width keys as 2-D uint8 rows land where the same keys as bytes do, with a
    secret key too (rows were hashed with the public seed before)."""
    import secrets

    from grudge_stream import ForgettingBloom

    keys = [b"k-%05d" % i for i in range(50)]
    rows = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), -1)
    secret = secrets.token_bytes(16)
    c = DecayingCountMin(depth=4, width=4096, epoch_ms=None, seed=7, hasher="siphash")
    c.use_hash_key(secret)
    c.increment_many(rows)
    assert [c.query(k) for k in keys] == [1] * len(keys)
    assert list(c.query_many(keys)) == list(c.query_many(rows)) == [1] * len(keys)
    b = ForgettingBloom(capacity=1000, fp_rate=0.001, seed=7, hasher="siphash")
    b.use_hash_key(secret)
    b.add_if_absent_many(rows)
    assert all(b.contains(k) for k in keys)
    assert list(b.add_if_absent_many(keys)) == [False] * len(keys)
