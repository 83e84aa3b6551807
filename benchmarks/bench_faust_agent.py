"""What grudge-stream state costs inside a Faust agent, against a Faust Table increment.

One event topic (JSON ``{"outcome": ...}`` keyed by client id, 10% ``bad``) is produced
once; then three agents of the same plain faust-streaming app (benchmarks/
faust_baseline_worker.py, ``kafka://`` driver, memory store, raw serializers) read it from
the beginning under fresh app ids, interleaved run by run:

- ``bare``: the agent only counts its events (``--mode count``);
- ``table incr``: the agent does ``counts[key] += 1`` in a changelogged Faust Table
  (``--mode incr``);
- ``grudge state``: the agent does ``abuse.update(key, delta)`` on a ``ScoreState``
  attached with ``grudge_stream.faust.scores`` (levels 4, 100,000 cells per level,
  snapshots every 5 s; ``--mode state``).

Per run: the worker process's CPU time (all threads) from its first event to its last,
per event. What each adds to the bare agent is its cost; its share is that cost over the
agent's whole per-event CPU. Medians of the runs.

    .venv/bin/python benchmarks/bench_faust_agent.py                 # 200k records, 10k keys, 3 runs
    .venv/bin/python benchmarks/bench_faust_agent.py --records 500000 --runs 5

Uses $KAFKA_BOOTSTRAP_SERVERS, else starts a local broker for the run; topics it creates
are named ``bench-<id>-...`` and deleted at the end.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_faust import run_baseline  # noqa: E402
from common import emit  # noqa: E402
from kafkabench import broker, delete_topics, loadavg, produce_events  # noqa: E402

VARIANTS = [("bare", "count"), ("table incr", "incr"), ("grudge state", "state")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=None, help="per worker run (default from --records)")
    args = ap.parse_args()
    timeout = args.timeout or max(300.0, args.records / 1000.0)
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    results: dict[str, list[dict]] = {label: [] for label, _ in VARIANTS}
    with broker() as bs:
        topic = f"{prefix}-events"
        print(f"# broker {bs}; producing {args.records:,} records over {args.keys:,} keys to {topic} "
              f"({args.partitions} partitions)", flush=True)
        produce_events(bs, topic, partitions=args.partitions, records=args.records, keys=args.keys)
        try:
            for run in range(args.runs):
                for label, mode in VARIANTS:
                    la = loadavg()
                    r = run_baseline(mode, bs, topic, args.partitions, args.records,
                                     f"{prefix}-r{run}{mode}", timeout)
                    r["us_per_event"] = 1e6 * r["cpu_s"] / r["cpu_events"]
                    results[label].append(r)
                    stalled = f"  STALLED after {r['stalled_at']:,}" if r.get("stalled_at") else ""
                    print(f"run {run + 1}/{args.runs} {label:14s} {r['us_per_event']:6.2f} CPU-us/event  "
                          f"{r['rate']:>9,.0f} ev/s  load {la[0]:.2f}{stalled}", flush=True)
        finally:
            delete_topics(bs, prefix)

    med = {label: statistics.median(r["us_per_event"] for r in rs) for label, rs in results.items()}
    bare = med["bare"]
    print(f"\nmedians of {args.runs} runs, {args.records:,} events over {args.keys:,} keys "
          "(CPU-us per event of the worker process, all threads):")
    summary = {"records": args.records, "keys": args.keys, "runs": args.runs, "us_per_event": med}
    for label, _ in VARIANTS:
        us = med[label]
        added = us - bare
        line = f"  {label:14s} {us:6.2f}"
        if label != "bare":
            line += f"   adds {added:5.2f} to the bare agent: {100 * added / us:4.1f}% of the agent's CPU"
            summary[f"{label} adds"] = added
            summary[f"{label} share"] = added / us
        print(line)
    ratio = (med["grudge state"] - bare) / (med["table incr"] - bare) if med["table incr"] > bare else None
    if ratio is not None:
        print(f"  the state costs {ratio:.2f}x what the Table increment costs")
    summary["state_over_table"] = ratio
    emit(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
