"""ScoreSketch / Rotator snapshots (round trip, corruption) and merge."""

from __future__ import annotations

import json
import math
import random
import struct

import numpy as np
import pytest

from grudge_stream import (
    Exponential,
    Linear,
    ManualClock,
    MismatchError,
    NoDecay,
    Rotator,
    ScoreSketch,
    SnapshotError,
)
from grudge_stream.envelope import KIND_ROTATOR, KIND_SCORE_SKETCH, pack, unpack


def small(**kw) -> ScoreSketch:
    base = dict(levels=2, cells_per_level=8, decay=Exponential(0.25), lo=-1.0, hi=3.0, seed=7)
    base.update(kw)
    return ScoreSketch(**base)


def busy(s, n=200, seed=1):
    rnd = random.Random(seed)
    t = 0
    for _ in range(n):
        t += rnd.randint(0, 400)
        s.update(rnd.randbytes(3), rnd.uniform(-0.5, 1.5), now_ms=t)
    return t


def test_round_trip_is_bit_identical_and_continues_identically() -> None:
    s = small()
    t = busy(s)
    blob = s.to_bytes()
    r = ScoreSketch.from_bytes(blob)
    assert r.to_bytes() == blob
    assert r.config == s.config and r.seed == s.seed and r.watermark_ms == s.watermark_ms
    assert np.array_equal(r._cells().view(np.uint8), s._cells().view(np.uint8))
    rnd = random.Random(8)
    for _ in range(300):
        t += rnd.randint(0, 300)
        k, d = rnd.randbytes(3), rnd.uniform(-1, 2)
        assert r.update_and_query(k, d, now_ms=t) == s.update_and_query(k, d, now_ms=t)
    assert r.to_bytes() == s.to_bytes()


def test_from_bytes_accepts_bytes_like_and_a_clock() -> None:
    s = small()
    busy(s)
    clock = ManualClock(10**9)
    r = ScoreSketch.from_bytes(memoryview(bytearray(s.to_bytes())), clock=clock)
    assert r.clock is clock and r.to_bytes() == s.to_bytes()


@pytest.mark.parametrize("cls", ["sketch", "rotator"])
def test_every_bit_flip_and_truncation_is_refused(cls) -> None:
    if cls == "sketch":
        obj = ScoreSketch(levels=2, cells_per_level=4, decay=Linear(1.0), hi=2.0, seed=3)
        load = ScoreSketch.from_bytes
    else:
        obj = Rotator(
            generations=2,
            period_ms=1000,
            levels=1,
            cells_per_level=4,
            decay=Linear(1.0),
            hi=2.0,
            seed=3,
        )
        load = Rotator.from_bytes
    obj.update(b"a", 1.5, now_ms=1500)
    obj.update(b"b", 0.5, now_ms=1600)
    blob = obj.to_bytes()
    assert load(blob).to_bytes() == blob
    for i in range(len(blob)):
        for bit in range(8):
            bad = bytearray(blob)
            bad[i] ^= 1 << bit
            with pytest.raises(SnapshotError):
                load(bytes(bad))
    for n in range(len(blob)):
        with pytest.raises(SnapshotError):
            load(blob[:n])
    with pytest.raises(SnapshotError):
        load(blob + b"\0")


def test_other_kinds_and_versions_are_refused() -> None:
    s = small()
    r = Rotator(period_ms=10, levels=2, cells_per_level=8, decay=NoDecay(), hi=1.0, seed=1)
    with pytest.raises(SnapshotError, match="not a Rotator"):
        Rotator.from_bytes(s.to_bytes())
    with pytest.raises(SnapshotError, match="not a ScoreSketch"):
        ScoreSketch.from_bytes(r.to_bytes())
    blob = bytearray(s.to_bytes())
    struct.pack_into("<H", blob, 4, 2)
    with pytest.raises(SnapshotError, match="format version"):
        ScoreSketch.from_bytes(bytes(blob))
    with pytest.raises(SnapshotError):
        ScoreSketch.from_bytes("not bytes")


def _reseal(blob: bytes, kind: int, edit_header=None, edit_payload=None) -> bytes:
    """Re-pack a snapshot after editing it, with a valid checksum (semantic corruption)."""
    header, payload = unpack(blob, kind)
    header = json.loads(json.dumps(header))
    payload = bytearray(payload)
    if edit_header:
        edit_header(header)
    if edit_payload:
        payload = edit_payload(payload)
    return pack(kind, header, bytes(payload))


def _set_cell(payload: bytearray, i: int, score=None, last=None) -> bytearray:
    if score is not None:
        struct.pack_into("<d", payload, 16 * i, score)
    if last is not None:
        struct.pack_into("<q", payload, 16 * i + 8, last)
    return payload


@pytest.mark.parametrize(
    "edit_header,edit_payload,match",
    [
        (lambda h: h["config"].update(levels=0), None, "invalid config"),
        (lambda h: h["config"].update(levels=3), None, "payload"),
        (lambda h: h["config"].update(lo=5.0), None, "invalid config"),
        (lambda h: h["config"].update(decay={"kind": "cubic"}), None, "invalid config"),
        (lambda h: h["config"].update(extra=1), None, "invalid config"),
        (lambda h: h["config"].update(seed=-4), None, "invalid config"),
        (lambda h: h.update(extra=1), None, "header fields"),
        (lambda h: h.pop("watermark_ms"), None, "header fields"),
        (lambda h: h.update(watermark_ms="soon"), None, "watermark"),
        (lambda h: h.update(watermark_ms=100), None, "after the sketch's watermark"),
        (lambda h: h.update(watermark_ms=None), None, "after the sketch's watermark"),
        (None, lambda p: p[:-16], "payload"),
        (None, lambda p: p + bytes(16), "payload"),
        (None, lambda p: _set_cell(p, 0, score=float("nan")), "non-finite"),
        (None, lambda p: _set_cell(p, 0, score=math.inf), "non-finite"),
        (None, lambda p: _set_cell(p, 1, score=3.5), "outside"),
        (None, lambda p: _set_cell(p, 1, score=-1.5), "outside"),
        (None, lambda p: _set_cell(p, 2, score=0.5, last=-(2**63)), "never-stamped"),
        (None, lambda p: _set_cell(p, 2, last=10**12), "after the sketch's watermark"),
    ],
)
def test_semantically_invalid_snapshots_are_refused(edit_header, edit_payload, match) -> None:
    s = small()
    for j in range(40):
        s.update(bytes([j]), 0.5, now_ms=1_000 + j)
    blob = _reseal(s.to_bytes(), KIND_SCORE_SKETCH, edit_header, edit_payload)
    with pytest.raises(SnapshotError, match=match):
        ScoreSketch.from_bytes(blob)


@pytest.mark.parametrize(
    "edit_header,match",
    [
        (lambda h: h.update(rotations=h["rotations"] + 1), "generation seeds"),
        (lambda h: h.update(rotations=-1), "rotations"),
        (lambda h: h.update(epoch=-1), "epoch"),
        (lambda h: h.update(epoch=0), "past its epoch"),
        (lambda h: h["generation_seeds"].reverse(), "generation seeds"),
        (lambda h: h["config"].update(generations=1), "invalid config"),
        (lambda h: h["config"].update(generations=3), "generation seeds"),
        (lambda h: h["config"]["sketch"].update(hasher="xx"), "invalid config"),
    ],
)
def test_semantically_invalid_rotator_snapshots_are_refused(edit_header, match) -> None:
    r = Rotator(
        generations=2,
        period_ms=1000,
        levels=2,
        cells_per_level=4,
        decay=Linear(1.0),
        hi=2.0,
        seed=3,
    )
    r.update(b"a", 1.0, now_ms=5_500)
    blob = _reseal(r.to_bytes(), KIND_ROTATOR, edit_header)
    with pytest.raises(SnapshotError, match=match):
        Rotator.from_bytes(blob)


def test_header_documents_config_seed_and_clock_state() -> None:
    s = small()
    s.update(b"k", 1.0, now_ms=1234)
    header, payload = unpack(s.to_bytes(), KIND_SCORE_SKETCH)
    assert header == {
        "config": {
            "aggregator": "min",
            "cells_per_level": 8,
            "decay": {"kind": "exponential", "lambda_per_s": 0.25},
            "hasher": "murmur3",
            "hi": 3.0,
            "levels": 2,
            "lo": -1.0,
            "seed": 7,
            "index_scheme": "independent",
        },
        "watermark_ms": 1234,
    }
    assert payload.nbytes == 16 * 2 * 8
    cells = np.frombuffer(payload, dtype=[("score", "<f8"), ("last_ms", "<i8")]).reshape(2, 8)
    idx = s.query_detailed(b"k", now_ms=1234).cell_indexes
    assert [cells[i, j]["score"] for i, j in enumerate(idx)] == [1.0, 1.0]
    assert (cells["last_ms"][cells["score"] == 0] == -(2**63)).all()


# ---- merge ----------------------------------------------------------------------------


def test_merge_refuses_other_configs_and_seeds() -> None:
    a = small()
    for other in (
        small(seed=8),
        small(hi=4.0),
        small(decay=Exponential(0.3)),
        small(levels=3),
        small(aggregator="max"),
        small(hasher="siphash"),
    ):
        with pytest.raises(MismatchError):
            a.merge(other)
    with pytest.raises(TypeError):
        a.merge(
            Rotator(
                period_ms=1,
                levels=2,
                cells_per_level=8,
                decay=Exponential(0.25),
                lo=-1.0,
                hi=3.0,
                seed=7,
            )
        )


def test_merge_is_exact_for_no_decay_integer_deltas_without_clamping() -> None:
    rnd = random.Random(3)
    kw = dict(levels=3, cells_per_level=50, decay=NoDecay(), lo=-1e9, hi=1e9, seed=5)
    a, b, both = ScoreSketch(**kw), ScoreSketch(**kw), ScoreSketch(**kw)
    for t in range(3000):
        k, d = rnd.randbytes(2), float(rnd.randint(-5, 9))
        (a if rnd.random() < 0.5 else b).update(k, d, now_ms=t)
        both.update(k, d, now_ms=t)
    a.merge(b)
    assert np.array_equal(a._cells()["score"], both._cells()["score"])
    assert a.watermark_ms == both.watermark_ms


def test_merge_with_exponential_matches_one_sketch_up_to_rounding() -> None:
    rnd = random.Random(4)
    kw = dict(levels=3, cells_per_level=50, decay=Exponential(0.3), lo=0.0, hi=math.inf, seed=5)
    a, b, both = ScoreSketch(**kw), ScoreSketch(**kw), ScoreSketch(**kw)
    keys = [rnd.randbytes(2) for _ in range(300)]
    for t in range(0, 30_000, 10):
        k, d = rnd.choice(keys), rnd.uniform(0, 2)
        (a if rnd.random() < 0.5 else b).update(k, d, now_ms=t)
        both.update(k, d, now_ms=t)
    a.merge(b)
    for k in keys:
        assert a.query(k, now_ms=40_000) == pytest.approx(both.query(k, now_ms=40_000), rel=1e-9)


def test_merge_with_self_doubles_and_fresh_is_identity() -> None:
    a = small(decay=NoDecay(), lo=0.0, hi=100.0)
    a.update(b"k", 1.5, now_ms=10)
    before = a.to_bytes()
    a.merge(small(decay=NoDecay(), lo=0.0, hi=100.0))
    assert a.to_bytes() == before
    a.merge(a)
    assert a.query(b"k", now_ms=10) == 3.0


def test_rotator_merge_needs_the_same_rotation_state() -> None:
    kw = dict(
        generations=2,
        period_ms=1000,
        levels=2,
        cells_per_level=16,
        decay=NoDecay(),
        hi=100.0,
        seed=9,
    )
    a, b = Rotator(**kw), Rotator(**kw)
    a.update(b"k", 1.0, now_ms=500)
    b.update(b"k", 2.0, now_ms=700)
    a.merge(b)
    assert a.query(b"k", now_ms=800) == 3.0
    b.rotate()
    with pytest.raises(MismatchError, match="rotation"):
        a.merge(b)
    c = Rotator(**kw)
    c.update(b"k", 1.0, now_ms=2500)
    with pytest.raises(MismatchError):
        a.merge(c)
    with pytest.raises(MismatchError):
        a.merge(Rotator(**{**kw, "seed": 10}))
