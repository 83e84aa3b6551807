"""ForgettingBloom throughput, measured false-positive rate and a Python-set baseline.

    python benchmarks/bench_bloom.py [--events 10000000] [--keys 1000000] [--runs 5]

Workload: a Zipf(1.1) stream over --keys distinct 16-byte keys (fixed seed);
the filter has capacity 1M and fp_rate 1 % (2 generations). Every figure is the
median of --runs runs; the last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from _workload import Workload, deep_size_of_keys, each, emit, machine, median, timed

from grudge_stream import ForgettingBloom


def chunks(seq, size):
    return [seq[i : i + size] for i in range(0, len(seq), size)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--fp-rate", type=float, default=0.01)
    ap.add_argument("--bytes-events", type=int, default=4_000_000)
    ap.add_argument("--baseline-distinct", type=int, nargs="*", default=[1_000_000, 10_000_000])
    args = ap.parse_args(argv)
    runs, n = args.runs, args.events
    t0 = time.perf_counter()
    w = Workload(n, args.keys)
    cfg = dict(capacity=args.capacity, fp_rate=args.fp_rate, seed=0)
    probe = ForgettingBloom(**cfg)
    print(
        f"workload: {n:,} events, Zipf s={w.s} over {args.keys:,} keys ({w.distinct:,} seen); filter "
        f"capacity {args.capacity:,}, fp {args.fp_rate}, k={probe.hashes}, {probe.memory_bytes():,} bytes; "
        f"median of {runs} runs; setup {time.perf_counter() - t0:.1f}s"
    )
    res: dict = {
        "machine": machine(),
        "events": n,
        "keys": args.keys,
        "distinct_seen": w.distinct,
        "capacity": args.capacity,
        "fp_rate": args.fp_rate,
        "hashes": probe.hashes,
        "memory_bytes": probe.memory_bytes(),
        "runs": runs,
    }
    hb = chunks(w.hashes, args.batch)
    state = {}

    def fresh_filter():
        state["b"] = ForgettingBloom(**cfg)

    def row(name, mevs):
        print(f"  {name:<52} {mevs:8.1f} M keys/s  ({1e3 / mevs:6.2f} ns/key)")

    t = timed(lambda: each(state["b"].add_if_absent_many, hb), runs, setup=fresh_filter)
    res["add_if_absent_prehashed_mkeys_s"] = n / median(t) / 1e6
    row("add_if_absent_many, pre-hashed uint64", res["add_if_absent_prehashed_mkeys_s"])
    b = ForgettingBloom(**cfg)
    new = sum(int(b.add_if_absent_many(c).sum()) for c in hb)
    res.update(
        new_keys_reported=new,
        missed_as_false_positive=w.distinct - new,
        rotations=b.rotations,
        approx_count=b.approx_count(),
        fp_rate_estimate_after=b.fp_rate_estimate(),
    )
    print(
        f"    {new:,} keys reported new of {w.distinct:,} distinct (false positives: {w.distinct - new:,}); "
        f"approx_count {b.approx_count():,.0f}; fp_rate_estimate {b.fp_rate_estimate():.4f}"
    )
    t = timed(lambda: each(b.contains_many, hb), runs)
    res["contains_prehashed_mkeys_s"] = n / median(t) / 1e6
    row("contains_many, pre-hashed uint64", res["contains_prehashed_mkeys_s"])
    t = timed(lambda: each(state["b"].add_many, hb), runs, setup=fresh_filter)
    res["add_prehashed_mkeys_s"] = n / median(t) / 1e6
    row("add_many, pre-hashed uint64", res["add_prehashed_mkeys_s"])

    nb = min(args.bytes_events, n)
    fresh = chunks(w.fresh_keys(nb), args.batch)
    t = timed(lambda: each(state["b"].add_if_absent_many, fresh), runs, setup=fresh_filter)
    res["add_if_absent_bytes_fresh_mkeys_s"] = nb / median(t) / 1e6
    row(
        "add_if_absent_many, bytes keys (one object per event)",
        res["add_if_absent_bytes_fresh_mkeys_s"],
    )
    fresh = None

    keys = w.universe[:1000] * 1000
    one = ForgettingBloom(**cfg)
    t = timed(lambda: [one.add_if_absent(k) for k in keys], runs)
    res["single_add_if_absent_ns"] = median(t) / len(keys) * 1e9
    print(
        f"  single add_if_absent (no period)          {res['single_add_if_absent_ns']:6.1f} ns/call"
    )

    # -- false positives at capacity ------------------------------------------------------
    rng = np.random.default_rng(7)
    probes = rng.integers(0, 2**64 - 1, size=2_000_000, dtype=np.uint64, endpoint=True)
    for label, inserts in (
        ("one generation at capacity", args.capacity),
        ("every generation at capacity", 2 * args.capacity - 1),
    ):
        f = ForgettingBloom(**cfg)
        f.add_many(rng.integers(0, 2**64 - 1, size=inserts, dtype=np.uint64, endpoint=True))
        fp = float(f.contains_many(probes).mean())
        key = "fp_one_generation_full" if inserts == args.capacity else "fp_all_generations_full"
        res[key] = fp
        res[key + "_estimate"] = f.fp_rate_estimate()
        print(
            f"  measured fp, {label:<29} {fp:.4%} (estimate {f.fp_rate_estimate():.4%}, target "
            f"{args.fp_rate:.2%}, limit {1.5 * args.fp_rate:.2%})"
        )

    # -- exact baseline: a Python set ---------------------------------------------------------
    fresh_all = w.fresh_keys(nb)

    def dedup_set():
        s = set()
        add = s.add
        for k in fresh_all:
            if k not in s:
                add(k)

    t = timed(dedup_set, max(3, runs // 2))
    res["set_dedup_mkeys_s"] = nb / median(t) / 1e6
    row("Python set dedup loop, bytes keys", res["set_dedup_mkeys_s"])
    fresh_all = None
    for d in args.baseline_distinct:
        ks = [i.to_bytes(8, "little") * 2 for i in range(d)]
        s = set(ks)
        mem = sys.getsizeof(s) + deep_size_of_keys(ks)
        res[f"set_memory_bytes_{d}"] = mem
        fb = ForgettingBloom(capacity=d, fp_rate=args.fp_rate)
        res[f"bloom_memory_bytes_{d}"] = fb.memory_bytes()
        print(
            f"  set with {d:>12,} distinct keys: {mem / 2**20:9.1f} MiB "
            f"(ForgettingBloom at that capacity: {fb.memory_bytes() / 2**20:.1f} MiB)"
        )
        del s, ks
    res["targets"] = {
        "add_if_absent_prehashed_mkeys_s": 40,
        "fp_all_generations_full_max": 1.5 * args.fp_rate,
    }
    emit("bench_bloom", res)
    return res


if __name__ == "__main__":
    main()
