"""Worker RSS against key cardinality: exact Faust Table (b) vs grudge-stream's sketch (c).

For each distinct-key count in ``--keys`` an event topic is produced (8 partitions,
``max(--records, keys)`` records; record ``i`` carries key ``i mod keys`` of a shuffled
key list, so every key appears and, with fewer keys, repeatedly), then

- (b) the Faust Table worker (benchmarks/faust_baseline_worker.py ``--mode table``: one
  ``(score, last_ms)`` entry per key in the memory store, changelogged) and
- (c) ``grudge-stream worker abuse_scores`` (levels 4, cells_per_level 100000,
  checkpoint_interval_s 5, emit_scores crossings; once per ``--drains`` setting)

each read the whole topic once; when the last record has been processed the worker's
VmRSS (and its peak, VmHWM) is read from /proc/PID/status — by the worker itself for
(b), by this script for (c). Expected: (c) flat (8 partitions x 4 x 100,000 cells
whatever the key count), (b) growing with the keys.

    .venv/bin/python benchmarks/bench_faust_memory.py                         # 10k vs 300k keys
    .venv/bin/python benchmarks/bench_faust_memory.py --keys 10000,1000000    # the 1M comparison
    .venv/bin/python benchmarks/bench_faust_memory.py --keys 10000000 --variants c   # 10M, sketch only

The issue asks for 10k vs 10M keys; 10M records through a Faust agent take a long time
(tens of minutes for (c), far longer for (b)), hence the flag.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_faust import parse_drains, run_baseline, run_grudge  # noqa: E402
from common import emit  # noqa: E402
from kafkabench import broker, delete_topics, loadavg, produce_events  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="10000,300000", help="comma-separated distinct-key counts")
    ap.add_argument("--records", type=int, default=300_000,
                    help="records per topic (raised to the key count when smaller)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--variants", default="b,c")
    ap.add_argument("--drains", default="auto",
                    help="drain settings for (c): auto (every available), none, or e.g. agent,batch")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=None)
    args = ap.parse_args()

    key_counts = [int(k) for k in args.keys.split(",")]
    variants = [v.strip() for v in args.variants.split(",")]
    drains = parse_drains(args.drains)
    prefix = f"benchmem-{uuid.uuid4().hex[:6]}"
    rows = []
    la0 = loadavg()
    with broker() as bs:
        try:
            topics = {}
            for k in key_counts:
                n = max(args.records, k)
                topic = f"{prefix}-k{k}-events"
                print(f"# producing {n:,} records over {k:,} keys to {topic}", flush=True)
                info = produce_events(bs, topic, partitions=args.partitions, records=n, keys=k)
                print(f"#   {info['produce_seconds']} s", flush=True)
                topics[k] = (topic, n)
            for run in range(args.runs):
                for k in key_counts:
                    topic, n = topics[k]
                    timeout = args.timeout or max(300.0, n / 1000.0)
                    for v in variants:
                        for drain in (drains if v == "c" else [None]):
                            rid = f"{prefix}-r{run}k{k}{v}{drain or ''}"
                            if v == "b":
                                r = run_baseline("table", bs, topic, args.partitions, n, rid + "-app", timeout)
                                label = "b Faust Table"
                            elif v == "c":
                                r = run_grudge(bs, topic, n, rid, drain, timeout, 0.25)
                                label = f"c grudge drain={drain}" if drain else "c grudge"
                            else:
                                raise SystemExit(f"unknown variant {v!r}")
                            row = {"variant": label, "keys": k, "records": n, "run": run,
                                   "rss_mib": r["rss_kb"] / 1024, "hwm_mib": r["hwm_kb"] / 1024,
                                   "rate": r["rate"], "seconds": r["seconds"],
                                   "snapshots": r.get("snapshots"), "stalled_at": r.get("stalled_at")}
                            rows.append(row)
                            snap = "" if row["snapshots"] is None else f", {row['snapshots']} snapshots"
                            print(f"run {run + 1} {label:22s} keys {k:>11,} records {n:>11,}: "
                                  f"RSS {row['rss_mib']:7.0f} MiB (peak {row['hwm_mib']:.0f})  "
                                  f"{r['rate']:,.0f} ev/s over {r['seconds']:.1f} s{snap}  load {loadavg()[0]:.2f}",
                                  flush=True)
        finally:
            print(f"# deleted {delete_topics(bs, prefix)} topics {prefix}-*", flush=True)

    print()
    print(f"worker RSS at the end of the stream (median of {args.runs} run(s)); load average before {la0} "
          f"after {loadavg()}")
    print(f"{'variant':24s} " + " ".join(f"{f'{k:,} keys':>22s}" for k in key_counts))
    summary: dict = {}
    for label in dict.fromkeys(r["variant"] for r in rows):
        cells = []
        for k in key_counts:
            sel = [r for r in rows if r["variant"] == label and r["keys"] == k]
            rss = statistics.median(r["rss_mib"] for r in sel)
            hwm = statistics.median(r["hwm_mib"] for r in sel)
            summary.setdefault(label, {})[k] = {"rss_mib": round(rss, 1), "hwm_mib": round(hwm, 1),
                                                "records": sel[0]["records"]}
            cells.append(f"{rss:,.0f} MiB (peak {hwm:,.0f})")
        print(f"{label:24s} " + " ".join(f"{c:>22s}" for c in cells))
    if len(key_counts) >= 2:
        lo, hi = key_counts[0], key_counts[-1]
        for label, s in summary.items():
            print(f"{label}: RSS {s[hi]['rss_mib'] - s[lo]['rss_mib']:+,.0f} MiB from {lo:,} to {hi:,} keys")
    emit({"bench": "faust_memory", "keys": key_counts, "partitions": args.partitions, "runs": args.runs,
          "rss": {lab: {str(k): v for k, v in s.items()} for lab, s in summary.items()}, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
