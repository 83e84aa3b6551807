"""End-to-end alert latency of the abuse_scores worker: event produced -> alert consumed.

A ``grudge-stream worker abuse_scores`` (levels 4, cells_per_level 100000,
checkpoint_interval_s 5) runs on fresh topics. Once it is ready (/ready), this script

- produces steady background traffic (``--rate`` events/s over ``--population``
  well-behaved clients, 3% ``bad``), record timestamp = wall-clock ms at produce time;
- starts ``--abusers-per-s`` new abusive clients per second (after ``--warmup-s``); each
  sends a burst of ``--burst`` ``bad`` events ``--burst-gap-ms`` apart. With bad = +0.04
  and raise_at = 0.5 the 13th bad event raises the client, at a moment this script knows;
- consumes the alert topic in a process of its own (confluent-kafka, fetch.wait.max.ms 5,
  fetch.queue.backoff.ms 1) and stamps every alert with the wall clock on receipt.

Latency of a ``raised`` alert = receipt time - produce time of the record that triggered
it. The producer keeps (partition, offset) -> produce time for every abusive event via
delivery callbacks and looks up the alert's ``source.partition`` / ``source.offset``; the
alert's ``event_time_ms`` (the watermark, equal to that record's timestamp here) is the
fallback and a cross-check. Alerts on well-behaved clients would be false positives
and are counted.

The latency includes the producer's linger (``--linger-ms``, librdkafka's default 5),
the broker, the worker's fetch and batching (``batch_within_s``), the operator, the
output producer (linger 5 ms) and this consumer's fetch; and whatever the worker is
doing when the event arrives (a snapshot's copy of the state, a transaction's commit).

Modes (``--modes``, comma separated; each may carry ``@<checkpoint seconds>``):

  faust-agent   the Faust runtime, ``drain=agent`` (one Faust event per record)
  faust-lean    the Faust runtime, ``drain=batch`` (whole fetches to the operators)
  batch         ``--runtime batch`` (confluent-kafka), at-least-once outputs
  batch-eos     ``--runtime batch`` with ``exactly_once=true``: outputs become visible when
                the checkpoint's transaction commits, so ``batch-eos@1`` (checkpoints every
                second) shows what a shorter interval buys
  batch-nosnap  ``batch`` with a snapshot budget out of reach (no snapshot while the
                traffic runs): beside ``batch``, what checkpointing adds to the latency

    .venv/bin/python benchmarks/bench_alert_latency.py                       # 3 x 40 s per mode
    .venv/bin/python benchmarks/bench_alert_latency.py --modes batch,batch-eos,batch-eos@1
    .venv/bin/python benchmarks/bench_alert_latency.py --modes batch,batch-nosnap --rate 200000 --seconds 20
    .venv/bin/python benchmarks/bench_alert_latency.py --rate 5000 --seconds 120 --modes faust-lean
"""
from __future__ import annotations

import argparse
import bisect
import heapq
import json
import random
import statistics
import sys
import multiprocessing
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_faust import grudge_settings  # noqa: E402
from common import emit  # noqa: E402
from kafkabench import (BAD, GOOD, Proc, broker, delete_topics, free_port, grudge_worker_cmd,  # noqa: E402
                        http_get, loadavg, metric_samples, metrics_sum, scratch_dir)

from grudge_stream.topics import ensure_topology_topics  # noqa: E402
from grudge_stream.topology import Settings, load_topology  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, int(round(q / 100.0 * len(xs) + 0.5)) - 1))  # nearest rank
    return xs[i]


def _read_alerts(bootstrap: str, topic: str, partitions: int, out: str, ready, stopping) -> None:
    """The alert reader's process: every alert, stamped with the wall clock on receipt, one
    line (``<receipt time>\t<alert json>``) in ``out``."""
    from confluent_kafka import Consumer, TopicPartition

    # read_committed: with exactly_once an alert counts when its transaction commits.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-alerts-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 5, "fetch.queue.backoff.ms": 1,
                  "fetch.min.bytes": 1, "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    try:
        with open(out, "w") as f:
            c.poll(0.1)
            ready.set()
            while not stopping.is_set():
                # poll(), not consume(n, timeout): consume waits until it has n records or the
                # timeout has passed, so with alerts far apart each one would be read up to
                # the whole timeout late, and the latency measured would be the reader's.
                m = c.poll(0.05)
                if m is None or m.error():
                    continue
                f.write(f"{time.time()!r}\t{m.value().decode()}\n")
                f.flush()
    finally:
        c.close()


class AlertReader:
    """Reads the alert topic in a process of its own. A thread of this process would wait
    for the interpreter lock that the produce loop (up to 200,000 events/s) holds nearly all
    the time, and the receipt times, so the latencies, would include that wait."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, out: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.out = out
        self.ready = ctx.Event()
        self.stopping = ctx.Event()
        self.proc = ctx.Process(target=_read_alerts, daemon=True,
                                args=(bootstrap, topic, partitions, str(out), self.ready, self.stopping))
        self.got: list[tuple[float, dict]] = []

    def start(self) -> None:
        self.proc.start()
        if not self.ready.wait(60):
            raise RuntimeError("the alert reader did not start")

    def join(self, timeout: float) -> None:
        if self.proc.pid is None:  # never started
            return
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
        if self.out.exists():
            for line in self.out.read_text().splitlines():
                recv, _, body = line.partition("\t")
                self.got.append((float(recv), json.loads(body)))


MODES = {  # name -> (runtime, faust drain, extra settings)
    "faust-agent": ("faust", "agent", {}),
    "faust-lean": ("faust", "batch", {}),
    "batch": ("batch", None, {}),
    "batch-eos": ("batch", None, {"exactly_once": "true"}),
    "batch-nosnap": ("batch", None, {"snapshot_replay_budget_s": 10**6}),
}


def topic_bytes(bs: str, topic: str) -> tuple[int, int]:
    """(records, key + value bytes) of ``topic`` up to its current end."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": f"bytes-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        tps = [TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0]
        n = size = 0
        if not tps:
            return 0, 0
        c.assign(tps)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                if not m.error():
                    n += 1
                    size += len(m.value() or b"") + len(m.key() or b"")
            pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, tp.partition) for tp in tps])}
            if all(pos[p] >= ends[p] for p in pos):
                break
        return n, size
    finally:
        c.close()


def parse_mode(mode: str, default_checkpoint_s: float) -> tuple[str, str | None, dict, float]:
    mode = mode.removesuffix("/base")
    name, _, cp = mode.partition("@")
    if name not in MODES:
        raise SystemExit(f"unknown mode {name!r}; known: {', '.join(MODES)}")
    runtime, drain, extra = MODES[name]
    return runtime, drain, dict(extra), float(cp) if cp else default_checkpoint_s


def run_once(bs: str, mode: str, args, prefix: str) -> dict:
    runtime, drain, extra, checkpoint_s = parse_mode(mode, args.checkpoint_s)
    rid = f"{prefix}-{mode.replace('@', '-').replace('.', '_').replace('/', '-')}"
    if extra.get("exactly_once"):
        extra["group_instance_id"] = f"{rid}-w0"  # names the transactional id
    settings = grudge_settings(rid, f"{rid}-events", drain, {"checkpoint_interval_s": checkpoint_s, **extra})
    topology = load_topology("abuse_scores", Settings({**{k: str(v) for k, v in settings.items()},
                                                       "bootstrap_servers": bs}, environ={}))
    ensure_topology_topics(topology, bs, partitions=args.partitions, create_source=True)
    work = scratch_dir("bench-latency-")
    port = free_port()
    trace_path = work / "trace.txt"
    # The product's worker, run in-process by grudge_timed_worker.py so that every process
    # call is traced (wall clock, partition, offsets): latency splits into "until processed"
    # and "processed -> consumed".
    cli = grudge_worker_cmd("abuse_scores", bs, port, settings, runtime=runtime)
    # NAME/base: the same worker from another installation (--baseline-python), side by side.
    exe = args.baseline_python if mode.endswith("/base") else sys.executable
    cmd = [exe, str(Path(__file__).resolve().parent / "grudge_timed_worker.py"),
           "--out", str(work / "timing.json"), "--expected", str(10**15), "--trace", str(trace_path)]
    if args.fetch_max_wait_ms is not None:
        cmd += ["--fetch-max-wait-ms", str(args.fetch_max_wait_ms)]
    cmd += ["--"] + cli[3:]
    worker = Proc(cmd, work / "worker.log", work)
    reader = None
    try:
        deadline = time.monotonic() + 120
        while http_get(port, "/ready")[0] != 200:
            if not worker.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready; log:\n{worker.log_tail()}")
            time.sleep(0.2)
        reader = AlertReader(bs, topology.outputs["alerts"], args.partitions, work / "alerts.tsv")
        reader.start()

        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bs, "linger.ms": args.linger_ms})
        source = topology.source_topic
        sent_at: dict[tuple[int, int], int] = {}
        errors: list[str] = []

        def on_abuse(err, msg) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                sent_at[(msg.partition(), msg.offset())] = msg.timestamp()[1]

        rnd = random.Random(5)
        population = [f"user-{i:011d}".encode() for i in range(args.population)]
        burst: list[tuple[float, int, bytes, int]] = []  # (due, seq, key, index in burst)
        n_abusers = int(max(0.0, args.seconds - args.warmup_s - args.tail_s) * args.abusers_per_s)
        t0 = traffic_t0 = time.time()
        for j in range(n_abusers):
            start = t0 + args.warmup_s + j / args.abusers_per_s
            key = f"abuser-{j:06d}-{rnd.getrandbits(32):08x}".encode()
            for b in range(args.burst):
                heapq.heappush(burst, (start + b * args.burst_gap_ms / 1000.0, j * 1000 + b, key, b))
        abuser_keys = {k for _, _, k, _ in burst}
        produced = 0
        produce = producer.produce
        end = t0 + args.seconds
        cpu0, mono0 = worker.cpu(), time.monotonic()
        lag_samples: list[float] = []
        next_sample = t0 + args.warmup_s
        while True:
            now = time.time()
            if now >= end:
                break
            if now >= next_sample:
                # How far behind the worker's processing is: wall clock minus the oldest
                # partition watermark (only meaningful while every partition gets traffic).
                next_sample = now + 0.5
                status, text = http_get(port, "/metrics", timeout=0.5)
                lags = [v for _, v in metric_samples(text, "grudge_watermark_lag_seconds")] if status == 200 else []
                if lags:
                    lag_samples.append(max(lags))
            due = int((now - t0) * args.rate)
            while produced < due:
                ts = int(time.time() * 1000)
                value = BAD if rnd.random() < 0.03 else GOOD
                try:
                    produce(source, key=population[rnd.randrange(args.population)], value=value, timestamp=ts)
                except BufferError:
                    producer.poll(0.01)
                    continue
                produced += 1
            while burst and burst[0][0] <= now:
                _, _, key, _ = heapq.heappop(burst)
                while True:  # an abuser's event is never dropped: wait for room in the queue
                    ts = int(time.time() * 1000)
                    try:
                        produce(source, key=key, value=BAD, timestamp=ts, on_delivery=on_abuse)
                        break
                    except BufferError:
                        producer.poll(0.01)
            producer.poll(0)
            time.sleep(0.001)
        cpu_share = (worker.cpu() - cpu0) / (time.monotonic() - mono0)
        producer.flush(30)
        # Exactly-once alerts appear when the checkpoint's transaction commits.
        time.sleep(max(args.drain_s, checkpoint_s + 2.0) if extra.get("exactly_once") else args.drain_s)
        text = http_get(port, "/metrics")[1]
        events = metrics_sum(text, "grudge_events_total")
        snaps = metrics_sum(text, "grudge_snapshot_duration_seconds_count")  # checkpoint rounds
        snap_s = metrics_sum(text, "grudge_snapshot_duration_seconds_sum")
        # The worker's own account of the longest stop for checkpoint work (absent before 0.3).
        stall_ms = (metrics_sum(text, "grudge_checkpoint_loop_pause_max_seconds") * 1000.0
                    if b"grudge_checkpoint_loop_pause_max_seconds" in text else float("nan"))
        # What the state cost on the wire while the traffic ran (before the shutdown snapshots).
        snap_records, snap_bytes = topic_bytes(bs, topology.snapshot_topic)
        in_records, in_bytes = topic_bytes(bs, source)
    finally:
        if reader is not None:
            reader.stopping.set()
            reader.join(10)
        worker.stop(60)
        worker.kill()

    calls: dict[int, list[tuple[int, int, float, float]]] = {}
    if trace_path.exists():
        for line in trace_path.read_text().splitlines():
            t0, t1, p, first_off, last_off, _n = line.split()
            calls.setdefault(int(p), []).append((int(first_off), int(last_off), float(t0), float(t1)))
    for v in calls.values():
        v.sort()
    # The longest pause of the consume loop between two process calls (all partitions, in
    # wall-clock order) once the traffic runs: a checkpoint that stops the loop shows here.
    spans = sorted((c[2], c[3]) for v in calls.values() for c in v if c[2] >= traffic_t0 + args.warmup_s)
    max_gap_ms = max((b[0] - a[1] for a, b in zip(spans, spans[1:])), default=float("nan")) * 1000.0
    starts = {p: [c[0] for c in v] for p, v in calls.items()}

    def processed_at(partition: int, offset: int) -> tuple[float, float] | None:
        """(start, end) wall time of the process call that handled this record."""
        v = calls.get(partition)
        if not v:
            return None
        i = bisect.bisect_right(starts[partition], offset) - 1
        if i >= 0 and v[i][0] <= offset <= v[i][1]:
            return v[i][2], v[i][3]
        return None

    lat_ms, mismatch, false_pos, unmatched = [], 0, 0, 0
    to_proc_ms, after_ms = [], []
    seen_keys = set()
    for recv, alert in reader.got:
        if alert.get("state") != "raised":
            continue
        key = alert.get("key", "").encode() if isinstance(alert.get("key"), str) else None
        src = alert.get("source", {})
        t_sent = sent_at.get((src.get("partition"), src.get("offset")))
        if key is not None and key not in abuser_keys:
            false_pos += 1
            continue
        if t_sent is None:
            unmatched += 1
            t_sent = alert["event_time_ms"]
        elif t_sent != alert["event_time_ms"]:
            mismatch += 1
        if key in seen_keys:
            continue  # a duplicate (at-least-once); the first copy counts
        seen_keys.add(key)
        lat_ms.append(recv * 1000.0 - t_sent)
        pa = processed_at(src.get("partition"), src.get("offset"))
        if pa is not None:
            to_proc_ms.append(pa[1] * 1000.0 - t_sent)
            after_ms.append((recv - pa[1]) * 1000.0)
    return {
        "mode": mode, "abusers": n_abusers, "raised": len(lat_ms), "false_positives": false_pos,
        "unmatched": unmatched, "event_time_mismatch": mismatch, "background_events": produced,
        "worker_events": int(events), "snapshots": int(snaps), "snapshot_s_total": snap_s,
        "snapshot_records": snap_records, "snapshot_bytes": snap_bytes, "input_records": in_records,
        "input_bytes": in_bytes, "snapshot_to_input": snap_bytes / in_bytes if in_bytes else float("nan"),
        "p50_ms": pct(lat_ms, 50), "p90_ms": pct(lat_ms, 90), "p99_ms": pct(lat_ms, 99),
        "max_ms": max(lat_ms) if lat_ms else float("nan"),
        "mean_ms": statistics.fmean(lat_ms) if lat_ms else float("nan"), "delivery_errors": len(errors),
        "worker_cpu_share": cpu_share, "latencies_ms": lat_ms,
        "until_processed_p50_ms": pct(to_proc_ms, 50), "until_processed_p99_ms": pct(to_proc_ms, 99),
        "after_processed_p50_ms": pct(after_ms, 50), "after_processed_p99_ms": pct(after_ms, 99),
        "traced": len(to_proc_ms), "max_gap_ms": max_gap_ms, "checkpoint_stall_ms": stall_ms,
        "produced_per_s": produced / args.seconds,
        "processing_lag_s_p50": pct(lag_samples, 50), "processing_lag_s_max": max(lag_samples, default=float("nan")),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=3000.0, help="background events/s")
    ap.add_argument("--seconds", type=float, default=40.0, help="traffic duration per run")
    ap.add_argument("--runs", type=int, default=3, help="runs per mode (interleaved)")
    ap.add_argument("--population", type=int, default=50_000)
    ap.add_argument("--abusers-per-s", type=float, default=10.0)
    ap.add_argument("--burst", type=int, default=15)
    ap.add_argument("--burst-gap-ms", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--tail-s", type=float, default=2.0)
    ap.add_argument("--drain-s", type=float, default=5.0, help="wait for late alerts after producing")
    ap.add_argument("--linger-ms", type=float, default=5.0)
    ap.add_argument("--checkpoint-s", type=float, default=5.0, help="checkpoint interval unless a mode sets one")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--fetch-max-wait-ms", type=int, default=None,
                    help="experiment: override the worker's aiokafka fetch.max.wait.ms (Faust hardcodes 1500)")
    ap.add_argument("--modes", default="faust-agent,faust-lean,batch,batch-eos,batch-eos@1",
                    help=f"comma separated, from {', '.join(MODES)}; NAME@S sets the checkpoint interval")
    ap.add_argument("--baseline-python", default=None,
                    help="an interpreter with another grudge-stream installed: each mode also runs as MODE/base")
    args = ap.parse_args()

    modes = [d.strip() for d in args.modes.split(",") if d.strip()]
    if args.baseline_python:
        modes = [m for d in modes for m in (d, d + "/base")]
    for d in modes:
        parse_mode(d, args.checkpoint_s)
    prefix = f"benchlat-{uuid.uuid4().hex[:6]}"
    la0 = loadavg()
    rows = []
    with broker() as bs:
        try:
            for run in range(args.runs):
                for d in modes:
                    r = run_once(bs, d, args, f"{prefix}-r{run}")
                    r["run"] = run
                    r["load"] = loadavg()
                    lat = r.pop("latencies_ms")
                    r["_lat"] = lat
                    rows.append(r)
                    print(f"run {run + 1}/{args.runs} {d}: {r['raised']}/{r['abusers']} alerts, "
                          f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms "
                          f"(until processed p50/p99 {r['until_processed_p50_ms']:.1f}/"
                          f"{r['until_processed_p99_ms']:.1f} ms, processed -> consumed "
                          f"{r['after_processed_p50_ms']:.1f}/{r['after_processed_p99_ms']:.1f} ms); "
                          f"worker CPU {r['worker_cpu_share']:.2f} of a core, processing lag p50 "
                          f"{r['processing_lag_s_p50']:.3f} s max {r['processing_lag_s_max']:.3f} s; "
                          f"{r['snapshots']} checkpoint rounds taking {r['snapshot_s_total']:.1f} s; "
                          f"snapshot topic {r['snapshot_bytes'] / 1e6:.1f} MB = {r['snapshot_to_input']:.1f}x the "
                          f"input's {r['input_bytes'] / 1e6:.2f} MB; "
                          f"false alerts {r['false_positives']}; load {r['load'][0]:.2f}", flush=True)
        finally:
            print(f"# deleted {delete_topics(bs, prefix)} topics {prefix}-*", flush=True)
    print()
    print(f"alert latency (produce -> alert consumed), {args.rate:,.0f} background events/s over "
          f"{args.population:,} clients, {args.abusers_per_s:g} new abusers/s (burst of {args.burst} bad "
          f"events {args.burst_gap_ms:g} ms apart), {args.seconds:g} s per run, {args.runs} run(s) per mode, "
          f"{args.partitions} partitions, checkpoint every {args.checkpoint_s:g} s unless a mode says @S; "
          f"load average before {la0} after {loadavg()}")
    print(f"{'mode':14s} {'alerts':>9s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} "
          f"{'false+':>7s}   (medians of per-run figures; pooled p50/p99 in brackets)")
    summary = {}
    for d in modes:
        sel = [r for r in rows if r["mode"] == d]
        pooled = [x for r in sel for x in r["_lat"]]
        m = {k: statistics.median(r[k] for r in sel)
             for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "until_processed_p50_ms", "until_processed_p99_ms",
                       "after_processed_p50_ms", "after_processed_p99_ms")}
        m["pooled_p50_ms"], m["pooled_p99_ms"] = pct(pooled, 50), pct(pooled, 99)
        m["alerts"] = sum(r["raised"] for r in sel)
        m["expected"] = sum(r["abusers"] for r in sel)
        m["false_positives"] = sum(r["false_positives"] for r in sel)
        m["snapshot_to_input"] = statistics.median(r["snapshot_to_input"] for r in sel)
        m["snapshot_mb"] = statistics.median(r["snapshot_bytes"] for r in sel) / 1e6
        summary[str(d)] = m
        print(f"{str(d):14s} {m['alerts']:>4d}/{m['expected']:<4d} {m['p50_ms']:>8.1f} {m['p90_ms']:>8.1f} "
              f"{m['p99_ms']:>8.1f} {m['max_ms']:>8.1f} {m['false_positives']:>7d}   "
              f"[{m['pooled_p50_ms']:.1f} / {m['pooled_p99_ms']:.1f}]")
    print("snapshot topic while the traffic ran (medians): MB, and x the input bytes")
    for d, m in summary.items():
        print(f"{d:14s} {m['snapshot_mb']:10.1f} MB  {m['snapshot_to_input']:8.2f}x")
    print("split (medians of per-run p50 / p99): produce -> processed by the operator | processed -> alert consumed")
    for d, m in summary.items():
        print(f"{d:14s} {m['until_processed_p50_ms']:8.1f} / {m['until_processed_p99_ms']:8.1f} ms   | "
              f"{m['after_processed_p50_ms']:8.1f} / {m['after_processed_p99_ms']:8.1f} ms")
    emit({"bench": "alert_latency", "rate": args.rate, "seconds": args.seconds, "runs": args.runs,
          "abusers_per_s": args.abusers_per_s, "summary": summary,
          "rows": [{k: v for k, v in r.items() if k != "_lat"} for r in rows], "loadavg": [la0, loadavg()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
