"""Update and query cost of every sketch under both index schemes, side by side in one run.

    python benchmarks/bench_index_scheme.py [--events 2000000] [--keys 1000000] [--runs 7]

Each sketch is built twice, ``index_scheme="independent"`` (the default) and ``"km"``
(Kirsch-Mitzenmacher, grudge-stream 0.2's), with the same seed, and fed the same
Workload (a Zipf(1.1) stream over --keys distinct 16-byte keys, pre-hashed) through its
batch paths (batches of --batch events) and through single calls (--single events, one
Python call each). Each scheme has two instances, built in the order independent, km,
km, independent (the first sketch built measured slower, whichever scheme), and its
figure is their mean. Each pass is timed after the sketches were filled once; within a
pass the four take turns chunk by chunk (a batch, or 1,000 single calls; the order
rotating), so load from other processes falls on all alike. The figure per
scheme is, for every chunk, the median of its time over the --runs passes, summed over
the chunks, per event (a pass descheduled in one chunk does not move it); beside it the
median of the passes' totals. Times are the CPU time of the timing thread (--clock
thread, the default: the loops run in it), or wall time (--clock wall). Ratio: independent / km (1.00: no cost; 1.10: 10 % slower).
The last line is a JSON summary.

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


def operations(hb: list, keys_single: list, single_chunk: int) -> dict:
    """name -> (op(sketches, chunk), chunks, events per pass): one pass runs op on every chunk."""
    ks = [keys_single[i:i + single_chunk] for i in range(0, len(keys_single), single_chunk)]
    n, ns = sum(len(x) for x in hb), len(keys_single)

    def each_key(fn):
        def run(sk, chunk):
            for k in chunk:
                fn(sk, k)
        return run

    return {
        "ScoreSketch.update_many": (lambda s, x: s["ScoreSketch"].update_many(x, 0.01, 1_000), hb, n),
        "ScoreSketch.query_many": (lambda s, x: s["ScoreSketch"].query_many(x, 1_000), hb, n),
        "ScoreSketch.update (single)": (each_key(lambda s, k: s["ScoreSketch"].update(k, 0.01, 1_000)), ks, ns),
        "ScoreSketch.query (single)": (each_key(lambda s, k: s["ScoreSketch"].query(k, 1_000)), ks, ns),
        "SplitScoreSketch.update_many": (lambda s, x: s["SplitScoreSketch"].update_many(x, 0.01, 1_000), hb, n),
        "SplitScoreSketch.query_many": (lambda s, x: s["SplitScoreSketch"].query_many(x, 1_000), hb, n),
        "Rotator.update_many": (lambda s, x: s["Rotator"].update_many(x, 0.01, 1_000), hb, n),
        "Rotator.query_many": (lambda s, x: s["Rotator"].query_many(x, 1_000), hb, n),
        "DecayingCountMin.increment_many": (lambda s, x: s["DecayingCountMin"].increment_many(x), hb, n),
        "DecayingCountMin.query_many": (lambda s, x: s["DecayingCountMin"].query_many(x), hb, n),
        "DecayingCountMin.increment (single)": (each_key(lambda s, k: s["DecayingCountMin"].increment(k)), ks, ns),
        "DecayingCountMin.query (single)": (each_key(lambda s, k: s["DecayingCountMin"].query(k)), ks, ns),
        "ForgettingBloom.add_many": (lambda s, x: s["ForgettingBloom"].add_many(x, now_ms=0), hb, n),
        "ForgettingBloom.contains_many": (lambda s, x: s["ForgettingBloom"].contains_many(x, now_ms=0), hb, n),
        "ForgettingBloom.add_if_absent (single)":
            (each_key(lambda s, k: s["ForgettingBloom"].add_if_absent(k, now_ms=0)), ks, ns),
        "ForgettingBloom.contains (single)":
            (each_key(lambda s, k: s["ForgettingBloom"].contains(k, now_ms=0)), ks, ns),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--single", type=int, default=200_000, help="events of the single-call rows")
    ap.add_argument("--clock", choices=("thread", "wall"), default="thread",
                    help="thread: CPU time of the timing thread (default); wall: perf_counter")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    w = Workload(args.events, args.keys)
    hb = [w.hashes[i:i + args.batch] for i in range(0, len(w.hashes), args.batch)]
    keys_single = w.shared_keys(args.single)
    print(f"workload: {args.events:,} events, Zipf s={w.s} over {args.keys:,} keys, batches of {args.batch:,}, "
          f"{args.single:,} single calls; median of {args.runs} interleaved rounds, {args.clock} clock; "
          f"setup {time.perf_counter() - t0:.1f}s")
    # Two instances per scheme, built in the order independent, km, km, independent: the
    # sketch built first measured some 5 % slower than one built after it (where its
    # memory landed), whichever scheme it held; each scheme's figure is the mean of its two.
    builds = [("independent", 0), ("km", 0), ("km", 1), ("independent", 1)]
    sketches = {b: build(b[0]) for b in builds}
    ops = operations(hb, keys_single, 1_000)
    for b in builds:  # fill each sketch once (the timed passes then run on a filled sketch)
        for name, (op, chunks, _) in ops.items():
            if "update" in name or "increment" in name or "add" in name:
                for c in chunks:
                    op(sketches[b], c)
    # Within a pass the four take turns chunk by chunk (one batch, or 1,000 single calls;
    # the order rotating), so a burst of load on this shared machine falls on all alike.
    times: dict = {b: {name: np.zeros((args.runs, len(ops[name][1]))) for name in ops} for b in builds}
    # CPU time of this thread (the batch loops run in it, without the GIL): time the thread
    # spent descheduled by other processes is not counted.
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    for r in range(args.runs):
        for name, (op, chunks, n) in ops.items():
            for i, c in enumerate(chunks):
                k = (i + r) % 4
                for b in builds[k:] + builds[:k]:
                    sk = sketches[b]
                    t = clock()
                    op(sk, c)
                    times[b][name][r, i] = clock() - t
        print(f"  round {r} done")
    for b in builds[:2]:  # per scheme: the mean of its two instances
        for name in ops:
            times[b][name] = (times[b][name] + times[(b[0], 1)][name]) / 2
    times = {sc: times[(sc, 0)] for sc in SCHEMES}
    res: dict = {"machine": machine(), "events": args.events, "keys": args.keys, "runs": args.runs,
                 "batch": args.batch, "single": args.single, "rows": {}}
    print(f"\n  {'operation':<42} {'independent':>12} {'km':>9}  ratio   (ns/event: per chunk the median "
          f"over the rounds, summed; then the median of the round totals)")
    for name, (_, _, n) in ops.items():
        chunked = {sc: float(np.median(times[sc][name], axis=0).sum()) / n * 1e9 for sc in SCHEMES}
        totals = {sc: [float(x) / n * 1e9 for x in times[sc][name].sum(axis=1)] for sc in SCHEMES}
        a, k = chunked["independent"], chunked["km"]
        ta, tk = median(totals["independent"]), median(totals["km"])
        res["rows"][name] = {"independent_ns": a, "km_ns": k, "ratio": a / k,
                             "independent_round_ns": totals["independent"], "km_round_ns": totals["km"],
                             "round_median_ratio": ta / tk}
        print(f"  {name:<42} {a:12.2f} {k:9.2f}  {a / k:5.2f}   (rounds: {ta:8.2f} {tk:8.2f}  {ta / tk:5.2f})")
    emit("bench_index_scheme", res)
    return res


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
