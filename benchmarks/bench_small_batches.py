"""Batch calls at the sizes a stream worker makes them: ns per event of each sketch's batch
API at 1, 64 and 1024 events per call, so the per-call cost (argument checks, result
arrays) shows beside the per-event kernel cost.

Run: .venv/bin/python benchmarks/bench_small_batches.py [--runs 5] [--events 200000]
Side by side with another installation: benchmarks/ab.py --against OTHER/bin/python bench_small_batches.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import emit  # noqa: E402


def measure(events: int, seed: int = 1) -> dict[str, float]:
    """One round: ns/event of every case, each timed once over ``events`` events."""
    from grudge_stream import DecayingCountMin, ForgettingBloom, ScoreSketch
    from grudge_stream.hashing import hash64_many
    from grudge_stream.sketches import Exponential

    rng = np.random.default_rng(seed)
    out: dict[str, float] = {}
    for size in (1, 64, 1024):
        nb = max(1, events // size) if size > 1 else max(1, events // 50)
        ids = rng.integers(0, 100_000, size=nb * size)
        keys = [b"key-%08d" % i for i in ids]
        lists = [keys[i * size:(i + 1) * size] for i in range(nb)]
        hashes = [hash64_many(batch) for batch in lists]
        times = [np.full(size, 10_000 + i, dtype=np.int64) for i in range(nb)]
        score = ScoreSketch(levels=4, cells_per_level=1 << 16, decay=Exponential(0.01))
        cm = DecayingCountMin(epoch_ms=1000)
        bloom = ForgettingBloom(capacity=1_000_000, fp_rate=0.01, period_ms=3_600_000)
        cases: dict[str, tuple[Callable[[int], object], int]] = {
            "ScoreSketch.update_many, keys, one now_ms": (
                lambda i: score.update_many(lists[i], 1.0, now_ms=10_000 + i), nb),
            "ScoreSketch.update_many, uint64, now_ms array": (
                lambda i: score.update_many(hashes[i], 1.0, now_ms=times[i]), nb),
            "ScoreSketch.try_update_many, uint64, now_ms array": (
                lambda i: score.try_update_many(hashes[i], 1.0, 50.0, now_ms=times[i]), nb),
            "DecayingCountMin.increment_many, keys, one now_ms": (
                lambda i: cm.increment_many(lists[i], now_ms=10_000 + i), nb),
            "DecayingCountMin.query_many, uint64, now_ms array": (
                lambda i: cm.query_many(hashes[i], now_ms=times[i]), nb),
            "ForgettingBloom.add_if_absent_many, uint64, one now_ms": (
                lambda i: bloom.add_if_absent_many(hashes[i], now_ms=10_000 + i), nb),
        }
        for name, (call, n) in cases.items():
            t0 = time.perf_counter_ns()
            for i in range(n):
                call(i)
            out[f"{name} | {size}"] = (time.perf_counter_ns() - t0) / (n * size)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--events", type=int, default=200_000)
    args = ap.parse_args()
    rounds = [measure(args.events) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"ns per event, median of {args.runs} rounds ({'call | events per call'})")
    for k, v in med.items():
        print(f"  {k:62s} {v:8.1f}")
    emit({"ns_per_event": med})


if __name__ == "__main__":
    main()
