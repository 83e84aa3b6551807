"""Live score query latency on two batch workers, local and forwarded, under load and idle.

Produces N events (default 3M) over K clients (default 100k, the bench_batch.py traffic:
every 5000th client abusive, 2% background bad) into an 8-partition topic, each keyed
client on its murmur2 partition (what a Java / confluent-kafka ``murmur2_random`` producer
does). Then starts two `grudge-stream worker abuse_scores --runtime batch` on that backlog
and, while they chew through it (the "load" phase: their summed events/s is printed) and
again once they caught up ("idle"), asks worker A, one request at a time:

  local      GET /v1/score?key=K for a key of a partition A holds
  forwarded  the same for a key of a partition B holds (A forwards once to B)

and prints p50 / p99 / max latency per phase and kind (plus a JSON line).

Run: .venv/bin/python benchmarks/bench_query.py [--events 3000000] [--keys 100000] [--queries 400]
Needs KAFKA_BOOTSTRAP_SERVERS (e.g. from `python -m grudge_devkafka start`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_batch import PARTS, produce  # noqa: E402
from common import emit  # noqa: E402

from grudge_devkafka import free_port  # noqa: E402
from grudge_stream.serving import partition_for  # noqa: E402

BENCH_KEY = "2b7e151628aed2a6abf7158809cf4f3c"  # a fixed benchmark key (not a secret)


def get_json(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def events_total(port: int) -> float:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(float(x) for x in re.findall(r'^grudge_events_total\{[^}]*\} ([0-9.e+]+)$', body, re.M))


def start_worker(bs: str, topic: str, run: str, workdir: str, i: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    sets = {"source_topic": topic, "app_name": f"bq-{run}", "operator_id": f"bq-{run}",
            "alerts_topic": f"bq-{run}-alerts", "scores_topic": f"bq-{run}-scores",
            "dead_letter_topic": f"bq-{run}-dlq", "snapshot_topic": f"bq-{run}-snap", "seed": BENCH_KEY,
            "checkpoint_interval_s": "5"}
    # This interpreter and its sys.path (PYTHONPATH=. runs the working tree's code).
    cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", "abuse_scores", "--bootstrap-servers", bs,
           "--web-port", str(port), "--runtime", "batch", "--loglevel", "warning"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    log = open(os.path.join(workdir, f"worker-{i}.log"), "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(x) for x in env["PYTHONPATH"].split(os.pathsep))
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env), port


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def measure(port: int, local: list[bytes], forwarded: list[bytes], n: int,
            stop=None) -> dict[str, list[float]]:
    """n queries of each kind, interleaved, or fewer once ``stop()`` (checked every 20);
    latencies in ms (only 200 answers from the expected path counted)."""
    out: dict[str, list[float]] = {"local": [], "forwarded": [], "errors": []}
    for i in range(n):
        if stop is not None and i % 20 == 0 and i and stop():
            break
        for kind, keys in (("local", local), ("forwarded", forwarded)):
            key = keys[i % len(keys)]
            url = f"http://127.0.0.1:{port}/v1/score?" + urllib.parse.urlencode({"key": key.decode()})
            t0 = time.perf_counter()
            status, doc = get_json(url)
            dt = (time.perf_counter() - t0) * 1000
            if status == 200 and ("forwarded_by" in doc) == (kind == "forwarded"):
                out[kind].append(dt)
            else:
                out["errors"].append(dt)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=3_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=400, help="queries of each kind per phase")
    args = ap.parse_args()
    bs = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bs:
        sys.exit("set KAFKA_BOOTSTRAP_SERVERS (python -m grudge_devkafka start)")
    run = uuid.uuid4().hex[:8]
    topic = f"bench-query-{run}"
    t0 = time.time()
    # bench_batch.py's traffic, each client on its murmur2 partition (a Java producer's choice).
    names = produce(bs, topic, args.events, args.keys, partition_of=lambda k: partition_for(k, PARTS, "murmur2"))
    print(f"produced {args.events:,} events over {args.keys:,} keys in {time.time() - t0:.1f}s", flush=True)
    workdir = tempfile.mkdtemp(prefix="bench-query-")
    procs = [start_worker(bs, topic, run, workdir, i) for i in range(2)]
    try:
        ports = [port for _, port in procs]
        deadline = time.monotonic() + 120
        while True:
            rd = [get_json(f"http://127.0.0.1:{p}/ready")[1] if _up(p) else {} for p in ports]
            held = [set(r.get("restored", [])) for r in rd]
            if all(r.get("ready") for r in rd) and all(held) and set().union(*held) == set(range(PARTS)):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready: {rd}; logs in {workdir}")
            time.sleep(0.2)
        local = [k for k in names if partition_for(k, PARTS) in held[0]][:1000]
        forwarded = [k for k in names if partition_for(k, PARTS) in held[1]][:1000]
        # The directory lists worker B once its first record is read back: wait for a forward.
        while get_json(f"http://127.0.0.1:{ports[0]}/v1/score?key={forwarded[0].decode()}")[0] != 200:
            time.sleep(0.1)
        phases = {}
        ev0, t_ev0 = sum(events_total(p) for p in ports), time.perf_counter()
        # Under load: only while the workers still have backlog.
        phases["load"] = measure(ports[0], local, forwarded, args.queries,
                                 stop=lambda: sum(events_total(p) for p in ports) >= args.events)
        ev1, t_ev1 = sum(events_total(p) for p in ports), time.perf_counter()
        load_rate = (ev1 - ev0) / (t_ev1 - t_ev0)
        caught_up = ev1 >= args.events
        while sum(events_total(p) for p in ports) < args.events:
            time.sleep(0.5)
        phases["idle"] = measure(ports[0], local, forwarded, args.queries)
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"\nload phase: the two workers processed {load_rate:,.0f} events/s while queried"
          + (" (they caught up during it: a lower bound)" if caught_up else "")
          + f" (load avg {os.getloadavg()[0]:.2f})")
    print(f"\n{'phase':6s} {'kind':10s} {'n':>5s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'errors':>7s}")
    summary: dict = {"events": args.events, "keys": args.keys, "partitions": PARTS, "load_events_per_s": load_rate}
    for phase, res in phases.items():
        for kind in ("local", "forwarded"):
            xs = res[kind]
            print(f"{phase:6s} {kind:10s} {len(xs):>5d} {pct(xs, 50):>8.2f} {pct(xs, 99):>8.2f} "
                  f"{max(xs, default=float('nan')):>8.2f} {len(res['errors']):>7d}")
            summary[f"{phase}_{kind}_p50_ms"] = pct(xs, 50)
            summary[f"{phase}_{kind}_p99_ms"] = pct(xs, 99)
        summary[f"{phase}_errors"] = len(res["errors"])
    emit(summary)


def _up(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=1).read()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
