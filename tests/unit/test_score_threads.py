"""Thread safety: each event is atomic; try_update admits exactly its limit under contention."""

from __future__ import annotations

import threading

import numpy as np

from grudge_stream import Exponential, NoDecay, Rotator, ScoreSketch

THREADS = 32


def _run(workers) -> None:
    barrier = threading.Barrier(len(workers))

    def wrap(fn):
        def go():
            barrier.wait()
            fn()

        return go

    threads = [threading.Thread(target=wrap(w)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _contend(s, limit: float) -> int:
    """32 threads: half call try_update one by one (with the GIL), half run nogil batches."""
    batch = s.key_hashes([b"hot"] * 3_000)  # several lock chunks, run without the GIL
    admitted = [0] * THREADS

    def worker(i):
        def fn():
            n = 0
            for _ in range(5):
                if i % 2:
                    n += int(s.try_update_many(batch, 1.0, limit, now_ms=0).sum())
                else:
                    for _ in range(500):
                        n += s.try_update(b"hot", 1.0, limit, now_ms=0)
            admitted[i] = n

        return fn

    _run([worker(i) for i in range(THREADS)])
    return sum(admitted)


def test_try_update_admits_exactly_the_limit_with_32_threads() -> None:
    # 16 * 5 * 3000 + 16 * 5 * 500 = 280_000 attempts for 100_000 admissions
    s = ScoreSketch(levels=4, cells_per_level=1024, decay=NoDecay(), lo=0.0, hi=1e9, seed=1)
    assert _contend(s, 100_000.0) == 100_000
    assert s.query(b"hot", now_ms=0) == 100_000.0
    r = Rotator(
        generations=3,
        period_ms=None,
        levels=4,
        cells_per_level=1024,
        decay=NoDecay(),
        lo=0.0,
        hi=1e9,
        seed=1,
    )
    assert _contend(r, 100_000.0) == 100_000
    assert r.query(b"hot", now_ms=0) == 100_000.0


def test_concurrent_updates_lose_nothing() -> None:
    s = ScoreSketch(levels=3, cells_per_level=4096, decay=NoDecay(), lo=0.0, hi=1e12, seed=2)
    keys = [f"k{i}".encode() for i in range(64)]
    hashes = s.key_hashes(keys)
    big = s.key_hashes([b"filler%d" % i for i in range(5_000)])

    def worker(i):
        def fn():
            for _ in range(50):
                if i % 3 == 0:
                    s.update_many(hashes, 1.0, now_ms=0)
                    s.update_many(big, 0.0, now_ms=0)  # a long nogil section to overlap with
                elif i % 3 == 1:
                    s.update_many(
                        keys, np.ones(len(keys)), now_ms=np.zeros(len(keys), dtype=np.int64)
                    )
                else:
                    for k in keys:
                        s.update(k, 1.0, now_ms=0)

        return fn

    _run([worker(i) for i in range(THREADS)])
    got = s.query_many(keys, now_ms=0)
    # Every add lands in 3 cells; together the cells hold all of them, none lost to a race.
    assert s._cells()["score"].sum() == 3 * THREADS * 50 * len(keys)
    assert (got >= THREADS * 50).all()


def test_readers_and_writers_with_decay_do_not_corrupt() -> None:
    s = ScoreSketch(levels=4, cells_per_level=512, decay=Exponential(0.5), lo=0.0, hi=10.0, seed=3)
    errors = []

    def writer(i):
        def fn():
            for t in range(200):
                s.update_many([b"a", b"b", bytes([i])], 0.3, now_ms=t * 10)

        return fn

    def reader(i):
        def fn():
            for t in range(400):
                v = s.query(b"a", now_ms=t * 5)
                if not (0.0 <= v <= 10.0):
                    errors.append(v)

        return fn

    _run([writer(i) if i % 2 else reader(i) for i in range(THREADS)])
    assert not errors
    blob = s.to_bytes()
    assert ScoreSketch.from_bytes(blob).to_bytes() == blob  # still a valid, consistent state
