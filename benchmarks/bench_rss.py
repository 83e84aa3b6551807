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
import json
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


def counter_sum(port: int, names: str) -> float:
    """The sum of every sample of the counters ``grudge_<names>_total`` (a regex alternative)."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(float(x) for x in re.findall(rf'^grudge_(?:{names})_total\{{[^}}]*\}} ([0-9.e+]+)$', body, re.M))


def events_done(port: int) -> float:
    # Processed or dead-lettered: every record counts once (heavy_global takes reports only).
    return counter_sum(port, "events|dead_letters")


def dead_letters(port: int) -> float:
    return counter_sum(port, "dead_letters")


def ready(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status == 200
    except OSError:
        return False


TOPOLOGIES = ("abuse_scores", "rate_limit", "heavy_hitters", "heavy_global", "dedup", "known_keys")


def topic_settings(topology: str) -> list[str]:
    """The ``*_topic`` settings of ``topology`` besides its source (each run gets topics of its own)."""
    out = subprocess.run([sys.executable, "-m", "grudge_stream.cli", "describe", topology, "--json"],
                         capture_output=True, text=True, check=True, cwd="/",
                         env={k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")})
    return [r["name"] for r in json.loads(out.stdout)["settings"]
            if r["name"].endswith("_topic") and r["name"] != "source_topic"]


def run_worker(bs: str, topic: str, n: int, runtime: str, sets: list[str],
               topology: str = "abuse_scores") -> tuple[float, float]:
    """(events/s, peak RSS MiB) of one worker reading ``topic`` from the start (``n`` = 0: the
    peak of a worker ready on an empty topic, events/s 0)."""
    port, rid = free_port(), uuid.uuid4().hex[:6]
    cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", topology, "--runtime", runtime,
           "--bootstrap-servers", bs, "--web-port", str(port), "--loglevel", "warning"]
    own = {name: f"rss-{rid}-{name[:-len('_topic')]}" for name in topic_settings(topology)}
    for k, v in {"source_topic": topic, "app_id": f"rss-{rid}", "operator_id": f"rss-{rid}", **own}.items():
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
            if n == 0 and ready(port):
                time.sleep(5)  # restored and polling: the idle peak
                with open(f"/proc/{proc.pid}/status") as f:
                    return 0.0, int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) / 1024
            if n and done >= n:
                if dead_letters(port) > n / 2:
                    raise RuntimeError(f"{topology} dead-lettered most of the traffic: not a sizing run")
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
    ap.add_argument("--sizing", action="store_true",
                    help="the sizing table instead: every shipped topology on both runtimes, on one topic of "
                         "--events events over --few keys, 8 partitions (docs/operations.md)")
    args = ap.parse_args()
    bs = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bs:
        sys.exit("set KAFKA_BOOTSTRAP_SERVERS")
    n = args.events
    if args.sizing:
        return sizing(bs, n, args.few, args.runs, args.set)
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


def produce_known_keys(bs: str, topic: str, n: int, keys: int) -> None:
    """``n`` known_keys records over ``keys`` keys: requests, one in ten a verdict "accepted"."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from bench_batch import PARTS

    admin = AdminClient({"bootstrap.servers": bs})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, PARTS, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bs, "linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4",
                  "queue.buffering.max.messages": 2_000_000})
    seen, accepted = b'{"event":"seen"}', b'{"event":"accepted"}'
    for i in range(n):
        k = (i * 7919) % keys
        while True:
            try:
                p.produce(topic, accepted if i % 10 == 9 else seen, b"key-%08d" % k, partition=k % PARTS)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)


def sizing(bs: str, n: int, keys: int, runs: int, sets: list[str]) -> int:
    """Peak RSS and events/s of every shipped topology on both runtimes (medians of ``runs``)."""
    topic, empty = f"rss-{uuid.uuid4().hex[:6]}-sizing", f"rss-{uuid.uuid4().hex[:6]}-empty"
    produce(bs, topic, n, keys)
    produce(bs, empty, 0, 1)
    # known_keys reads {"event": "seen"} requests and the backend's verdicts.
    seen = f"rss-{uuid.uuid4().hex[:6]}-seen"
    produce_known_keys(bs, seen, n, keys)
    out: dict = {}
    print(f"{n:,} events over {keys:,} keys, 8 partitions, one worker each; medians of {runs}")
    print(f"{'topology':14s} {'runtime':8s} {'events/s':>11s} {'s per 1M':>9s} {'peak RSS MiB':>13s}")
    for topology in TOPOLOGIES:
        for runtime in ("batch", "faust"):
            # heavy_global reads heavy_hitters' reports (a few records an interval): its idle peak.
            events = 0 if topology == "heavy_global" else n
            source = empty if events == 0 else seen if topology == "known_keys" else topic
            rs = [run_worker(bs, source, events, runtime, sets, topology) for _ in range(runs)]
            rate = statistics.median(r for r, _ in rs)
            mib = statistics.median(m for _, m in rs)
            out[f"{topology}_{runtime}_events_per_s"] = rate
            out[f"{topology}_{runtime}_peak_rss_mib"] = mib
            per_m = f"{1e6 / rate:>9.1f}" if rate else f"{'-':>9s}"
            print(f"{topology:14s} {runtime:8s} {rate:>11,.0f} {per_m} {mib:>13.0f}", flush=True)
    emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
