"""Where the abuse_scores worker's main thread spends its time (cProfile), per package.

Produces ``--records`` events (distinct keys, 8 partitions), runs the product's worker
under ``python -m cProfile`` (through grudge_timed_worker.py, which notes when the last
record was processed), stops it with SIGTERM once everything is processed, and prints the
profile's internal time grouped by package, then the top functions. Only the main thread
is profiled: aiokafka's consumer thread (record decoding) and the checkpoint executor
are not in it. Not a ``bench_*`` script (``make bench`` does not run it).

    .venv/bin/python benchmarks/profile_grudge_worker.py --drain agent --records 300000
    .venv/bin/python benchmarks/profile_grudge_worker.py --drain batch --records 1000000
"""
from __future__ import annotations

import argparse
import json
import pstats
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_faust import grudge_settings  # noqa: E402
from kafkabench import (Proc, broker, delete_topics, free_port, grudge_worker_cmd,  # noqa: E402
                        produce_events, python, scratch_dir)


def package_of(filename: str) -> str:
    if "site-packages/" in filename:
        return filename.split("site-packages/")[1].split("/")[0]
    if "/asyncio/" in filename:
        return "asyncio"
    if filename.startswith("~") or filename.startswith("<built-in"):
        return "builtins (epoll, C calls)"
    return filename.rsplit("/", 1)[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drain", default="agent")
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()

    prefix = f"benchprof-{uuid.uuid4().hex[:6]}"
    work = scratch_dir("bench-profile-")
    prof, timing = work / "worker.prof", work / "timing.json"
    with broker() as bs:
        try:
            topic = f"{prefix}-events"
            produce_events(bs, topic, partitions=8, records=args.records, keys=args.records)
            cli = grudge_worker_cmd("abuse_scores", bs, free_port(), grudge_settings(prefix, topic, args.drain))
            cmd = [python(), "-m", "cProfile", "-o", str(prof), str(Path(__file__).parent / "grudge_timed_worker.py"),
                   "--out", str(timing), "--expected", str(args.records), "--"] + cli[3:]
            p = Proc(cmd, work / "worker.log", work)
            deadline = time.monotonic() + max(300, args.records / 1000)
            while not timing.exists() and p.alive() and time.monotonic() < deadline:
                time.sleep(0.5)
            p.stop(120)
        finally:
            delete_topics(bs, prefix)
    if not timing.exists() or not prof.exists():
        print(f"worker did not finish; log:\n{p.log_tail()}")
        return 1
    t = json.loads(timing.read_text())
    secs = t["t_last"] - t["t_first"]
    print(f"drain={args.drain}: {t['events']:,} records in {secs:.2f} s under cProfile "
          f"({t['events'] / secs:,.0f} ev/s, {t['calls']} process calls); "
          f"process CPU {t['cpu_last'] - t['cpu_first']:.2f} s")
    st = pstats.Stats(str(prof))
    total = sum(v[2] for v in st.stats.values())
    by: dict[str, float] = {}
    for (fn, _line, _name), v in st.stats.items():
        by[package_of(fn)] = by.get(package_of(fn), 0.0) + v[2]
    print(f"main-thread internal time {total:.1f} s (whole run, start-up and shutdown included), by package:")
    for k, v in sorted(by.items(), key=lambda x: -x[1])[:12]:
        print(f"  {v:8.2f} s {100 * v / total:5.1f} %  {k}")
    st.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
