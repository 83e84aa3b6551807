"""Thread safety of the reads live queries use and of the sketches without a thread test so
far: a SplitScoreSketch read sees both halves at one instant, and ForgettingBloom's calls
are atomic to other threads (its dedup admits each key exactly once under contention)."""
from __future__ import annotations

import threading

import numpy as np

from grudge_stream import ForgettingBloom, NoDecay
from grudge_stream.sketches.split import SplitScoreSketch

THREADS = 16


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


def test_split_reads_never_see_half_a_batch() -> None:
    # Each +1 is followed by a -1 of the same thread: between any two events the score is the
    # number of +1s still waiting for their -1 (a batch holds its lock for whole pairs; two
    # single-event writers: at most 2). A read that took punishment and forgiveness at
    # different moments sees forgiveness for more -1s than the punishment it read: below 0.
    sk = SplitScoreSketch(levels=4, cells_per_level=64, decay=NoDecay(), lo=-1e9, hi=1e9, seed=3)
    pairs = np.tile([1.0, -1.0], 4_000)  # several lock chunks per batch
    hot = sk.key_hashes([b"hot"] * len(pairs))
    seen: list[set[float]] = [set() for _ in range(THREADS)]
    done = [0]

    def writer(i):
        def fn():
            for _ in range(15):
                if i % 2:
                    sk.update_many(hot, pairs, now_ms=0)
                else:
                    for d in pairs[:400]:
                        sk.update(b"hot", float(d), now_ms=0)
            done[0] += 1
        return fn

    def reader(i):
        def fn():
            while done[0] < 4:
                seen[i].add(sk.peek_detailed(b"hot", 0)["score"])
        return fn

    _run([writer(i) if i < 4 else reader(i) for i in range(THREADS)])
    scores = set().union(*seen)
    assert scores and scores <= {0.0, 1.0, 2.0}, sorted(scores)[:10]
    final = sk.peek_detailed(b"hot", 0)
    assert final["score"] == 0.0
    assert final["punishment_total"] == final["forgiveness_total"] == 2 * 15 * 4_000 + 2 * 15 * 200


def test_forgetting_bloom_admits_each_key_once_under_contention() -> None:
    bloom = ForgettingBloom(capacity=200_000, fp_rate=1e-9, generations=2, period_ms=None, seed=9)
    keys = [f"k{i}".encode() for i in range(5_000)]
    hits = np.zeros((THREADS, len(keys)), dtype=np.int64)

    def worker(i):
        order = np.random.default_rng(i).permutation(len(keys))

        def fn():
            if i % 2:
                got = bloom.add_if_absent_many([keys[j] for j in order])
                hits[i, order] = got
            else:
                for j in order:
                    hits[i, j] = bloom.add_if_absent(keys[j])
                    bloom.contains(keys[(j * 7) % len(keys)])  # readers interleaved
        return fn

    _run([worker(i) for i in range(THREADS)])
    assert (hits.sum(axis=0) == 1).all()  # exactly one thread saw each key as new
    assert bloom.contains_many(keys).all()


def test_forgetting_bloom_rotating_under_readers_never_forgets_the_newest() -> None:
    bloom = ForgettingBloom(capacity=100_000, fp_rate=1e-6, generations=3, period_ms=100, seed=4)
    errors: list[tuple[int, bytes]] = []
    # Pairs each add with its check, not the bloom: another writer's later add may rotate the
    # key out legitimately (its time runs ahead), so none comes between; readers do, freely.
    lock = threading.Lock()
    clock = [0]

    def writer(i):
        def fn():
            for t in range(300):
                with lock:
                    clock[0] = max(clock[0], t * 10)
                    now = clock[0]
                    key = f"w{i}-{t}".encode()
                    bloom.add(key, now_ms=now)
                    if not bloom.contains(key, now_ms=now):
                        errors.append((now, key))
        return fn

    def reader(i):
        def fn():
            for t in range(300):
                bloom.contains_many([f"w{j}-{t}".encode() for j in range(THREADS)], now_ms=t * 10)
        return fn

    _run([writer(i) if i % 2 else reader(i) for i in range(THREADS)])
    assert not errors, errors[:5]


def test_a_batch_call_interrupted_after_hashing_keeps_its_own_keys() -> None:
    """Deterministic: a call whose ``now_ms`` runs Python code (another thread gets in there,
    after the keys are hashed and before they are applied) still applies its own keys, not
    the batch another thread hashed meanwhile."""
    from grudge_stream import DecayingCountMin

    for make, call in (
        (lambda: ForgettingBloom(capacity=10_000, fp_rate=1e-9, generations=2, period_ms=None, seed=5),
         lambda sk, keys, now: sk.add_if_absent_many(keys, now_ms=now)),
        (lambda: DecayingCountMin(depth=4, width=1 << 14, epoch_ms=3_600_000, seed=5),
         lambda sk, keys, now: sk.increment_many(keys, now_ms=now)),
    ):
        sk = make()
        a_keys = [b"a%d" % i for i in range(100)]
        b_keys = [b"b%d" % i for i in range(100)]
        inside, b_done = threading.Event(), threading.Event()

        class Pause:
            """A time that lets the other thread run a whole call when it is read."""

            def __index__(self) -> int:
                if not inside.is_set():
                    inside.set()
                    assert b_done.wait(10)
                return 1_700_000_000_000

            __int__ = __index__

        def a() -> None:
            call(sk, a_keys, Pause())

        def b() -> None:
            assert inside.wait(10)
            call(sk, b_keys, 1_700_000_000_000)
            b_done.set()

        ta, tb = threading.Thread(target=a), threading.Thread(target=b)
        ta.start()
        tb.start()
        ta.join(20)
        tb.join(20)
        assert inside.is_set() and b_done.is_set()
        if isinstance(sk, ForgettingBloom):
            assert sk.contains_many(a_keys).all() and sk.contains_many(b_keys).all()
        else:
            assert (sk.query_many(a_keys, now_ms=1_700_000_000_000) == 1).all()
            assert (sk.query_many(b_keys, now_ms=1_700_000_000_000) == 1).all()
