"""Live score query latency: in-process per key, and over HTTP on two batch workers, under
load and idle.

In-process (no broker): one abuse_scores operator at its default size (split mode, 4 x 100k
cells a half) fed ``--inproc-events`` events, then ``describe_key`` timed per key, beside the
previous release's read (a copy of both cell tables per key, the decay applied in Python:
reimplemented here as ``copy_read`` so both run in one process on the same state).

Over HTTP: produces N events (default 1M) over K clients (default 100k, the bench_batch.py
traffic: every 5000th client abusive, 2% background bad) into an 8-partition topic, each keyed
client on its murmur2 partition. Then starts two `grudge-stream worker abuse_scores --runtime
batch` (bearer tokens on, query budget off) on that backlog and, while they chew through it
(the "load" phase: their summed events/s is printed) and again once they caught up ("idle"),
asks worker A, one request at a time:

  local      GET /v1/score?key=K for a key of a partition A holds
  forwarded  the same for a key of a partition B holds (A forwards once to B)
  1000 keys  POST /v1/scores with 1000 keys, half of them forwarded

and prints p50 / p99 / max latency per phase and kind (plus a JSON line), and the share of the
load phase the two consume loops waited for queries in flight (``query_priority_share``).

With ``--baseline-python`` (a previous release's interpreter, e.g. a venv with it installed),
two workers of that release then answer the same queries on the same backlog (in a group of
their own, with only the settings it knows: no tokens before 0.2), and both are printed in
one table.

Run: .venv/bin/python benchmarks/bench_query.py [--events 1000000] [--keys 100000] [--queries 200]
     [--baseline-python <previous venv>/bin/python] [--set query_priority_share=0 ...]
     .venv/bin/python benchmarks/bench_query.py --in-process-only
Needs KAFKA_BOOTSTRAP_SERVERS (e.g. from `python -m grudge_devkafka start`) unless --in-process-only.
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
BENCH_TOKEN = "bench-worker-token-0123456789abcdef"  # likewise


def copy_read(sketch, key: bytes, now_ms: int) -> float:
    """The previous release's live read of a split-sign sketch: both cell tables copied
    (``_cells()``), the key's cells decayed in Python; the score only."""
    import math

    from grudge_stream._cyext._score import DECAY_EXPONENTIAL

    def half(sk) -> float:
        cfg = sk.config
        # The key's cell per level, from the sketch's own index scheme (levels are
        # independent now; a read of about a microsecond beside the copies it times).
        index = sk.query_detailed(key, now_ms).cell_indexes
        cells = sk._cells()
        code, param = cfg.decay._code, cfg.decay._param
        vals = []
        for i in range(cfg.levels):
            j = index[i]
            v, last = float(cells["score"][i, j]), int(cells["last_ms"][i, j])
            if now_ms > last and v != 0.0 and code == DECAY_EXPONENTIAL:
                v = v * math.exp(-param * (float(now_ms - last) / 1000.0))
            vals.append(v)
        return min(vals)
    return min(sketch.hi, max(sketch.lo, half(sketch.pos) - half(sketch.neg)))


def in_process(events: int, n: int) -> dict:
    """Per-key latency of describe_key and of the previous copy read, on one default-size operator."""
    from grudge_stream.operators.records import SourceRecord
    from grudge_stream.topology import Settings, load_topology

    topo = load_topology("abuse_scores", Settings({"seed": BENCH_KEY}, environ={}))
    op = topo.make_operator(0)
    rng = np.random.default_rng(1)
    t0 = 1_700_000_000_000
    ids = rng.integers(0, 100_000, size=events)
    bad = rng.random(events) < 0.05
    recs = [SourceRecord(topo.source_topic, 0, i, t0 + i, b"client-%08d" % ids[i],
                         b'{"outcome":"bad"}' if bad[i] else b'{"outcome":"good"}') for i in range(events)]
    for i in range(0, events, 5000):
        op.process(recs[i:i + 5000])
    keys = [b"client-%08d" % i for i in rng.integers(0, 100_000, size=n)]
    wm = op.watermark
    out = {}
    for name, fn, reps in (("describe_key", lambda k: op.describe_key(k), n),
                           ("previous copy read", lambda k: copy_read(op.sketch, k, wm), min(n, 200))):
        lat = []
        for k in keys[:reps]:
            t = time.perf_counter()
            fn(k)
            lat.append((time.perf_counter() - t) * 1e6)
        out[name] = lat
    same = all(op.describe_key(k)["score"] == copy_read(op.sketch, k, wm) for k in keys[:50])
    print(f"\nin-process, one abuse_scores operator ({op.sketch.levels} x {op.sketch.cells_per_level:,} cells "
          f"a half, {events:,} events); same scores: {same}")
    print(f"{'read':20s} {'n':>6s} {'p50 us':>9s} {'p99 us':>9s}")
    summary = {"inproc_same_scores": same}
    for name, lat in out.items():
        print(f"{name:20s} {len(lat):>6d} {pct(lat, 50):>9.2f} {pct(lat, 99):>9.2f}")
        tag = "new" if name == "describe_key" else "previous"
        summary[f"inproc_{tag}_p50_us"] = pct(lat, 50)
        summary[f"inproc_{tag}_p99_us"] = pct(lat, 99)
    return summary


def get_json(url: str, timeout: float = 5.0, body: bytes | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Authorization": f"Bearer {BENCH_TOKEN}",
                                                         "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def metric_total(port: int, name: str) -> float:
    """The sum of a worker's ``name`` series (0 when it has none: a release without it)."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(float(x) for x in re.findall(rf'^{name}(?:\{{[^}}]*\}})? ([0-9.e+]+)$', body, re.M))


def events_total(port: int) -> float:
    return metric_total(port, "grudge_events_total")


PAUSED = "grudge_query_priority_paused_seconds_total"


def known_settings(python: str) -> set[str]:
    """The abuse_scores settings the grudge-stream installed for ``python`` knows."""
    out = subprocess.run([python, "-m", "grudge_stream.cli", "describe", "abuse_scores", "--json"],
                         capture_output=True, check=True, cwd="/", env={k: v for k, v in os.environ.items()
                                                                       if not k.startswith("GRUDGE_")})
    return {r["name"] for r in json.loads(out.stdout)["settings"]}


def start_worker(bs: str, topic: str, run: str, workdir: str, i: int,
                 python: str = sys.executable, extra: dict | None = None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    tokens = os.path.join(workdir, "tokens")
    with open(tokens, "w") as f:
        f.write(f"worker:{BENCH_TOKEN}\n")
    sets = {"source_topic": topic, "app_name": f"bq-{run}", "operator_id": f"bq-{run}",
            "alerts_topic": f"bq-{run}-alerts", "scores_topic": f"bq-{run}-scores",
            "dead_letter_topic": f"bq-{run}-dlq", "snapshot_topic": f"bq-{run}-snap", "seed": BENCH_KEY,
            "checkpoint_interval_s": "5", "query_token_file": tokens, "query_rate_per_s": "0", **(extra or {})}
    if python != sys.executable:  # a previous release: only the settings it knows (no tokens before 0.2)
        known = known_settings(python)
        sets = {k: v for k, v in sets.items() if k in known or k in ("seed", "app_name")}
    # This interpreter and its sys.path (PYTHONPATH=. runs the working tree's code).
    cmd = [python, "-m", "grudge_stream.cli", "worker", "abuse_scores", "--bootstrap-servers", bs,
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
    """n single-key queries of each kind and n // 10 requests of 1000 keys, interleaved, or
    fewer once ``stop()`` (checked every 20); latencies in ms (only 200 answers from the
    expected path counted)."""
    out: dict[str, list[float]] = {"local": [], "forwarded": [], "1000 keys": [], "errors": []}
    half = len(local) // 2
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
        if i % 10 == 0:
            batch = [k.decode() for k in local[:half] + forwarded[:half]]
            t0 = time.perf_counter()
            status, doc = get_json(f"http://127.0.0.1:{port}/v1/scores", body=json.dumps(batch).encode())
            dt = (time.perf_counter() - t0) * 1000
            ok = status == 200 and not any(r.get("error") for r in doc.get("results", [{"error": 1}]))
            out["1000 keys" if ok else "errors"].append(dt)
    return out


def http_phases(bs: str, topic: str, run: str, names: list[bytes], python: str,
                args: argparse.Namespace) -> tuple[dict, float, bool, float]:
    """Two workers of ``python``'s grudge-stream (a group of their own) on the backlog of
    ``topic``: the queries while they chew through it, then once they caught up."""
    workdir = tempfile.mkdtemp(prefix="bench-query-")
    extra = dict(kv.split("=", 1) for kv in args.set)
    procs = [start_worker(bs, topic, run, workdir, i, python, extra) for i in range(2)]
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
        paused0 = sum(metric_total(p, PAUSED) for p in ports)
        ev0, t_ev0 = sum(events_total(p) for p in ports), time.perf_counter()
        # Under load: only while the workers still have backlog.
        phases["load"] = measure(ports[0], local, forwarded, args.queries,
                                 stop=lambda: sum(events_total(p) for p in ports) >= args.events)
        ev1, t_ev1 = sum(events_total(p) for p in ports), time.perf_counter()
        load_rate = (ev1 - ev0) / (t_ev1 - t_ev0)
        # The share of the load phase the two consume loops waited for queries in flight.
        paused = (sum(metric_total(p, PAUSED) for p in ports) - paused0) / (2 * (t_ev1 - t_ev0))
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
    return phases, load_rate, caught_up, paused


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200, help="single-key queries of each kind per phase")
    ap.add_argument("--inproc-events", type=int, default=200_000)
    ap.add_argument("--inproc-keys", type=int, default=5_000)
    ap.add_argument("--in-process-only", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a worker setting for both releases' workers (repeatable)")
    ap.add_argument("--baseline-first", action="store_true",
                    help="run the previous release's workers first (the pair that runs first, right after "
                         "the backlog is produced, has the longer tail: alternate the order between runs)")
    ap.add_argument("--baseline-python", default=None,
                    help="a previous release's interpreter: its two workers answer the same queries on the "
                         "same backlog after this release's, for a side-by-side table")
    args = ap.parse_args()
    inproc = in_process(args.inproc_events, args.inproc_keys)
    if args.in_process_only:
        emit(inproc)
        return
    bs = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bs:
        sys.exit("set KAFKA_BOOTSTRAP_SERVERS (python -m grudge_devkafka start)")
    run = uuid.uuid4().hex[:8]
    topic = f"bench-query-{run}"
    t0 = time.time()
    # bench_batch.py's traffic, each client on its murmur2 partition (a Java producer's choice).
    names = produce(bs, topic, args.events, args.keys, partition_of=lambda k: partition_for(k, PARTS, "murmur2"))
    print(f"produced {args.events:,} events over {args.keys:,} keys in {time.time() - t0:.1f}s", flush=True)
    releases = [("this", sys.executable)] + ([("previous", args.baseline_python)] if args.baseline_python else [])
    if args.baseline_first:
        releases.reverse()
    results = {name: http_phases(bs, topic, f"{run}-{name}", names, python, args) for name, python in releases}
    print(f"\n{'release':8s} {'phase':6s} {'kind':10s} {'n':>5s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} "
          f"{'errors':>7s}   (load: events/s the two workers processed while queried)")
    summary: dict = {"events": args.events, "keys": args.keys, "partitions": PARTS, **inproc}
    for name, (phases, load_rate, caught_up, paused) in sorted(results.items(), key=lambda kv: kv[0] != "this"):
        prefix = "" if name == "this" else "previous_"
        summary[f"{prefix}load_events_per_s"] = load_rate
        summary[f"{prefix}load_loop_paused_share"] = paused
        for phase, res in phases.items():
            for kind in ("local", "forwarded", "1000 keys"):
                xs = res[kind]
                note = (f"   load {load_rate:,.0f} ev/s" + (" (caught up: a lower bound)" if caught_up else "")
                        if phase == "load" and kind == "local" else
                        f"   loops waited for queries {paused:.1%} of the time"
                        if phase == "load" and kind == "forwarded" else "")
                print(f"{name:8s} {phase:6s} {kind:10s} {len(xs):>5d} {pct(xs, 50):>8.2f} {pct(xs, 99):>8.2f} "
                      f"{max(xs, default=float('nan')):>8.2f} {len(res['errors']):>7d}{note}")
                tag = kind.replace(" ", "_")
                summary[f"{prefix}{phase}_{tag}_p50_ms"] = pct(xs, 50)
                summary[f"{prefix}{phase}_{tag}_p99_ms"] = pct(xs, 99)
            summary[f"{prefix}{phase}_errors"] = len(res["errors"])
    print(f"(load avg {os.getloadavg()[0]:.2f})")
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
