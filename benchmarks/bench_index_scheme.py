"""Update and query cost of every sketch under both index schemes, side by side in one run.

    python benchmarks/bench_index_scheme.py [--events 2000000] [--keys 1000000] [--runs 7]

Each sketch is built twice, ``index_scheme="independent"`` (the default) and ``"km"``
(Kirsch-Mitzenmacher, grudge-stream 0.2's), with the same seed, and fed the same
Workload (a Zipf(1.1) stream over --keys distinct 16-byte keys, pre-hashed) through its
batch paths (batches of --batch events) and through single calls (--single events, one
Python call each). Rounds interleave the schemes (independent first in even rounds, km
first in odd ones), each measurement is one timed pass after the sketch was filled
once; the figures are the medians over --runs rounds, with the ratio independent / km
of the time per event (1.00: no cost; 1.10: 10 % slower). The last line is a JSON summary.

Shapes: ScoreSketch and SplitScoreSketch 4 x 100,000 (the abuse_scores default),
Rotator 2 generations of 4 x 100,000, DecayingCountMin 4 x 65,536 (its default),
ForgettingBloom 1M keys at 1 % (k = 7 positions).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _workload import Workload, emit, machine, median

from grudge_stream import DecayingCountMin, Exponential, ForgettingBloom, Rotator, ScoreSketch
from grudge_stream.sketches.split import SplitScoreSketch

SCHEMES = ("independent", "km")


def build(scheme: str) -> dict:
    score = dict(levels=4, cells_per_level=100_000, decay=Exponential(0.01), lo=0.0, hi=1.0, seed=7,
                 index_scheme=scheme)
    return {
        "ScoreSketch": ScoreSketch(**score),
        "SplitScoreSketch": SplitScoreSketch(**score),
        "Rotator": Rotator(generations=2, period_ms=3_600_000, **score),
        "DecayingCountMin": DecayingCountMin(epoch_ms=None, seed=7, index_scheme=scheme),
        "ForgettingBloom": ForgettingBloom(capacity=1_000_000, fp_rate=0.01, seed=7, index_scheme=scheme),
    }


def operations(sk: dict, hb: list, hs_single: list, keys_single: list) -> dict:
    """name -> (function running one pass, events per pass)."""
    s, sp, r, c, b = (sk[k] for k in ("ScoreSketch", "SplitScoreSketch", "Rotator", "DecayingCountMin",
                                      "ForgettingBloom"))
    n = sum(len(x) for x in hb)
    ns = len(keys_single)

    def batches(fn):
        def run():
            for x in hb:
                fn(x)
        return run

    return {
        "ScoreSketch.update_many": (batches(lambda x: s.update_many(x, 0.01, 1_000)), n),
        "ScoreSketch.query_many": (batches(lambda x: s.query_many(x, 1_000)), n),
        "ScoreSketch.update (single)": (lambda: [s.update(k, 0.01, 1_000) for k in keys_single], ns),
        "ScoreSketch.query (single)": (lambda: [s.query(k, 1_000) for k in keys_single], ns),
        "SplitScoreSketch.update_many": (batches(lambda x: sp.update_many(x, 0.01, 1_000)), n),
        "SplitScoreSketch.query_many": (batches(lambda x: sp.query_many(x, 1_000)), n),
        "Rotator.update_many": (batches(lambda x: r.update_many(x, 0.01, 1_000)), n),
        "Rotator.query_many": (batches(lambda x: r.query_many(x, 1_000)), n),
        "DecayingCountMin.increment_many": (batches(c.increment_many), n),
        "DecayingCountMin.query_many": (batches(c.query_many), n),
        "DecayingCountMin.increment (single)": (lambda: [c.increment(k) for k in keys_single], ns),
        "DecayingCountMin.query (single)": (lambda: [c.query(k) for k in keys_single], ns),
        "ForgettingBloom.add_many": (batches(lambda x: b.add_many(x, now_ms=0)), n),
        "ForgettingBloom.contains_many": (batches(lambda x: b.contains_many(x, now_ms=0)), n),
        "ForgettingBloom.add_if_absent (single)": (lambda: [b.add_if_absent(k, now_ms=0) for k in keys_single], ns),
        "ForgettingBloom.contains (single)": (lambda: [b.contains(k, now_ms=0) for k in keys_single], ns),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--single", type=int, default=200_000, help="events of the single-call rows")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    w = Workload(args.events, args.keys)
    hb = [w.hashes[i:i + args.batch] for i in range(0, len(w.hashes), args.batch)]
    keys_single = w.shared_keys(args.single)
    print(f"workload: {args.events:,} events, Zipf s={w.s} over {args.keys:,} keys, batches of {args.batch:,}, "
          f"{args.single:,} single calls; median of {args.runs} interleaved rounds; "
          f"setup {time.perf_counter() - t0:.1f}s")
    sketches = {sc: build(sc) for sc in SCHEMES}
    ops = {sc: operations(sketches[sc], hb, None, keys_single) for sc in SCHEMES}
    for sc in SCHEMES:  # fill each sketch once (the timed passes then run on a filled sketch)
        for name, (fn, _) in ops[sc].items():
            if "update" in name or "increment" in name or "add" in name:
                fn()
    times: dict = {sc: {name: [] for name in ops[sc]} for sc in SCHEMES}
    for r in range(args.runs):
        order = SCHEMES if r % 2 == 0 else SCHEMES[::-1]
        for name in ops[SCHEMES[0]]:
            for sc in order:
                fn, n = ops[sc][name]
                t = time.perf_counter()
                fn()
                times[sc][name].append((time.perf_counter() - t) / n * 1e9)
        print(f"  round {r} done")
    res: dict = {"machine": machine(), "events": args.events, "keys": args.keys, "runs": args.runs,
                 "batch": args.batch, "single": args.single, "rows": {}}
    print(f"\n  {'operation':<42} {'independent':>12} {'km':>9}  ratio   (ns/event, median)")
    for name in ops[SCHEMES[0]]:
        a, k = median(times["independent"][name]), median(times["km"][name])
        res["rows"][name] = {"independent_ns": a, "km_ns": k, "ratio": a / k,
                             "independent_runs": times["independent"][name], "km_runs": times["km"][name]}
        print(f"  {name:<42} {a:12.2f} {k:9.2f}  {a / k:5.2f}")
    emit("bench_index_scheme", res)
    return res


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
