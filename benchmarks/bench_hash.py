"""Hash throughput: per-key calls from Python and batch hashing of 1M 16-byte keys.

Run: .venv/bin/python benchmarks/bench_hash.py [--runs 5]
Prints ns/key medians for grudge_stream.hashing beside mmh3.hash64 in the same run, and
hash64_many over 200k keys shuffled in memory (as a stream's key objects are).
"""
from __future__ import annotations

import argparse
import os
import random
import sys

import mmh3

sys.path.insert(0, os.path.dirname(__file__))
from common import emit, median_time, random_keys  # noqa: E402

from grudge_stream.hashing import hash64, hash64_many  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keys", type=int, default=1_000_000)
    args = ap.parse_args()
    n = args.keys
    keys = random_keys(n, 16)
    small = keys[:200_000]
    m = len(small)

    def per_key_murmur():
        for k in small:
            hash64(k, 42)

    def per_key_siphash():
        for k in small:
            hash64(k, 42, "siphash")

    def per_key_mmh3():
        for k in small:
            mmh3.hash64(k, 42, signed=False)

    def empty_loop():
        for k in small:
            pass

    res = {}
    t, _ = median_time(empty_loop, args.runs)
    res["python_for_loop_ns"] = t / m * 1e9
    for name, fn in (("hash64_murmur3_per_key_ns", per_key_murmur),
                     ("hash64_siphash_per_key_ns", per_key_siphash),
                     ("mmh3_hash64_per_key_ns", per_key_mmh3)):
        t, _ = median_time(fn, args.runs)
        res[name] = t / m * 1e9
    for algo in ("murmur3", "siphash"):
        t, _ = median_time(lambda: hash64_many(keys, 42, algo), args.runs)
        res[f"hash64_many_{algo}_Mkeys_per_s"] = n / t / 1e6
        res[f"hash64_many_{algo}_ns_per_key"] = t / n * 1e9
    # A stream's keys: objects scattered in memory, in no order of allocation. The same 200k
    # keys, in address order and shuffled (the lists above hold slices made one after
    # another, so their objects sit in address order).
    scattered = list(small)
    random.Random(3).shuffle(scattered)
    t, _ = median_time(lambda: hash64_many(small, 42), args.runs)
    res["hash64_many_murmur3_200k_ordered_ns_per_key"] = t / m * 1e9
    t, _ = median_time(lambda: hash64_many(scattered, 42), args.runs)
    res["hash64_many_murmur3_200k_scattered_ns_per_key"] = t / m * 1e9

    print(f"{'metric':40s} {'median':>10s}")
    for k, v in res.items():
        print(f"{k:40s} {v:10.2f}")
    print("targets: per-key <= 60 ns (loop included); batch murmur3 >= 100 M/s, siphash >= 50 M/s")
    emit({"bench": "hash", "runs": args.runs, "keys": n, **{k: round(v, 3) for k, v in res.items()}})


if __name__ == "__main__":
    main()
