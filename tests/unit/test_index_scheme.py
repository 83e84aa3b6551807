"""Index schemes (docs/hashing.md): independent levels by default, Kirsch-Mitzenmacher kept
for snapshots of grudge-stream 0.2 and grudge's vectors; the scheme is part of every config,
snapshot and fingerprint, and a worker left at the default keeps the scheme it restores."""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from grudge_stream import DecayingCountMin, Exponential, ForgettingBloom, Rotator, ScoreSketch, envelope
from grudge_stream.exceptions import CheckpointError, ConfigError, MismatchError, SnapshotError
from grudge_stream.hashing import hash64, hash64_many, level_indexes, level_indexes_many
from grudge_stream.operators import SourceRecord
from grudge_stream.sketches.countmin_config import CountMinConfig
from grudge_stream.sketches.score_config import ScoreSketchConfig
from grudge_stream.sketches.split import SplitScoreSketch
from grudge_stream.topology import Settings, load_topology

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "property"))
from score_reference import independent_index, km_index  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_restore_rules import MemoryStore  # noqa: E402

GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1


# ---- the index functions ---------------------------------------------------------------


def test_independent_indexes_follow_their_definition() -> None:
    rng = np.random.default_rng(41)
    for h in [0, 1, MASK64, *map(int, rng.integers(0, 2**64, 40, dtype=np.uint64))]:
        for m in (1, 2, 3, 97, 65_536, 100_000, 2**32 - 1):
            want = [independent_index(h, i, m) for i in range(7)]
            assert level_indexes(h, 7, m) == want == level_indexes(h, 7, m, "independent")
            # levels 0, 1: the halves of h; levels 2, 3: of the halves of word 1
            p = ((h + GOLDEN) & MASK64) * 0xBF58476D1CE4E5B9
            w = (p & MASK64) ^ (p >> 64)
            assert want[0] == ((h & 0xFFFFFFFF) * m) >> 32 and want[1] == ((h >> 32) * m) >> 32
            assert want[2] == ((w & 0xFFFFFFFF) * m) >> 32 and want[3] == ((w >> 32) * m) >> 32
            assert level_indexes(h, 7, m, "km") == [km_index(h, i, m) for i in range(7)]


def test_level_indexes_many_equals_one_at_a_time() -> None:
    hs = hash64_many([b"k%d" % i for i in range(500)], seed=3)
    for scheme in ("independent", "km"):
        for levels, m in ((1, 7), (4, 100_000), (5, 65_536), (64, 1000)):
            many = level_indexes_many(hs, levels, m, scheme)
            assert many.shape == (500, levels) and many.dtype == np.uint32
            assert [list(r) for r in many[:50]] == [level_indexes(int(h), levels, m, scheme) for h in hs[:50]]
    with pytest.raises(ValueError, match="index scheme"):
        level_indexes(1, 2, 3, "kirsch")
    with pytest.raises(ValueError, match="levels"):
        level_indexes_many(hs, 0, 10)


def _aliased_pairs(idx: np.ndarray, m: int, hs: np.ndarray) -> int:
    """Pairs of rows equal in every column (keys sharing all their cells) whose hashes
    differ. One argsort over levels 0-1; levels 2-3 compared among the few rows that
    share levels 0-1 with another."""
    a = idx[:, 0].astype(np.uint64) * np.uint64(m) + idx[:, 1]
    order = np.argsort(a)
    sa = a[order]
    eq = np.flatnonzero(sa[1:] == sa[:-1])
    rows = np.unique(np.concatenate((order[eq], order[eq + 1])))
    if len(rows) < 2:
        return 0
    sub = idx[rows].astype(np.uint64)
    key_a = sub[:, 0] * np.uint64(m) + sub[:, 1]
    key_b = sub[:, 2] * np.uint64(m) + sub[:, 3]
    o = np.lexsort((hs[rows], key_b, key_a))
    ka, kb, kh = key_a[o], key_b[o], hs[rows][o]
    pairs = 0
    start = 0
    for i in range(1, len(o) + 1):  # runs of equal (key_a, key_b): pairs of distinct hashes
        if i == len(o) or ka[i] != ka[start] or kb[i] != kb[start]:
            run = kh[start:i]
            r = i - start
            same = int(sum(c * (c - 1) // 2 for c in np.unique(run, return_counts=True)[1]))
            pairs += r * (r - 1) // 2 - same
            start = i
    return pairs


def test_no_innocent_key_is_fully_aliased_among_ten_million() -> None:
    """10M random 16-byte keys, SipHash under a random key, L = 4, M = 100,000: with
    independent levels a full alias needs ~M**-4 per pair (expected 5e-6 pairs here); under
    Kirsch-Mitzenmacher (h1 mod M, h2 mod M) decide all four cells (hundreds of pairs).
    Pairs of equal 64-bit hashes (p ~ 3e-6) are not counted: no scheme separates them."""
    n, levels, m = 10_000_000, 4, 100_000
    rng = np.random.default_rng()
    seed = int(rng.integers(0, 2**63))
    t0 = time.perf_counter()
    keys = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    hs = hash64_many(keys, seed=seed, algorithm="siphash")
    del keys
    counts = {}
    for scheme in ("independent", "km"):
        counts[scheme] = _aliased_pairs(level_indexes_many(hs, levels, m, scheme), m, hs)
    print(f"\nfully aliased pairs among {n:,} keys (L={levels}, M={m:,}, siphash seed {seed}): "
          f"independent {counts['independent']}, km {counts['km']} ({time.perf_counter() - t0:.1f} s)")
    assert counts["independent"] == 0
    assert counts["km"] > 100  # the defect this scheme removes, measured beside it


def test_a_sketch_uses_the_indexes_of_its_scheme() -> None:
    h = hash64(b"client-42", 0x2A)
    for scheme in ("independent", "km"):
        s = ScoreSketch(levels=4, cells_per_level=100_000, decay=Exponential(0.01), seed=0x2A,
                        index_scheme=scheme)
        assert s.index_scheme == scheme and s.config.index_scheme == scheme
        assert list(s.query_detailed(b"client-42", now_ms=0).cell_indexes) == level_indexes(h, 4, 100_000, scheme)
        c = DecayingCountMin(depth=4, width=1000, epoch_ms=None, seed=0x2A, index_scheme=scheme)
        c.increment(b"client-42", 5)
        _, payload = envelope.unpack(c.to_bytes(), envelope.KIND_COUNT_MIN)
        rows = np.frombuffer(payload, dtype="<u4", count=4000).reshape(4, 1000)
        assert [int(np.flatnonzero(r)[0]) for r in rows] == level_indexes(h, 4, 1000, scheme)
        assert c.query(b"client-42") == 5
    assert ScoreSketch(levels=2, cells_per_level=8, decay=Exponential(0.1)).index_scheme == "independent"
    with pytest.raises(ConfigError, match="index_scheme"):
        ScoreSketch(levels=2, cells_per_level=8, decay=Exponential(0.1), index_scheme="double")


@pytest.mark.parametrize("scheme", ["independent", "km"])
def test_batch_and_single_paths_agree_under_each_scheme(scheme: str) -> None:
    rng = np.random.default_rng(7)
    hs = rng.integers(0, 2**64, size=5000, dtype=np.uint64)
    for depth, width in ((4, 65_536), (4, 1000), (3, 4096), (5, 777)):
        a = DecayingCountMin(depth=depth, width=width, epoch_ms=None, index_scheme=scheme)
        b = DecayingCountMin(depth=depth, width=width, epoch_ms=None, index_scheme=scheme)
        a.increment_many(hs)
        for h in hs[:300]:
            b.increment_many(np.array([h], dtype=np.uint64))
        b.increment_many(hs[300:])
        assert a.to_bytes() == b.to_bytes()
        got = a.query_many(hs)
        assert [int(x) for x in got[:200]] == [int(a.query_many(np.array([h], dtype=np.uint64))[0]) for h in hs[:200]]
        assert (got >= 1).all()
    f = ForgettingBloom(capacity=10_000, fp_rate=0.01, index_scheme=scheme)
    f.add_many(hs[:2000])
    assert f.contains_many(hs[:2000]).all()
    assert f.contains_many(hs[2000:]).mean() < 0.05


def test_the_scheme_travels_in_snapshots_and_identity() -> None:
    for scheme in ("independent", "km"):
        s = ScoreSketch(levels=3, cells_per_level=50, decay=Exponential(0.1), index_scheme=scheme)
        s.update(b"a", 0.5, now_ms=10)
        back = ScoreSketch.from_bytes(s.to_bytes())
        assert back.index_scheme == scheme and back.to_bytes() == s.to_bytes()
        assert ("index_scheme" in s.config.to_dict()) == (scheme == "independent")
        r = Rotator(period_ms=1000, levels=2, cells_per_level=16, decay=Exponential(0.1), index_scheme=scheme)
        r.update(b"a", 1.0, now_ms=5)
        assert Rotator.from_bytes(r.to_bytes()).index_scheme == scheme
        c = DecayingCountMin(width=64, depth=3, index_scheme=scheme, top_k=2)
        c.increment(b"x", 3, now_ms=0)
        assert DecayingCountMin.from_bytes(c.to_bytes()).index_scheme == scheme
        b = ForgettingBloom(capacity=100, fp_rate=0.01, index_scheme=scheme)
        b.add(b"x", now_ms=0)
        assert ForgettingBloom.from_bytes(b.to_bytes()).index_scheme == scheme
        sp = SplitScoreSketch(levels=2, cells_per_level=16, decay=Exponential(0.1), index_scheme=scheme)
        sp.update(b"x", 0.3, now_ms=1)
        assert SplitScoreSketch.from_bytes(sp.to_bytes()).index_scheme == scheme
    # A serialized config without the field is a KM config (every config 0.2 wrote).
    d = ScoreSketchConfig(levels=2, cells_per_level=8).to_dict()
    assert d["index_scheme"] == "independent"
    del d["index_scheme"]
    assert ScoreSketchConfig.from_dict(d).index_scheme == "km"
    assert CountMinConfig(index_scheme="km").to_dict() == {k: v for k, v in CountMinConfig().to_dict().items()
                                                          if k != "index_scheme"}


def test_sketches_of_different_schemes_do_not_merge() -> None:
    a = ScoreSketch(levels=2, cells_per_level=8, decay=Exponential(0.1))
    b = ScoreSketch(levels=2, cells_per_level=8, decay=Exponential(0.1), index_scheme="km")
    with pytest.raises(MismatchError):
        a.merge(b)
    with pytest.raises(MismatchError):
        DecayingCountMin().merge(DecayingCountMin(index_scheme="km"))


def test_a_snapshot_naming_an_unknown_scheme_is_refused() -> None:
    blob = DecayingCountMin(width=64, depth=2).to_bytes()
    header, payload = envelope.unpack(blob, envelope.KIND_COUNT_MIN)
    header["index_scheme"] = "quadratic"
    bad = envelope.pack(envelope.KIND_COUNT_MIN, header, payload)
    with pytest.raises(SnapshotError, match="index_scheme"):
        DecayingCountMin.from_bytes(bad)


# ---- a deployment keeps its scheme until it resets its state ------------------------------

SEED = "00112233445566778899aabbccddeeff"
BASE = {"seed": SEED, "source_topic": "src", "levels": "2", "cells_per_level": "1000"}


def _topology(**settings: str):
    return load_topology("abuse_scores", Settings({**BASE, **settings}, environ={}))


def _blob(scheme: str) -> bytes:
    op = _topology(index_scheme=scheme).operator(0, 4)
    op.process([SourceRecord("src", 0, i, 1000 + i, b"k", b'{"outcome":"bad"}') for i in range(5)])
    return op.snapshot()


def _restore(store: MemoryStore, topo):
    from grudge_stream.partitions import restore_partition

    return restore_partition(topo, store, 0, 4, low_watermark=lambda: 17)


def test_fingerprints_name_the_scheme_and_km_keeps_the_old_one() -> None:
    ix, km = _topology().operator(0, 4), _topology(index_scheme="km").operator(0, 4)
    assert ix.fingerprint != km.fingerprint
    assert ix.config_dict()["sketch"]["index_scheme"] == "independent"
    assert "index_scheme" not in km.config_dict()["sketch"]


def test_a_worker_at_the_default_keeps_the_scheme_of_its_snapshots(caplog) -> None:
    out = _restore(MemoryStore(_blob("km")), _topology())
    assert out.mode == "snapshot" and out.start_offset == 5
    assert out.operator.sketch.index_scheme == "km"
    assert "index_scheme=km" in caplog.text
    assert out.operator.fingerprint == _topology(index_scheme="km").operator(0, 4).fingerprint
    # its own snapshots stay KM, and restore the same way
    again = _restore(MemoryStore(out.operator.snapshot()), _topology())
    assert again.operator.sketch.index_scheme == "km" and again.mode == "snapshot"
    # a fresh partition starts under the default
    assert _restore(MemoryStore(), _topology()).operator.sketch.index_scheme == "independent"


def test_an_explicit_scheme_refuses_the_other_like_a_seed() -> None:
    with pytest.raises(CheckpointError, match="index_scheme"):
        _restore(MemoryStore(_blob("km")), _topology(index_scheme="independent"))
    with pytest.raises(CheckpointError, match="index_scheme"):
        _restore(MemoryStore(_blob("independent")), _topology(index_scheme="km"))
    out = _restore(MemoryStore(_blob("km")), _topology(reset_state="true"))
    assert out.mode == "replay" and out.operator.sketch.index_scheme == "independent"


def test_adoption_is_for_the_scheme_only() -> None:
    other = load_topology("abuse_scores", Settings({**BASE, "cells_per_level": "2000", "index_scheme": "km"},
                                                   environ={}))
    op = other.operator(0, 4)
    op.process([SourceRecord("src", 0, 0, 1000, b"k", b'{"outcome":"bad"}')])
    with pytest.raises(CheckpointError, match="cells_per_level"):
        _restore(MemoryStore(op.snapshot()), _topology())
    assert dataclasses.replace(_topology(), with_index_scheme=None).with_index_scheme is None


def test_replay_from_a_snapshot_keeps_its_scheme_too() -> None:
    from grudge_stream.replay.runner import _snapshot_operator

    op = _snapshot_operator(_topology(), 0, 4, _blob("km"))
    assert op.sketch.index_scheme == "km" and op.next_offset == 5
    with pytest.raises(MismatchError):
        _snapshot_operator(_topology(index_scheme="independent"), 0, 4, _blob("km"))
