"""ScoreSketch throughput and memory, with an exact dict-of-floats baseline.

    python benchmarks/bench_score.py            # default run: a few minutes
    python benchmarks/bench_score.py --quick    # smaller, for a smoke test

Workload (the issue's): L=4, M=100,000, Exponential(0.01) decay, 1M distinct
16-byte keys drawn Zipf(1.1), timestamps advancing 1 ms per 1,000 events (a
1M events/s stream). Event keys are fresh bytes objects laid out in arrival
order, as a Kafka consumer deserializes them (not 1M shared objects visited at
random, which would benchmark cache misses on the harness's own key objects).

Single-key figures are per call from a Python loop (``for k, t in zip(...):
f(k, 0.5, t)``), loop included; the empty loop is printed for reference.
Batch figures are per event over calls of 10,000 events. Every figure is the
median of --runs runs (after one warm-up). Memory parts run in fresh
subprocesses so that RSS is not polluted by earlier parts. The last line is a
JSON summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would steal a core

import numpy as np

from grudge_stream import Exponential, ScoreSketch

L, M, LAMBDA, ZIPF_S, KEY_LEN = 4, 100_000, 0.01, 1.1, 16
BASE_MS = 1_700_000_000_000
BATCH = 10_000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def zipf_events(n_keys: int, n_events: int, rng: np.random.Generator) -> np.ndarray:
    cdf = np.cumsum(1.0 / np.arange(1, n_keys + 1, dtype=np.float64) ** ZIPF_S)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(n_events)), n_keys - 1)


def fresh_keys(rows: np.ndarray) -> list:
    blob = rows.tobytes()
    return [blob[i : i + KEY_LEN] for i in range(0, len(blob), KEY_LEN)]


def new_sketch() -> ScoreSketch:
    return ScoreSketch(
        levels=L, cells_per_level=M, decay=Exponential(LAMBDA), lo=0.0, hi=math.inf, seed=42
    )


def median_runs(fn, runs: int) -> tuple:
    fn()  # warm-up
    samples = []
    for _ in range(runs):
        gc.collect()
        samples.append(fn())
    return statistics.median(samples), samples


# ---- parts (each returns a dict) ----------------------------------------------------


def part_throughput(args) -> dict:
    rng = np.random.default_rng(20261129)
    pool = rng.integers(0, 256, size=(args.keys, KEY_LEN), dtype=np.uint8)
    ev = zipf_events(args.keys, args.events, rng)
    keys = fresh_keys(pool[ev])
    nows = [BASE_MS + i // 1000 for i in range(args.events)]
    nows_arr = np.array(nows, dtype=np.int64)
    n = args.events
    s = new_sketch()
    hashes = s.key_hashes(keys)
    out: dict = {
        "events": n,
        "distinct_keys": args.keys,
        "distinct_keys_seen": int(len(np.unique(ev))),
    }

    def timed(loop):
        def run():
            t = time.perf_counter()
            loop()
            return (time.perf_counter() - t) / n * 1e9

        return run

    def empty_loop():
        for _k, _t in zip(keys, nows):
            pass

    def upd_loop():
        f = s.update
        for k, t in zip(keys, nows):
            f(k, 0.5, t)

    def query_loop():
        f = s.query
        for k, t in zip(keys, nows):
            f(k, t)

    def try_loop():
        f = s.try_update
        for k, t in zip(keys, nows):
            f(k, 0.5, 100.0, t)

    def upd_kw_loop():
        f = s.update
        for k, t in zip(keys, nows):
            f(k, 0.5, now_ms=t)

    single = {}
    for name, loop in (
        ("python_loop_only", empty_loop),
        ("update", upd_loop),
        ("query", query_loop),
        ("try_update", try_loop),
        ("update_now_ms_keyword", upd_kw_loop),
    ):
        med, samples = median_runs(timed(loop), args.runs)
        single[name] = {"median_ns": round(med, 1), "runs_ns": [round(x, 1) for x in samples]}
        print(
            f"  single {name:<24} {med:7.1f} ns/call   runs {[round(x, 1) for x in samples]}",
            flush=True,
        )
    out["single_ns_per_call"] = single

    hb = [hashes[i : i + BATCH] for i in range(0, n, BATCH)]
    kb = [keys[i : i + BATCH] for i in range(0, n, BATCH)]
    tb = [nows_arr[i : i + BATCH] for i in range(0, n, BATCH)]

    def batch(method, src, with_delta):
        def loop():
            f = getattr(s, method)
            if with_delta:
                for ks, ts in zip(src, tb):
                    f(ks, 0.5, ts)
            else:
                for ks, ts in zip(src, tb):
                    f(ks, ts)

        return loop

    def try_batch(src):
        def loop():
            for ks, ts in zip(src, tb):
                s.try_update_many(ks, 0.5, 100.0, ts)

        return loop

    batches = {}
    for name, loop in (
        ("update_many_uint64", batch("update_many", hb, True)),
        ("query_many_uint64", batch("query_many", hb, False)),
        ("update_many_bytes", batch("update_many", kb, True)),
        ("query_many_bytes", batch("query_many", kb, False)),
        ("update_and_query_many_uint64", batch("update_and_query_many", hb, True)),
        ("try_update_many_uint64", try_batch(hb)),
        ("key_hashes_bytes", lambda: [s.key_hashes(ks) for ks in kb]),
    ):
        med, samples = median_runs(timed(loop), args.runs)
        batches[name] = {"median_ns": round(med, 1), "runs_ns": [round(x, 1) for x in samples]}
        print(
            f"  batch  {name:<28} {med:6.1f} ns/event  runs {[round(x, 1) for x in samples]}",
            flush=True,
        )
    out["batch_ns_per_event"] = batches

    from grudge_stream._cyext._score import _lock_cost

    locks = [_lock_cost(1_000_000) for _ in range(args.runs)]
    out["lock_ns"] = {k: round(statistics.median(d[k] for d in locks), 2) for k in locks[0]}
    print(f"  lock (uncontended acquire+release): {out['lock_ns']}", flush=True)
    return out


def part_rss(args) -> dict:
    """Sketch RSS after 10k and after N distinct keys; keys as uint8 rows, no Python objects."""
    rng = np.random.default_rng(7)
    s = new_sketch()
    formula = 16 * L * M + ScoreSketch.__basicsize__
    gc.collect()
    rss_empty = rss_bytes()
    fed, t = 0, BASE_MS
    checkpoints = {}
    for target in (10_000, args.rss_keys):
        while fed < target:
            n = min(100_000, target - fed)
            rows = np.frombuffer(rng.bytes(n * KEY_LEN), dtype=np.uint8).reshape(n, KEY_LEN)
            s.update_many(rows, 0.5, now_ms=t)
            fed += n
            t += 1
        del rows
        gc.collect()
        checkpoints[target] = rss_bytes()
    lo_k, hi_k = 10_000, args.rss_keys
    return {
        "memory_bytes": s.memory_bytes(),
        "memory_formula": "16 * levels * cells_per_level + ScoreSketch.__basicsize__",
        "memory_formula_value": formula,
        "memory_bytes_equals_formula": s.memory_bytes() == formula,
        "rss_after_construction": rss_empty,
        f"rss_after_{lo_k}_keys": checkpoints[lo_k],
        f"rss_after_{hi_k}_keys": checkpoints[hi_k],
        "rss_growth_bytes": checkpoints[hi_k] - checkpoints[lo_k],
    }


def part_dict(args) -> dict:
    """Exact baseline: key -> (decayed score, last_ms) in a dict; memory and throughput."""
    n_keys = args.dict_keys
    rng = np.random.default_rng(11)
    gc.collect()
    rss0 = rss_bytes()
    pool = rng.integers(0, 256, size=(n_keys, KEY_LEN), dtype=np.uint8)
    pool_bytes = pool.nbytes
    d: dict = {}
    blob = pool.tobytes()
    for i in range(0, len(blob), KEY_LEN):
        d[blob[i : i + KEY_LEN]] = (0.0, BASE_MS)
    gc.collect()
    mem = rss_bytes() - rss0 - len(blob) - pool_bytes  # exclude the harness's raw key buffers
    del blob
    ev = zipf_events(n_keys, args.dict_events, rng)
    keys = fresh_keys(pool[ev])
    nows = [BASE_MS + i // 1000 for i in range(len(keys))]
    lam, exp = LAMBDA, math.exp

    def run():
        t0 = time.perf_counter()
        get = d.get
        for k, t in zip(keys, nows):
            v = get(k)
            if v is None:
                d[k] = (0.5, t)
            else:
                s, last = v
                dt = t - last
                if dt > 0:
                    s = s * exp(-lam * (dt / 1000.0))
                d[k] = (s + 0.5, t)
        return (time.perf_counter() - t0) / len(keys) * 1e9

    med, samples = median_runs(run, args.runs)
    return {
        "keys": n_keys,
        "memory_bytes": mem,
        "bytes_per_key": round(mem / n_keys, 1),
        "update_median_ns": round(med, 1),
        "update_runs_ns": [round(x, 1) for x in samples],
    }


def subprocess_part(args, part: str, **extra) -> dict:
    cmd = [sys.executable, __file__, "--part", part, "--runs", str(args.runs)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rss-keys", type=int, default=10_000_000)
    ap.add_argument("--dict-keys", type=int, default=1_000_000)
    ap.add_argument("--dict-events", type=int, default=1_000_000)
    ap.add_argument("--part", choices=["throughput", "rss", "dict"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        fn = {"throughput": part_throughput, "rss": part_rss, "dict": part_dict}[args.part]
        print(json.dumps(fn(args)))
        return
    if args.quick:
        args.runs, args.events, args.keys, args.rss_keys, args.dict_events = (
            5,
            200_000,
            100_000,
            1_000_000,
            200_000,
        )

    import platform

    summary: dict = {
        "benchmark": "score_sketch",
        "config": {
            "levels": L,
            "cells_per_level": M,
            "decay": f"Exponential({LAMBDA})",
            "zipf_s": ZIPF_S,
            "key_bytes": KEY_LEN,
            "runs": args.runs,
            "statistic": "median",
        },
        "machine": {
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
    }
    print(
        f"ScoreSketch L={L} M={M} Exponential({LAMBDA}), {args.keys:,} Zipf({ZIPF_S}) keys, "
        f"{args.events:,} events, median of {args.runs}",
        flush=True,
    )
    summary["throughput"] = part_throughput(args)

    print("memory (fresh process):", flush=True)
    rss = subprocess_part(args, "rss", rss_keys=args.rss_keys)
    summary["memory"] = rss
    print(
        f"  memory_bytes() = {rss['memory_bytes']:,}  formula {rss['memory_formula']} = "
        f"{rss['memory_formula_value']:,}  equal: {rss['memory_bytes_equals_formula']}"
    )
    for k, v in rss.items():
        if k.startswith("rss_"):
            print(f"  {k:<28} {v:>14,} bytes")

    print("exact dict-of-floats baseline (fresh process each):", flush=True)
    summary["dict_baseline"] = []
    sizes = [args.keys, args.keys * 10]  # 1M and 10M distinct keys by default
    for n_keys in sizes:
        r = subprocess_part(args, "dict", dict_keys=n_keys, dict_events=args.dict_events)
        summary["dict_baseline"].append(r)
        mib = r["memory_bytes"] / 2**20
        print(
            f"  {n_keys:>11,} keys: {mib:9.1f} MiB ({r['bytes_per_key']} B/key), "
            f"update {r['update_median_ns']:.1f} ns/event   runs {r['update_runs_ns']}",
            flush=True,
        )

    t = summary["throughput"]
    targets = {
        "single_update_ns<=150": t["single_ns_per_call"]["update"]["median_ns"] <= 150,
        "single_query_ns<=150": t["single_ns_per_call"]["query"]["median_ns"] <= 150,
        "single_try_update_ns<=150": t["single_ns_per_call"]["try_update"]["median_ns"] <= 150,
        "update_many_uint64_ns<=30": t["batch_ns_per_event"]["update_many_uint64"]["median_ns"]
        <= 30,
        "query_many_uint64_ns<=30": t["batch_ns_per_event"]["query_many_uint64"]["median_ns"] <= 30,
        "update_many_bytes_ns<=50": t["batch_ns_per_event"]["update_many_bytes"]["median_ns"] <= 50,
        "query_many_bytes_ns<=50": t["batch_ns_per_event"]["query_many_bytes"]["median_ns"] <= 50,
        "memory_bytes_equals_formula": rss["memory_bytes_equals_formula"],
        "rss_flat_10k_to_max_keys(<1MiB)": rss["rss_growth_bytes"] < 2**20,
    }
    summary["targets_met"] = targets
    print("targets:", ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in targets.items()))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
