"""DecayingCountMin throughput, top-k accuracy and exact baselines.

    python benchmarks/bench_countmin.py [--events 10000000] [--keys 1000000] [--runs 5]
    python benchmarks/bench_countmin.py --vs-cltds [--cltds-src DIR] [--runs 7]

Workload: a Zipf(1.1) stream over --keys distinct 16-byte keys (fixed seed).
Every figure is the median of --runs runs; the last line is a JSON summary.
Run it against the installed package (not the source tree), on a quiet machine.

--vs-cltds: only the side-by-side of `query_many` on the pre-hashed ids against the
CL-TDS query loop (the Rust crate DecayingCountMin is modelled on), on the same ids in
the same run: builds benchmarks/cltds (cargo build --release), writes the ids there
(target/), fills the sketches with one increment per id (DecayingCountMin under each
index scheme, independent and km), then --runs rounds, each timing one pass of the
three (order rotating), after an untimed pass of each, in wall time and in the CPU time
of the thread running the loop (the harness reports both). Without
--cltds-src the harness times its re-implementation of the crate's loop (crates.io as
reachable here has no cl-tds); with --cltds-src DIR it builds against the crate's
source tree in DIR (a checkout of cl-tds 0.0.1).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from _workload import Workload, deep_size_of_keys, each, emit, machine, median, timed

from grudge_stream import DecayingCountMin


def chunks(seq, size):
    return [seq[i : i + size] for i in range(0, len(seq), size)]


CLTDS_DIR = Path(__file__).resolve().parent / "cltds"


def build_cltds(src: str | None) -> Path:
    """cargo build --release the harness (against the crate's source tree in src if
    given) and return the executable."""
    manifest = CLTDS_DIR / "Cargo.toml"
    if src is not None:
        gen = CLTDS_DIR / "target" / "with-crate"
        gen.mkdir(parents=True, exist_ok=True)
        manifest = gen / "Cargo.toml"
        manifest.write_text(
            "[package]\nname = \"cltds-bench\"\nversion = \"0.1.0\"\nedition = \"2021\"\n"
            "publish = false\n\n[workspace]\n\n[[bin]]\nname = \"cltds-bench\"\n"
            f"path = {json.dumps(str(CLTDS_DIR / 'src' / 'main.rs'))}\n\n"
            "[dependencies]\n"
            f"cl-tds = {{ path = {json.dumps(str(Path(src).resolve()))} }}\n\n"
            "[features]\ndefault = [\"crate\"]\ncrate = []\n\n"
            "[profile.release]\nopt-level = 3\n"
        )
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", str(manifest)], check=True
    )
    return manifest.parent / "target" / "release" / "cltds-bench"


def vs_cltds(args, w: Workload, hb, res: dict) -> None:
    exe = build_cltds(args.cltds_src)
    ids = CLTDS_DIR / "target" / f"ids-{args.events}-{args.keys}.u64"
    w.hashes.astype("<u8").tofile(ids)
    n = len(w.hashes)
    sketches = {}
    for scheme in ("independent", "km"):
        sketches[scheme] = DecayingCountMin(epoch_ms=None, index_scheme=scheme)
        each(sketches[scheme].increment_many, hb)  # one increment per id, as the harness fills its sketch

    def ours(scheme: str) -> tuple[float, float]:
        """(wall, thread CPU) rates of one timed pass."""
        sk = sketches[scheme]
        each(sk.query_many, hb)  # untimed pass
        gc.collect()
        c0, w0 = time.thread_time(), time.perf_counter()
        each(sk.query_many, hb)
        w, c = time.perf_counter() - w0, time.thread_time() - c0
        return n / w, n / c

    def theirs() -> tuple[float, float, dict]:
        p = subprocess.run(
            [str(exe), str(ids), "--runs", "1"], capture_output=True, text=True, check=True
        )
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("CLTDS ")][-1]
        info = json.loads(line[len("CLTDS ") :])
        return info["query_ids_per_s"][0], info["query_ids_per_cpu_s"][0], info

    # Rounds rotate the order of the three (independent, km, CL-TDS), so none always runs
    # first or last. Each pass is measured in wall time and in the CPU time of the thread
    # running the loop (on a loaded machine the wall time also counts time descheduled).
    names = ("independent", "km", "cltds")
    rates: dict[str, list[float]] = {x: [] for x in names}
    cpu: dict[str, list[float]] = {x: [] for x in names}
    info: dict = {}
    for r in range(args.runs):
        for name in names[r % 3:] + names[: r % 3]:
            if name == "cltds":
                a, b, info = theirs()
            else:
                a, b = ours(name)
            rates[name].append(a)
            cpu[name].append(b)
        print("  round %d: query_many independent %6.1f (%6.1f CPU), km %6.1f (%6.1f), CL-TDS query loop "
              "%6.1f (%6.1f) M ids/s" % (r, *(v / 1e6 for x in names for v in (rates[x][-1], cpu[x][-1]))))
    mi, mk, mb = (median(rates[x]) / 1e6 for x in names)
    ci, ck, cb = (median(cpu[x]) / 1e6 for x in names)
    print(f"  query_many, pre-hashed uint64, batches of {args.batch:,}, index_scheme=independent: "
          f"{mi:8.1f} M ids/s wall, {ci:8.1f} CPU (medians)")
    print(f"  query_many, same, index_scheme=km: {mk:8.1f} M ids/s wall, {ck:8.1f} CPU")
    print(f"  CL-TDS query loop, {info['impl']}: {mb:8.1f} M ids/s wall, {cb:8.1f} CPU")
    print(f"  ratio query_many / CL-TDS: independent {mi / mb:.2f} wall, {ci / cb:.2f} CPU; "
          f"km {mk / mb:.2f} wall, {ck / cb:.2f} CPU")
    res.update(
        query_prehashed_mev_s_runs=[x / 1e6 for x in rates["independent"]],
        query_prehashed_km_mev_s_runs=[x / 1e6 for x in rates["km"]],
        cltds_query_mev_s_runs=[x / 1e6 for x in rates["cltds"]],
        query_prehashed_cpu_mev_s_runs=[x / 1e6 for x in cpu["independent"]],
        query_prehashed_km_cpu_mev_s_runs=[x / 1e6 for x in cpu["km"]],
        cltds_query_cpu_mev_s_runs=[x / 1e6 for x in cpu["cltds"]],
        query_prehashed_mev_s=mi,
        query_prehashed_km_mev_s=mk,
        cltds_query_mev_s=mb,
        ratio=mi / mb,
        ratio_km=mk / mb,
        ratio_cpu=ci / cb,
        ratio_km_cpu=ck / cb,
        cltds_impl=info["impl"],
        cltds_increment_mev_s=info["increment_ids_per_s"] / 1e6,
    )


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=100_000, help="events per increment_many call")
    ap.add_argument(
        "--bytes-events", type=int, default=4_000_000, help="events for the bytes-key runs"
    )
    ap.add_argument("--baseline-distinct", type=int, nargs="*", default=[1_000_000, 10_000_000])
    ap.add_argument(
        "--vs-cltds",
        action="store_true",
        help="only query_many against the CL-TDS query loop (benchmarks/cltds)",
    )
    ap.add_argument(
        "--cltds-src",
        default=None,
        help="with --vs-cltds: build the harness against the cl-tds source tree in this directory",
    )
    args = ap.parse_args(argv)
    runs, n = args.runs, args.events
    t0 = time.perf_counter()
    w = Workload(n, args.keys)
    print(
        f"workload: {n:,} events, Zipf s={w.s} over {args.keys:,} keys ({w.distinct:,} seen), "
        f"16-byte keys, batches of {args.batch:,}; median of {runs} runs; setup {time.perf_counter() - t0:.1f}s"
    )
    res: dict = {
        "machine": machine(),
        "events": n,
        "keys": args.keys,
        "distinct_seen": w.distinct,
        "zipf_s": w.s,
        "runs": runs,
        "batch": args.batch,
    }
    hb = chunks(w.hashes, args.batch)
    if args.vs_cltds:
        vs_cltds(args, w, hb, res)
        emit("bench_countmin_vs_cltds", res)
        return res

    def rate(times, events):
        return events / median(times) / 1e6

    def row(name, mevs, extra=""):
        print(f"  {name:<48} {mevs:8.1f} M events/s  ({1e3 / mevs:6.2f} ns/event){extra}")

    # -- increment, pre-hashed -------------------------------------------------
    sk = DecayingCountMin(epoch_ms=None)
    t = timed(lambda: each(sk.increment_many, hb), runs)
    res["increment_prehashed_mev_s"] = rate(t, n)
    row("increment_many, pre-hashed uint64", res["increment_prehashed_mev_s"])

    # -- increment, pre-hashed, per-event timestamps (event-time epochs) --------
    ts = (np.arange(n, dtype=np.int64) * 60_000) // n  # 60 epochs of 1 s across the stream
    tb = chunks(ts, args.batch)
    sk_t = DecayingCountMin(epoch_ms=1000)
    t = timed(
        lambda: [sk_t.increment_many(c, now_ms=tt) for c, tt in zip(hb, tb)],
        runs,
        setup=lambda: sk_t.merge(DecayingCountMin(epoch_ms=1000)),
    )
    res["increment_prehashed_timestamps_mev_s"] = rate(t, n)
    row(
        "increment_many, pre-hashed + per-event now_ms", res["increment_prehashed_timestamps_mev_s"]
    )

    # -- query, pre-hashed --------------------------------------------------------
    t = timed(lambda: each(sk.query_many, hb), runs)
    res["query_prehashed_mev_s"] = rate(t, n)
    row("query_many, pre-hashed uint64", res["query_prehashed_mev_s"])

    # -- bytes keys (hashing included) ---------------------------------------------
    nb = min(args.bytes_events, n)
    fresh = chunks(w.fresh_keys(nb), args.batch)
    t = timed(lambda: each(sk.increment_many, fresh), runs)
    res["increment_bytes_fresh_mev_s"] = rate(t, nb)
    row("increment_many, bytes keys (one object per event)", res["increment_bytes_fresh_mev_s"])
    t = timed(lambda: each(sk.query_many, fresh), runs)
    res["query_bytes_fresh_mev_s"] = rate(t, nb)
    row("query_many, bytes keys (one object per event)", res["query_bytes_fresh_mev_s"])
    fresh = None
    shared = chunks(w.shared_keys(nb), args.batch)
    t = timed(lambda: each(sk.increment_many, shared), runs)
    res["increment_bytes_shared_mev_s"] = rate(t, nb)
    row("increment_many, bytes keys (shared key objects)", res["increment_bytes_shared_mev_s"])
    shared = None

    # -- single-key calls from Python -------------------------------------------------
    keys = w.universe[:1000] * 1000
    empty = timed(lambda: [None for _ in keys], runs)
    res["python_loop_ns"] = median(empty) / len(keys) * 1e9
    for label, sketch, call in (
        (
            "manual epochs",
            DecayingCountMin(epoch_ms=None),
            lambda s: [s.increment(k) for k in keys],
        ),
        (
            "now_ms=int",
            DecayingCountMin(epoch_ms=1000),
            lambda s: [s.increment(k, 1, 5_000) for k in keys],
        ),
        ("system clock", DecayingCountMin(epoch_ms=1000), lambda s: [s.increment(k) for k in keys]),
    ):
        t = timed(lambda call=call, sketch=sketch: call(sketch), runs)
        ns = median(t) / len(keys) * 1e9
        res[f"single_increment_ns_{label.split()[0].replace('=', '_')}"] = ns
        print(
            f"  single increment ({label:<13}) {ns:6.1f} ns/call incl. a {res['python_loop_ns']:.1f} ns "
            f"list-comprehension step"
        )
    sk1 = DecayingCountMin(epoch_ms=None)
    sk1.increment_many(w.hashes[:1_000_000])
    t = timed(lambda: [sk1.query(k) for k in keys], runs)
    res["single_query_ns"] = median(t) / len(keys) * 1e9
    print(f"  single query   (manual epochs) {res['single_query_ns']:6.1f} ns/call")

    # -- top-k -------------------------------------------------------------------------
    topk = DecayingCountMin(epoch_ms=None, top_k=100)
    t = timed(
        lambda: each(topk.increment_many, hb),
        runs,
        setup=lambda: topk.merge(DecayingCountMin(epoch_ms=None, top_k=100)),
    )
    res["increment_prehashed_topk100_mev_s"] = rate(t, n)
    res["topk100_cost_ns_per_event"] = (
        1e3 / res["increment_prehashed_topk100_mev_s"] - 1e3 / res["increment_prehashed_mev_s"]
    )
    row(
        "increment_many, pre-hashed, top_k=100",
        res["increment_prehashed_topk100_mev_s"],
        f"  top-k cost {res['topk100_cost_ns_per_event']:+.2f} ns/event",
    )
    acc = DecayingCountMin(epoch_ms=None, top_k=100)  # one pass: 10M events, 1M keys, 1 MiB
    for c in chunks(w.fresh_keys(n), args.batch):
        acc.increment_many(c)
    exact = np.bincount(w.ids, minlength=args.keys)
    true_top = set(np.argsort(-exact, kind="stable")[:100].tolist())
    got = [int.from_bytes(k[:8], "little") for k, _ in acc.top(100)]
    recall = len(true_top & set(got)) / 100
    tie = exact[np.argsort(-exact, kind="stable")[99]]
    recall_ties = sum(1 for g in got if exact[g] >= tie) / 100
    overest = np.mean([v / exact[g] - 1 for g, (_, v) in zip(got, acc.top(100))])
    res.update(
        top100_recall=recall,
        top100_recall_with_ties=recall_ties,
        top100_mean_overestimate=overest,
        cells_memory_bytes=acc.memory_bytes(),
    )
    print(
        f"  top(100) recall vs exact counts: {recall:.3f} (counting ties at rank 100: {recall_ties:.3f}); "
        f"mean overestimate {overest:.2%}; sketch {acc.memory_bytes():,} bytes"
    )

    # -- exact baselines ---------------------------------------------------------------------
    fresh_all = w.fresh_keys(nb)

    def count_exact():
        c = Counter()
        c.update(fresh_all)

    t = timed(count_exact, max(3, runs // 2))
    res["counter_update_mev_s"] = nb / median(t) / 1e6
    row("collections.Counter.update, bytes keys", res["counter_update_mev_s"])
    fresh_all = None
    for d in args.baseline_distinct:
        ks = [key_ for key_ in (i.to_bytes(8, "little") * 2 for i in range(d))]
        c = Counter(ks)
        mem = sys.getsizeof(c) + deep_size_of_keys(ks)
        res[f"counter_memory_bytes_{d}"] = mem
        print(
            f"  Counter with {d:>12,} distinct keys: {mem / 2**20:9.1f} MiB "
            f"(sketch: {DecayingCountMin().memory_bytes() / 2**20:.1f} MiB, fixed)"
        )
        del c, ks
    res["sketch_memory_bytes"] = DecayingCountMin().memory_bytes()
    res["targets"] = {
        "increment_prehashed_mev_s": 100,
        "increment_bytes_mev_s": 40,
        "query_prehashed_mev_s": 100,
        "single_increment_ns": 100,
        "top100_recall": 0.95,
        "increment_prehashed_topk100_mev_s": 50,
    }
    emit("bench_countmin", res)
    return res


if __name__ == "__main__":
    main()
