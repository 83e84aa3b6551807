"""Where a batch worker's CPU goes per event, on each ingest path, and what librdkafka alone costs.

Produces ``--events`` events (bench_batch.py's traffic: ``--keys`` uniform clients, 8
partitions, lz4) once, then runs ``grudge-stream worker abuse_scores --runtime batch`` on the
backlog once per ingest path (``--paths``, default native and python), ``--runs`` rounds
interleaved. In each run it waits for the first ``--skip`` events (start-up and restores
out of the window), then measures the worker's process CPU (every thread) over
``--window-s`` seconds against the events it counted: CPU-µs per event.

A path may carry settings of its own: ``native:batch_backlog_factor=1`` is the native path with
that setting (``;`` between several), as a path of its own in the rounds. ``native@jemalloc``
is the native path with jemalloc preloaded (``LD_PRELOAD``; the worker's /ready must say so);
``@`` comes before ``:``.

``--baseline-python PY`` adds the path ``base``: another installation's worker (its
``grudge-stream`` beside PY) on the native path, in the same interleaved rounds, and the
rounds' median ratio of its CPU per event to this one's.

With ``--perf`` (needs Linux ``perf``), the last round of each path is also sampled with
``perf record`` over the window, and its samples split by thread and library, each as a share
of the samples and as CPU-µs per event: the librdkafka broker thread (fetch, lz4, one
message op per record), librdkafka on the consuming thread (taking and freeing those ops),
the sketch kernels, the interpreter, libc (allocation and locks, for both), the kernel.
The sum of the librdkafka lines is a floor no code above librdkafka's consumer API can go
under: every record is one op allocated by its broker thread and freed by the consumer.

    KAFKA_BOOTSTRAP_SERVERS=$(.venv/bin/python -m grudge_devkafka start) \\
      .venv/bin/python benchmarks/bench_ingest_floor.py --events 6000000 --runs 3 --perf
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict

sys.path.insert(0, os.path.dirname(__file__))
import bench_batch as bb  # noqa: E402
from common import emit  # noqa: E402

from grudge_devkafka import free_port  # noqa: E402

# perf's (thread, library) -> the line it is counted under.
def _group(comm: str, dso: str) -> str:
    broker_thread = comm.startswith("rdk:")
    if "librdkafka" in dso:
        return "librdkafka, its broker thread" if broker_thread else "librdkafka, consuming thread"
    if broker_thread:
        return "libc and kernel, librdkafka's threads"
    if "_score" in dso or "_countmin" in dso or "_bloom" in dso or "_hashing" in dso:
        return "sketch kernels"
    if "cimpl" in dso:
        return "confluent-kafka's module (Message objects)"
    if "libpython" in dso:
        return "interpreter (libpython)"
    if "_ingest" in dso or "_native" in dso or "multiarray" in dso or "libm" in dso:
        return "column kernels (_ingest, _native, numpy)"
    if "libc" in dso:
        return "libc (allocation, locks), consuming threads"
    if "kernel" in dso:
        return "kernel, consuming threads"
    return "other"


def preload(alloc: str) -> str:
    """The LD_PRELOAD value for an allocator's library (found by the dynamic linker's search)."""
    lib = {"jemalloc": "libjemalloc.so.2", "mimalloc": "libmimalloc.so.2", "tcmalloc": "libtcmalloc.so.4"}.get(alloc)
    if lib is None:
        sys.exit(f"unknown allocator {alloc!r} (jemalloc, mimalloc, tcmalloc)")
    return lib


def ready_allocator(port: int) -> str | None:
    """What the worker's /ready says it allocates with (grudge_stream.runtime.native.allocator)."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
            return json.loads(r.read()).get("allocator")
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read()).get("allocator")


def run_worker(bs: str, topic: str, path: str, args, workdir: str, perf_out: str | None) -> dict:
    run = uuid.uuid4().hex[:6]
    port = free_port()
    sets = {"source_topic": topic, "app_name": f"floor-{run}", "operator_id": f"floor-{run}",
            "alerts_topic": f"floor-{run}-alerts", "scores_topic": f"floor-{run}-scores",
            "dead_letter_topic": f"floor-{run}-dlq", "snapshot_topic": f"floor-{run}-snap",
            "checkpoint_interval_s": "5", "seed": bb.BENCH_KEY}
    path, _, extra = path.partition(":")
    path, _, alloc = path.partition("@")  # "native@jemalloc": that path with jemalloc preloaded
    sets["ingest"] = "native" if path == "base" else path
    sets.update(kv.split("=", 1) for kv in extra.split(";") if kv)  # "native:k=v;k=v": settings of that path
    python = args.baseline_python if path == "base" else sys.executable
    exe = os.path.join(os.path.dirname(python), "grudge-stream")
    cmd = [exe, "worker", "abuse_scores", "--bootstrap-servers", bs, "--web-port", str(port),
           "--runtime", "batch", "--loglevel", "warning"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    log = open(os.path.join(workdir, f"worker-{run}.log"), "wb")
    env = {**os.environ, "LD_PRELOAD": preload(alloc)} if alloc else None
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    try:
        deadline = time.monotonic() + 300
        while bb._events_total(port) < args.skip:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start (see {log.name})")
            time.sleep(0.05)
        said = ready_allocator(port)
        if said != (alloc or "system"):
            raise RuntimeError(f"the worker runs on allocator {said!r}, not {alloc or 'system'!r}")
        v0, c0, t0 = bb._events_total(port), bb._cpu_seconds(proc.pid), time.perf_counter()
        if perf_out:
            subprocess.run(["perf", "record", "-F", "999", "-o", perf_out, "-p", str(proc.pid), "--",
                            "sleep", str(args.window_s)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=True)
        else:
            time.sleep(args.window_s)
        v1, c1, t1 = bb._events_total(port), bb._cpu_seconds(proc.pid), time.perf_counter()
        if v1 >= args.events:
            raise RuntimeError("the worker caught up inside the window: produce more events (--events)")
        return {"events_per_s": (v1 - v0) / (t1 - t0), "cpu_us": (c1 - c0) / (v1 - v0) * 1e6}
    finally:
        bb.stop_worker(proc)
        log.close()


def perf_split(data: str) -> dict[str, float]:
    """Share of samples per line of ``_group``."""
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "comm,dso", "--stdio",
                          "-g", "none"], capture_output=True, text=True, check=True).stdout
    shares: dict[str, float] = defaultdict(float)
    for line in out.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 3 or not parts[0].endswith("%"):
            continue
        shares[_group(parts[1], " ".join(parts[2:]))] += float(parts[0].rstrip("%")) / 100
    return dict(shares)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=6_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--paths", default="native,python")
    ap.add_argument("--skip", type=int, default=300_000, help="events before the window starts")
    ap.add_argument("--window-s", type=float, default=2.5)
    ap.add_argument("--perf", action="store_true", help="split the last round's CPU by thread and library")
    ap.add_argument("--baseline-python", help="another installation's python: its worker on the native path "
                    "runs as the path 'base', in the same rounds")
    args = ap.parse_args()
    bs = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bs:
        sys.exit("set KAFKA_BOOTSTRAP_SERVERS (python -m grudge_devkafka start)")
    if args.perf and shutil.which("perf") is None:
        sys.exit("--perf needs Linux perf on the PATH")
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if args.baseline_python:
        paths.append("base")
    topic = f"bench-floor-{uuid.uuid4().hex[:8]}"
    bb.produce(bs, topic, args.events, args.keys)
    print(f"produced {args.events:,} events over {args.keys:,} keys into {topic}", flush=True)
    workdir = tempfile.mkdtemp(prefix="bench-floor-")
    res: dict[str, list[dict]] = {p: [] for p in paths}
    splits: dict[str, dict[str, float]] = {}
    for r in range(args.runs):
        for p in paths:
            data = os.path.join(workdir, f"perf-{p}.data") if args.perf and r == args.runs - 1 else None
            got = run_worker(bs, topic, p, args, workdir, data)
            res[p].append(got)
            print(f"round {r + 1} {p:15s} {got['events_per_s']:>11,.0f} ev/s  {got['cpu_us']:.3f} CPU-us/event"
                  f"{'  (perf on)' if data else ''}  load {os.getloadavg()[0]:.1f}", flush=True)
            if data:
                splits[p] = perf_split(data)
    summary: dict = {"events": args.events, "keys": args.keys}
    print(f"\n{'path':16s} {'CPU-us/event (median; runs)':40s} events/s (median)")
    for p in paths:
        cpu = [x["cpu_us"] for x in res[p]]
        print(f"{p:16s} {statistics.median(cpu):.3f} ({', '.join(f'{c:.3f}' for c in cpu)}){'':14s}"
              f"{statistics.median(x['events_per_s'] for x in res[p]):,.0f}")
        summary[f"{p}_cpu_us_per_event"] = statistics.median(cpu)
    for q in paths:
        if q in ("native", "python") or "native" not in res:
            continue
        ratio = statistics.median(res[q][i]["cpu_us"] / res["native"][i]["cpu_us"] for i in range(args.runs))
        print(f"{q} / native CPU per event (median of the rounds' ratios): {ratio:.3f}")
        summary[f"{q}_over_native"] = ratio
    if "native" in res and "python" in res:
        ratio = statistics.median(res["python"][i]["cpu_us"] / res["native"][i]["cpu_us"] for i in range(args.runs))
        print(f"python / native CPU per event (median of the rounds' ratios): {ratio:.2f}")
        summary["python_over_native"] = ratio
    for q in paths:  # today's path against the native one under the same allocator
        if q.startswith("python@") and "native@" + q[7:] in res:
            n = "native@" + q[7:]
            ratio = statistics.median(res[q][i]["cpu_us"] / res[n][i]["cpu_us"] for i in range(args.runs))
            print(f"{q} / {n} CPU per event (median of the rounds' ratios): {ratio:.2f}")
            summary[f"{q}_over_{n}"] = ratio
    for p, split in splits.items():
        cpu = res[p][-1]["cpu_us"]
        print(f"\n{p}: the last round's CPU ({cpu:.3f} us/event with perf sampling) by thread and library")
        floor = 0.0
        for name, share in sorted(split.items(), key=lambda kv: -kv[1]):
            print(f"  {name:45s} {share:6.1%}  {share * cpu:.3f} us/event")
            if name.startswith("librdkafka") or name.startswith("libc and kernel, librdkafka"):
                floor += share * cpu
            slug = "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")
            summary[f"{p}_perf_{slug}_share"] = round(share, 4)
        print(f"  librdkafka and its threads in all: {floor:.3f} us/event")
        summary[f"{p}_librdkafka_us_per_event"] = floor
    emit(summary)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
