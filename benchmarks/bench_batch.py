"""Batch runtime throughput against a real broker, side by side in one run.

Produces N events (default 10M) over K distinct keys (default 1M) into an 8-partition
topic once, then, interleaved over --runs rounds:

  consume   a bare tuned confluent-kafka consume() loop that only counts
  native-consume  the same consumer read through the native ingest kernel
            (grudge_stream._cyext._native): columns with the key and value bytes, counted
  batch     `grudge-stream worker abuse_scores --runtime batch` (snapshots every 5 s,
            outputs on threshold crossings) on today's ingest path (ingest=python), throughput
            from its /metrics
  batch-native  the same worker with ingest=native
  faust-agent  the same topology on the Faust runtime with drain=agent (one Faust event
               per record, the per-event machinery the batch runtime is measured against),
               over the first --faust-agent-events events; only with --faust
  faust-lean   the Faust runtime with its default drain=batch (whole fetches), only with --faust
  eos       the batch runtime with exactly_once=true, only with --eos

and, in each round unless --no-replay, `replay` of all N events with snapshot writing (its
wall-time rate and the CPU of the process while it ran) on each ingest path side by side:
`replay` (ingest=python) and `replay-native` (ingest=native).

With --baseline-exe PATH (the `grudge-stream` script of another installation, an
earlier release say), `batch@base` and `faust-lean@base` run that installation's
workers in the same rounds, interleaved, for a side-by-side comparison.

Run: .venv/bin/python benchmarks/bench_batch.py [--events 10000000] [--keys 1000000] [--runs 3]
Needs KAFKA_BOOTSTRAP_SERVERS (e.g. from `python -m grudge_devkafka start`).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(__file__))
from common import BAD, BENCH_KEY, GOOD, PARTS, abuse_draw, abuse_value, emit  # noqa: E402,F401 (PARTS: also for importers)

from grudge_devkafka import free_port  # noqa: E402
from grudge_stream.replay.ranges import Position  # noqa: E402
from grudge_stream.replay.runner import FAST_CONSUMER, replay  # noqa: E402
from grudge_stream.topology import Settings, load_topology  # noqa: E402



def produce(bs: str, topic: str, n: int, keys: int, planted: int = 0, planted_events: int = 20,
            partition_of=None) -> list[bytes]:
    """``n`` events over ``keys`` uniform clients (every 5000th abusive, 2% background bad).

    ``planted``: also that many abusers ``abuser-%05d`` whose ``planted_events`` events each
    (90% bad: raised at any key count) replace regular events at random positions, so the
    topic still holds exactly ``n`` records (benchmarks/peers compares raised sets with them:
    at a million keys the uniform clients have too few events each to be raised).
    ``partition_of(key)``: each client's partition (default: client number mod 8; the
    live-query benchmark passes Kafka's murmur2 partitioner). Returns the client names."""
    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic(topic, PARTS, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bs, "linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4",
                  "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000})
    ks, bad_draw = abuse_draw(n, keys)
    names = [b"client-%08d" % i for i in range(keys)]
    parts = [partition_of(k) for k in names] if partition_of else [i % PARTS for i in range(keys)]
    t0 = int(time.time() * 1000) - 3_600_000
    plant: dict[int, int] = {}
    if planted:
        prng = np.random.default_rng(2)
        slots = prng.choice(n, size=min(n, planted * planted_events), replace=False)
        plant = {int(i): j % planted for j, i in enumerate(slots)}
    for i in range(n):
        k = int(ks[i])
        j = plant.get(i) if plant else None
        if j is not None:
            key, part = b"abuser-%05d" % j, j % PARTS
            v = BAD if bad_draw[i] < 0.9 else GOOD
        else:
            key, part = names[k], parts[k]
            v = abuse_value(k, bad_draw[i])
        while True:
            try:
                p.produce(topic, key=key, value=v, partition=part, timestamp=t0 + i // 2000)
                break
            except BufferError:
                p.poll(0.005)
    p.flush(120)
    return names


def bare_consume(bs: str, topic: str, n: int) -> float:
    return bare_consume_cpu(bs, topic, n)[0]


def bare_consume_cpu(bs: str, topic: str, n: int) -> tuple[float, float]:
    """The bare consume() loop: events/s, and CPU seconds of the loop from its first record (all
    threads, librdkafka's included)."""
    c = Consumer({"bootstrap.servers": bs, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", **FAST_CONSUMER})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTS)])
    got = 0
    t0 = None
    while got < n:
        msgs = c.consume(10_000, timeout=1.0)
        if msgs and t0 is None:
            t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        for m in msgs:
            if m.error() is None:
                got += 1
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    MAIN_US["consume"].append((time.thread_time() - m0) / n * 1e6)
    c.close()
    return n / dt, cpu


# The bare loops' main-thread CPU per record, µs (the Python thread; librdkafka's threads apart).
MAIN_US: dict[str, list[float]] = {"consume": [], "native-consume": []}


def native_consume(bs: str, topic: str, n: int) -> tuple[float, float]:
    """The native ingest kernel in a bare loop: events/s, and CPU seconds of the loop (all threads,
    librdkafka's included)."""
    from grudge_stream.runtime.native import NativeReader, unavailable

    why = unavailable()
    if why is not None:
        raise RuntimeError(f"native ingest unavailable: {why}")
    c = Consumer({"bootstrap.servers": bs, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", **FAST_CONSUMER})
    r = NativeReader(c, topic, 10_000)
    r.split(list(range(PARTS)))
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTS)])
    got = 0
    t0 = None
    fetch = r.fetch.fetch
    while got < n:
        c.consume(10_000, timeout=0)  # the consumer queue: callbacks and errors, as the worker serves it
        _groups, _errors, k = fetch(10_000, 1000)
        if k and t0 is None:
            t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        got += k
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    MAIN_US["native-consume"].append((time.thread_time() - m0) / n * 1e6)
    r.close()
    c.close()
    return n / dt, cpu


def _events_total(port: int) -> float:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(float(x) for x in re.findall(r'^grudge_events_total\{[^}]*\} ([0-9.e+]+)$', body, re.M))


CHECKPOINT_INTERVAL = "5"
THIS_SETS: dict[str, str] = {}  # --set: settings for this installation's workers only


# Releases before the 128-bit key took a decimal seed (--baseline-seed 42 for those).
BASELINE_SEED = [BENCH_KEY]  # --baseline-seed


def worker_rate(bs: str, topic: str, n: int, runtime: str, extra: dict, workdir: str,
                exe: str | None = None) -> tuple[float, float]:
    """Events/s of a worker from its first counted event until it has counted ``n``, and its CPU seconds."""
    run = uuid.uuid4().hex[:8]
    port = free_port()
    baseline = exe is not None
    exe = exe or os.path.join(os.path.dirname(sys.executable), "grudge-stream")
    sets = {"source_topic": topic, "app_name": f"bench-{run}", "operator_id": f"bench-{run}",
            "alerts_topic": f"bench-{run}-alerts", "scores_topic": f"bench-{run}-scores",
            "dead_letter_topic": f"bench-{run}-dlq", "snapshot_topic": f"bench-{run}-snap",
            "checkpoint_interval_s": CHECKPOINT_INTERVAL, "seed": BASELINE_SEED[0] if baseline else BENCH_KEY, **extra,
            **({} if baseline else THIS_SETS)}
    cmd = [exe, "worker", "abuse_scores", "--bootstrap-servers", bs, "--web-port", str(port),
           "--runtime", runtime, "--loglevel", "warning"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    log = open(os.path.join(workdir, f"worker-{run}.log"), "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        t_first = None
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            v = _events_total(port)
            now = time.perf_counter()
            if v > 0 and t_first is None:
                t_first, v_first = now, v
            if v >= n:
                cpu = _cpu_seconds(proc.pid)
                return (n - v_first) / (now - t_first), cpu
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}; see {log.name}")
            # Scrape like Prometheus would (rarely) until the end is near, then often enough to
            # time the last event within 50 ms: a 20 Hz scrape costs the worker CPU of its own.
            time.sleep(0.05 if v >= 0.9 * n or t_first is None else 0.5)
        raise RuntimeError("worker did not finish")
    finally:
        stop_worker(proc)
        log.close()


def replay_run(bs: str, topic: str, ingest: str):
    """`replay` of the whole topic with snapshot writing on one ingest path; the report, with the
    CPU seconds of this process (every thread: librdkafka's included) while it ran."""
    topology = load_topology("abuse_scores", Settings({"source_topic": topic, "operator_id": f"replay-{topic}",
                                                       "snapshot_topic": f"{topic}-replay-snap",
                                                       "seed": BENCH_KEY}, environ={}))
    from grudge_stream.topics import ensure_topology_topics

    ensure_topology_topics(topology, bs)
    c0 = time.process_time()
    rep = replay(topology, bs, start=Position("earliest"), end=Position("now"), sink=None,
                 write_snapshots=True, progress=False, ingest=ingest)
    rep.cpu_s = time.process_time() - c0  # type: ignore[attr-defined]
    return rep


def stop_worker(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 60 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--faust", action="store_true", help="also run the Faust runtime (both drains)")
    ap.add_argument("--faust-agent-events", type=int, default=500_000,
                    help="events the drain=agent Faust worker is timed over (it runs at ~10k/s)")
    ap.add_argument("--eos", action="store_true", help="also run the exactly-once batch runtime")
    ap.add_argument("--checkpoint-interval", type=float, default=5.0)
    ap.add_argument("--baseline-exe", default=None,
                    help="grudge-stream script of another installation: adds batch@base and faust-lean@base")
    ap.add_argument("--baseline-seed", default=BENCH_KEY,
                    help="the baseline workers' seed (default: the same 128-bit benchmark key; "
                         "42 for releases before the 128-bit key)")
    ap.add_argument("--no-replay", action="store_true", help="skip the replay measurement")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting for this installation's workers only (e.g. score_mode=single to "
                         "compare with a release that had one signed sketch)")
    ap.add_argument("--no-agent", action="store_true", help="with --faust, skip the drain=agent worker")
    args = ap.parse_args()
    global CHECKPOINT_INTERVAL
    CHECKPOINT_INTERVAL = str(args.checkpoint_interval)
    for item in args.set:
        name, _, value = item.partition("=")
        THIS_SETS[name] = value
    BASELINE_SEED[0] = args.baseline_seed
    bs = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bs:
        sys.exit("set KAFKA_BOOTSTRAP_SERVERS (python -m grudge_devkafka start)")
    topic = f"bench-batch-{uuid.uuid4().hex[:8]}"
    t0 = time.time()
    produce(bs, topic, args.events, args.keys)
    print(f"produced {args.events} events over {args.keys} keys in {time.time() - t0:.1f}s", flush=True)
    workdir = tempfile.mkdtemp(prefix="bench-batch-")
    modes = ["consume", "native-consume", "batch", "batch-native"] + (["eos"] if args.eos else []) + (["faust-agent", "faust-lean"] if args.faust else [])
    if args.no_agent and "faust-agent" in modes:
        modes.remove("faust-agent")
    if args.baseline_exe:
        modes += ["batch@base"] + (["faust-lean@base"] if args.faust else [])
    if not args.no_replay:
        modes += ["replay", "replay-native"]
    res: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    reps: dict = {}
    for r in range(args.runs):
        for m in modes:
            if m == "consume":
                rate, c = bare_consume_cpu(bs, topic, args.events)
                res[m].append(rate)
                cpu[m].append(c)
            elif m == "native-consume":
                rate, c = native_consume(bs, topic, args.events)
                res[m].append(rate)
                cpu[m].append(c)
            elif m in ("batch", "batch-native"):
                rate, c = worker_rate(bs, topic, args.events, "batch",
                                      {"ingest": "native" if m == "batch-native" else "python"}, workdir)
                res[m].append(rate)
                cpu[m].append(c)
            elif m == "eos":
                rate, c = worker_rate(bs, topic, args.events, "batch",
                                      {"exactly_once": "true", "group_instance_id": f"eos-{r}"}, workdir)
                res[m].append(rate)
                cpu[m].append(c)
            elif m == "faust-agent":
                rate, c = worker_rate(bs, topic, min(args.events, args.faust_agent_events), "faust",
                                      {"drain": "agent"}, workdir)
                res[m].append(rate)
                cpu[m].append(c)
            elif m == "faust-lean":
                rate, c = worker_rate(bs, topic, args.events, "faust", {"drain": "batch"}, workdir)
                res[m].append(rate)
                cpu[m].append(c)
            elif m in ("batch@base", "faust-lean@base"):
                runtime = "batch" if m == "batch@base" else "faust"
                rate, c = worker_rate(bs, topic, args.events, runtime, {} if runtime == "batch" else {"drain": "batch"},
                                      workdir, exe=args.baseline_exe)
                res[m].append(rate)
                cpu[m].append(c)
            elif m in ("replay", "replay-native"):
                rep = replay_run(bs, topic, "native" if m == "replay-native" else "python")
                assert rep.records == args.events, (m, rep.records)
                res[m].append(rep.rate)
                cpu[m].append(rep.cpu_s)  # type: ignore[attr-defined]
                reps[m] = rep
            print(f"run {r + 1} {m:15s} {res[m][-1]:>12,.0f} events/s  (load {os.getloadavg()[0]:.2f})", flush=True)
    rep = reps.get("replay")
    med = {m: statistics.median(v) for m, v in res.items()}
    # Events per CPU-second: the bare loops' own CPU (from their first record), a worker's whole
    # process CPU (start-up and restores included) over the events it counted.
    per_cpu = {m: statistics.median(args.events / c for c in cpu[m]) for m in modes if cpu[m]}
    print(f"\n{'mode':15s} {'median events/s':>16s} {'events/CPU-s':>13s}   runs (events/s; spread)")
    for m in modes:
        spread = (max(res[m]) - min(res[m])) / med[m] if len(res[m]) > 1 else 0.0
        pc = f"{per_cpu[m]:>13,.0f}" if m in per_cpu else f"{'':>13s}"
        print(f"{m:15s} {med[m]:>16,.0f} {pc}   {', '.join(f'{x:,.0f}' for x in res[m])}; {spread:.0%}")
    for m, v in MAIN_US.items():
        if v:
            print(f"{m}: main-thread CPU {statistics.median(v):.3f} µs/record (runs {', '.join(f'{x:.3f}' for x in v)})")
    if "native-consume" in med:
        print(f"native-consume / consume = {med['native-consume'] / med['consume']:.2f} (target >= 3)")
    if "batch-native" in med:
        print(f"batch-native / batch = {med['batch-native'] / med['batch']:.2f} events/s, "
              f"{per_cpu['batch-native'] / per_cpu['batch']:.2f} events per CPU-second (target >= 2.5); "
              f"batch-native / consume = {med['batch-native'] / med['consume']:.2f}")
    for m, r_ in reps.items():
        print(f"{m} with snapshots (last round): {r_.records:,} records in {r_.seconds:.2f}s = {r_.rate:,.0f}/s "
              f"(read {r_.ingest})")
    if "replay-native" in med:
        print(f"replay-native / replay = {med['replay-native'] / med['replay']:.2f} events/s, "
              f"{per_cpu['replay-native'] / per_cpu['replay']:.2f} events per CPU-second")
    # batch@base runs the other installation's default ingest (the native path where it has
    # one): it is compared with this installation's default, batch-native, like with like.
    for m, b in (("batch-native" if "batch-native" in med else "batch", "batch@base"),
                 ("faust-lean", "faust-lean@base")):
        if m in med and b in med:
            print(f"{m} / {b} = {per_cpu[m] / per_cpu[b]:.3f} events per CPU-second, "
                  f"{med[m] / med[b]:.3f} events/s (target >= 0.95)")
    print(f"batch / consume = {med['batch'] / med['consume']:.2f} (target >= 0.6); "
          f"batch >= 1M/s: {med['batch'] >= 1e6}")
    if "faust-agent" in med:
        print(f"batch / faust-agent = {med['batch'] / med['faust-agent']:.1f} (target >= 20); "
              f"batch / faust-lean = {med['batch'] / med['faust-lean']:.2f}")
    if "eos" in med:
        print(f"exactly-once / batch = {med['eos'] / med['batch']:.2f}")
    shutil.rmtree(workdir, ignore_errors=True)
    emit({"bench": "batch", "events": args.events, "keys": args.keys, "runs": args.runs,
          **{f"{m}_events_per_s": round(v) for m, v in med.items()},
          **{f"{m}_worker_cpu_s": round(statistics.median(v), 2) for m, v in cpu.items() if v},
          **{f"{m}_events_per_cpu_s": round(v) for m, v in per_cpu.items()},
          **({"replay_seconds": round(rep.seconds, 2), "replay_events_per_s": round(rep.rate)} if rep else {})})


if __name__ == "__main__":
    main()
