"""Peak memory of a worker catching up on a backlog, against the keys and the prefetch.

Produces two topics of N events (default 3M, bench_batch.py's generator, 8 partitions):
one over few keys (default 10,000), one over many (default N). Then, interleaved over
--runs rounds, starts `grudge-stream worker abuse_scores` (--runtime, default batch) on
each topic from the beginning, samples its VmHWM until /metrics counts every event, and
prints events/s and the peak RSS per topic: what the keys cost in memory, at the same
backlog. ``--set NAME=VALUE`` passes settings to the workers (e.g.
``kafka.queued.min.messages=200000 kafka.fetch.max.bytes=67108864
kafka.max.partition.fetch.bytes=8388608``: the prefetch before it was bounded).

Run: .venv/bin/python benchmarks/bench_rss.py [--events 3000000] [--few 10000] [--runs 2]
Needs KAFKA_BOOTSTRAP_SERVERS (e.g. from `python -m grudge_devkafka start`).
"""
from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from bench_batch import produce  # noqa: E402
from common import emit  # noqa: E402

from grudge_devkafka import free_port  # noqa: E402


def events_done(port: int) -> float:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(float(x) for x in re.findall(r'^grudge_events_total\{[^}]*\} ([0-9.e+]+)$', body, re.M))


def run_worker(bs: str, topic: str, n: int, runtime: str, sets: list[str]) -> tuple[float, float]:
    """(events/s, peak RSS MiB) of one worker reading ``topic`` from the start."""
    port, rid = free_port(), uuid.uuid4().hex[:6]
    cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", "abuse_scores", "--runtime", runtime,
           "--bootstrap-servers", bs, "--web-port", str(port), "--loglevel", "warning"]
    for k, v in {"source_topic": topic, "app_id": f"rss-{rid}", "alerts_topic": f"rss-{rid}-alerts",
                 "scores_topic": f"rss-{rid}-scores", "dead_letter_topic": f"rss-{rid}-dlq",
                 "snapshot_topic": f"rss-{rid}-snap", "operator_id": f"rss-{rid}"}.items():
        cmd += ["--set", f"{k}={v}"]
    for s in sets:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    env["GRUDGE_SEED"] = secrets.token_hex(16)
    proc = subprocess.Popen(cmd, env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, hwm = None, 0
    try:
        while True:
            done = events_done(port)
            if done and t0 is None:
                t0 = time.perf_counter()
            with open(f"/proc/{proc.pid}/status") as f:
                hwm = int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))
            if done >= n:
                return n / (time.perf_counter() - t0), hwm / 1024
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}")
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=3_000_000)
    ap.add_argument("--few", type=int, default=10_000, help="keys of the few-keys topic")
    ap.add_argument("--many", type=int, default=None, help="keys of the many-keys topic (default: --events)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--runtime", choices=["batch", "faust"], default="batch")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()
    bs = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bs:
        sys.exit("set KAFKA_BOOTSTRAP_SERVERS")
    n = args.events
    topics = {}
    for label, keys in (("few", args.few), ("many", args.many or n)):
        topics[label] = (f"rss-{uuid.uuid4().hex[:6]}-{label}", keys)
        produce(bs, topics[label][0], n, keys)
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in topics}
    for r in range(args.runs):
        for label, (topic, keys) in topics.items():
            rate, mib = run_worker(bs, topic, n, args.runtime, args.set)
            res[label].append((rate, mib))
            print(f"run {r + 1}/{args.runs} {label:4s} ({keys:>10,} keys): {rate:>11,.0f} events/s  "
                  f"peak RSS {mib:6.0f} MiB", flush=True)
    out = {}
    for label, rs in res.items():
        out[f"{label}_events_per_s"] = statistics.median(x for x, _ in rs)
        out[f"{label}_peak_rss_mib"] = statistics.median(y for _, y in rs)
        print(f"median {label}: {out[f'{label}_events_per_s']:,.0f} events/s, "
              f"peak RSS {out[f'{label}_peak_rss_mib']:.0f} MiB", flush=True)
    emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
