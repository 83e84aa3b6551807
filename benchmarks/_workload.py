"""The benchmark workload shared by bench_countmin.py and bench_bloom.py.

A universe of distinct 16-byte keys and a Zipf(s) stream over it (fixed seed),
as pre-hashed uint64 values and as bytes objects, plus timing helpers.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

import numpy as np

from grudge_stream.hashing import hash64_many


def zipf_ids(n_events: int, n_keys: int, s: float, seed: int, cover: bool = True) -> np.ndarray:
    """Event i's key id, drawn with P(rank r) ~ 1 / r**s; ranks are shuffled over ids so
    the hottest key is not id 0. With ``cover`` (and n_events >= n_keys), n_keys of the
    events are one occurrence of every key, shuffled into the Zipf draws, so the stream
    has exactly n_keys distinct keys (a Zipf sample alone leaves most of the tail unseen)."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, n_keys + 1, dtype=np.float64) ** s)
    cdf /= cdf[-1]
    n_zipf = n_events - n_keys if cover and n_events >= n_keys else n_events
    ranks = np.searchsorted(cdf, rng.random(n_zipf), side="right")
    ranks = np.minimum(ranks, n_keys - 1)
    perm = rng.permutation(n_keys)
    ids = perm[ranks].astype(np.int64)
    if n_zipf < n_events:
        ids = np.concatenate([ids, np.arange(n_keys, dtype=np.int64)])
        rng.shuffle(ids)
    return ids


def key_bytes(i: int) -> bytes:
    return i.to_bytes(8, "little") * 2  # 16 bytes, distinct per id


class Workload:
    def __init__(
        self,
        n_events: int,
        n_keys: int,
        s: float = 1.1,
        seed: int = 2024,
        hash_seed: int = 0,
        cover: bool = True,
    ):
        self.n_events, self.n_keys, self.s = n_events, n_keys, s
        self.ids = zipf_ids(n_events, n_keys, s, seed, cover)
        self.universe = [key_bytes(i) for i in range(n_keys)]
        self.universe_hashes = hash64_many(self.universe, hash_seed)
        self.hashes = self.universe_hashes[self.ids]
        self.distinct = int(np.unique(self.ids).size)

    def fresh_keys(self, n: int) -> list[bytes]:
        """The first n events as new bytes objects, one per event, allocated in stream
        order (what a Kafka consumer hands over)."""
        ids = self.ids[:n].tolist()
        return [i.to_bytes(8, "little") * 2 for i in ids]

    def shared_keys(self, n: int) -> list[bytes]:
        """The first n events as references to the universe's key objects."""
        u = self.universe
        return [u[i] for i in self.ids[:n].tolist()]


def each(fn: Callable[[object], object], batches) -> None:
    """Call fn on every batch and drop the results, as a consumer loop does."""
    for b in batches:
        fn(b)


def timed(
    fn: Callable[[], object], runs: int, setup: Callable[[], object] | None = None
) -> list[float]:
    out = []
    for _ in range(runs):
        if setup is not None:
            setup()
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        gc.enable()
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def machine() -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }


def emit(name: str, summary: dict) -> None:
    print()
    print(f"JSON {name}")
    print(json.dumps(summary, indent=None, sort_keys=True))


def deep_size_of_keys(keys) -> int:
    return sum(sys.getsizeof(k) for k in keys)
