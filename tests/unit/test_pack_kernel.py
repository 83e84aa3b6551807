"""The snapshot byte kernels (grudge_stream._cyext._pack): the same bytes as the Python
reference, and no interpreter lock held while they copy and checksum."""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from grudge_stream import Exponential, envelope
from grudge_stream.checkpoint.format import encode_chunk, encode_chunk_py
from grudge_stream.envelope import pack, pack_parts, pack_py
from grudge_stream.sketches.split import SplitScoreSketch

KINDS = (envelope.KIND_SCORE_SKETCH, envelope.KIND_SPLIT_SCORE, envelope.KIND_COUNT_MIN, envelope.KIND_OPERATOR)


def _header(rng: random.Random) -> dict:
    return {f"k{i}": rng.choice([rng.random(), rng.randrange(-2**63, 2**63), "é✓" * rng.randrange(4), None,
                                 [rng.random(), float("inf")], {"nested": rng.random()}])
            for i in range(rng.randrange(6))}


def _split(data: bytes, rng: random.Random) -> list:
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(5)))
    bounds = [0, *cuts, len(data)]
    forms = (bytes, bytearray, memoryview, lambda b: np.frombuffer(b, dtype=np.uint8))
    return [rng.choice(forms)(data[a:b]) for a, b in zip(bounds, bounds[1:])]


def test_pack_matches_the_python_envelope_for_random_inputs() -> None:
    rng = random.Random(44)
    for _ in range(300):
        kind = rng.choice(KINDS)
        header = _header(rng)
        size = rng.choice([0, 1, 7, 8, 9, rng.randrange(1, 3000), rng.randrange(128 * 1024, 300 * 1024)])
        data = rng.randbytes(size)
        expected = pack_py(kind, header, data)
        assert pack(kind, header, data) == expected
        assert pack(kind, header, memoryview(data)) == expected
        assert pack_parts(kind, header, _split(data, rng)) == expected
        assert envelope.unpack(expected, kind)[0] == header


def _nested(rng: random.Random, depth: int):
    """A random tree of envelopes: (the unbuilt one, the bytes pack_py makes of it)."""
    kind, header = rng.choice(KINDS), _header(rng)
    lazy, ref = [], []
    for _ in range(rng.randrange(4)):
        if depth < 4 and rng.random() < 0.4:
            e, b = _nested(rng, depth + 1)
            lazy.append(e)
            ref.append(b)
        else:
            data = rng.randbytes(rng.choice([0, 3, rng.randrange(1, 200_000)]))
            lazy.extend(_split(data, rng))
            ref.append(data)
    return envelope.later(kind, header, lazy), pack_py(kind, header, b"".join(ref))


def test_envelopes_within_envelopes_are_built_in_place_as_python_packs_them() -> None:
    rng = random.Random(3)
    for _ in range(60):
        env, expected = _nested(rng, 0)
        assert len(env) == len(expected)
        assert envelope.build(env) == expected
        kind, header = rng.choice(KINDS), _header(rng)
        tail = rng.randbytes(rng.randrange(100))
        assert pack_parts(kind, header, [env, tail]) == pack_py(kind, header, expected + tail)


def test_a_part_that_changed_size_since_the_envelope_was_made_is_refused() -> None:
    part = bytearray(b"x" * 100)
    env = envelope.later(envelope.KIND_OPERATOR, {}, [part])
    part.extend(b"y" * 50)
    with pytest.raises(ValueError, match="changed size"):
        envelope.build(env)
    with pytest.raises(ValueError, match="nested"):
        e = envelope.later(1, {}, [b""])
        for _ in range(20):
            e = envelope.later(1, {}, [e])
        envelope.build(e)


def test_pack_takes_a_structured_array_and_refuses_what_is_no_buffer() -> None:
    cells = np.zeros(1000, dtype=[("score", "<f8"), ("last_ms", "<i8")])
    cells["score"] = np.linspace(0, 1, 1000)
    cells["last_ms"] = np.arange(1000) - 2**62
    assert pack(envelope.KIND_SCORE_SKETCH, {"a": 1}, cells) == pack_py(envelope.KIND_SCORE_SKETCH, {"a": 1},
                                                                         cells.view(np.uint8))
    with pytest.raises(TypeError):
        pack(envelope.KIND_OPERATOR, {}, "not bytes")
    with pytest.raises(TypeError):
        pack_parts(envelope.KIND_OPERATOR, {}, [b"ok", 3])
    with pytest.raises(ValueError):
        pack(0x10000, {}, b"")
    with pytest.raises(ValueError):
        pack(-1, {}, b"")


def test_encode_chunk_matches_the_python_chunk_record() -> None:
    rng = random.Random(7)
    blob = rng.randbytes(700_000)
    view = memoryview(blob)
    for _ in range(200):
        a = rng.randrange(len(blob) + 1)
        b = min(len(blob), a + rng.choice([0, 1, 31, 4096, 512 * 1024]))
        gen, index, count = rng.choice([0, 1, 2**64 - 1]), rng.randrange(2**32), rng.randrange(2**32)
        assert encode_chunk(gen, index, count, view[a:b]) == encode_chunk_py(gen, index, count, view[a:b])
        assert encode_chunk(gen, index, count, blob[a:b]) == encode_chunk_py(gen, index, count, blob[a:b])
    with pytest.raises(OverflowError):
        encode_chunk(2**64, 0, 1, b"")
    with pytest.raises(OverflowError):
        encode_chunk(1, 2**32, 1, b"")


def test_a_split_sketch_snapshot_is_unchanged() -> None:
    """The split sketch's envelope of two envelopes, made from parts, is the bytes the joins
    of earlier releases made."""
    s = SplitScoreSketch(levels=2, cells_per_level=5000, decay=Exponential(0.01), seed=3)
    s.update_many([f"k{i}".encode() for i in range(2000)], np.linspace(-1, 1, 2000), now_ms=10_000)
    blob = s.to_bytes()
    a, b = s.pos.to_bytes(), s.neg.to_bytes()
    header, _ = envelope.unpack(blob, envelope.KIND_SPLIT_SCORE)
    assert blob == pack_py(envelope.KIND_SPLIT_SCORE, header, a + b)
    assert a == pack_py(envelope.KIND_SCORE_SKETCH, envelope.unpack(a, envelope.KIND_SCORE_SKETCH)[0],
                        s.pos._cells().view(np.uint8).ravel())


class _Probe:
    """A Python thread that wakes every 0.5 ms and keeps its longest gap inside a window."""

    def __init__(self) -> None:
        self.ticks = 0
        self.longest = 0.0
        self.measuring = False
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self.stop:
            time.sleep(0.0005)
            now = time.perf_counter()
            if self.measuring:
                self.ticks += 1
                self.longest = max(self.longest, now - last)
            last = now


def test_another_thread_runs_while_a_large_pack_copies() -> None:
    """A pack of 112 MB (the copy and CRC take 100+ ms) leaves the GIL to a Python thread that
    wakes every 0.5 ms: it is never stopped for more than a fraction of the call. (The Python
    reference, ``pack_py``, stops it for a whole join: a third of the call or more.)"""
    payload = b"\x5a" * (112 << 20)
    probe = _Probe()
    probe.thread.start()
    try:
        time.sleep(0.01)
        probe.measuring = True
        t0 = time.perf_counter()
        blob = pack_parts(envelope.KIND_OPERATOR, {"n": 1}, [payload, memoryview(payload)[:1000]])
        took = time.perf_counter() - t0
        probe.measuring = False
    finally:
        probe.stop = True
        probe.thread.join()
    assert len(blob) == (112 << 20) + 1000 + envelope.MIN_SIZE + len(b'{"n":1}')
    assert took > 0.04, f"the pack took only {took * 1e3:.1f} ms: too short to show anything"
    assert probe.ticks > 20, f"the probe woke {probe.ticks} times in {took * 1e3:.0f} ms"
    assert probe.longest < took / 5, (
        f"the probe stood still {probe.longest * 1e3:.1f} ms of a {took * 1e3:.0f} ms pack")


def test_cell_copies_without_the_gil_beside_writers_do_not_deadlock() -> None:
    """Snapshots (the cell copy takes the sketch's lock without the GIL) while other threads
    write one key at a time (the lock with the GIL) and in batches (without it)."""
    s = SplitScoreSketch(levels=4, cells_per_level=10_000, decay=Exponential(0.01), seed=1)
    keys = [f"c{i}".encode() for i in range(3000)]
    hashes = s.pos.key_hashes(keys)
    done = threading.Event()
    blobs: list[bytes] = []

    def single() -> None:
        while not done.is_set():
            for k in keys[:200]:
                s.update(k, 0.01, now_ms=1)

    def batch() -> None:
        while not done.is_set():
            s.pos.update_many(hashes, 0.01, now_ms=1)

    def snap() -> None:
        for _ in range(10):
            blobs.append(s.to_bytes_later()())
        done.set()

    threads = [threading.Thread(target=f, daemon=True) for f in (single, batch, snap)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads)
    assert len(blobs) == 10
    assert SplitScoreSketch.from_bytes(blobs[-1]).pos.query(b"c1", now_ms=1) > 0
