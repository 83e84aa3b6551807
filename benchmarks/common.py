"""Small helpers shared by the benchmark scripts: timing, medians, RSS, Zipf keys."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Callable

import numpy as np


def median_time(fn: Callable[[], object], runs: int = 5, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall time (seconds) of ``fn()`` over ``runs`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), samples


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def random_keys(n: int, width: int = 16, seed: int = 1) -> list[bytes]:
    """n distinct-with-overwhelming-probability random keys of ``width`` bytes."""
    raw = np.random.default_rng(seed).integers(0, 256, size=(n, width), dtype=np.uint8).tobytes()
    return [raw[i * width:(i + 1) * width] for i in range(n)]


def zipf_indexes(n_events: int, n_keys: int, s: float = 1.1, seed: int = 2) -> np.ndarray:
    """Event -> key index drawn from a Zipf(s) law over ``n_keys`` ranks (rank 0 hottest)."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, n_keys + 1, dtype=np.float64)
    p = ranks ** -s
    p /= p.sum()
    return rng.choice(n_keys, size=n_events, p=p).astype(np.int64)


def emit(summary: dict) -> None:
    """Print the machine-readable summary line last."""
    print("RESULT " + json.dumps(summary, sort_keys=True))
    sys.stdout.flush()


# The abuse traffic of bench_batch.py (and the scripts built on its generator), without a
# broker: uniform clients over PARTS partitions, each client's events bad with probability
# 2%, and every 5000th client abusive (90% bad).
PARTS = 8
BENCH_KEY = "2b7e151628aed2a6abf7158809cf4f3c"  # a fixed benchmark hash key, not a secret
BAD, GOOD = b'{"outcome":"bad"}', b'{"outcome":"good"}'


def abuse_draw(n: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """``(client of event i, a uniform draw per event)``, the same on every run."""
    rng = np.random.default_rng(1)
    return rng.integers(0, keys, size=n), rng.random(n)


def abuse_value(client: int, draw: float) -> bytes:
    """The outcome of one event of ``client`` given its draw."""
    return BAD if (client % 5000 == 0 and draw < 0.9) or draw < 0.02 else GOOD
