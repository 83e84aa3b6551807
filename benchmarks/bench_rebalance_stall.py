"""How long a rebalance stalls the partitions it does not move: eager against cooperative.

The batch worker of ``abuse_scores`` (``emit_scores=every``: one score record per event)
on fresh topics of 8 partitions, traffic at ``--rate`` events/s spread evenly over them,
stamped with the wall clock. A second worker joins after ``--join-after`` seconds and
takes half the partitions. Per event, the latency is the score record's timestamp (when
the worker produced it) minus the event's; per source partition, the longest latency
while the second worker joins (from its start to ``--window`` seconds later).

Under the eager protocol every partition is revoked and restored; under
``cooperative-sticky`` only the four that move. The summary gives, per strategy, the
median over runs of the four lowest per-partition stalls (the partitions a cooperative
rebalance leaves in place) and of the four highest (the ones that move)::

    .venv/bin/python benchmarks/bench_rebalance_stall.py --runs 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_faust import grudge_settings  # noqa: E402
from common import emit  # noqa: E402
from kafkabench import BAD, GOOD, Proc, broker, create_topic, delete_topics, free_port, grudge_worker_cmd, http_get, scratch_dir  # noqa: E402,E501

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

PARTITIONS = 8
STRATEGIES = {"eager": "range", "cooperative": "cooperative-sticky"}


def wait_ready(port: int, proc: Proc, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http_get(port, "/ready")[0] == 200:
                return
        except OSError:
            pass
        if not proc.alive():
            raise RuntimeError("worker exited: " + proc.log_tail())
        time.sleep(0.2)
    raise RuntimeError("worker not ready: " + proc.log_tail())


def traffic(bootstrap: str, topic: str, rate: float, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
        i, t0 = 0, time.monotonic()
        while not stop.is_set():
            due = t0 + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(min(delay, 0.01))
                continue
            p.produce(topic, key=b"client-%05d" % (i % 5000), value=BAD if i % 50 == 0 else GOOD,
                      partition=i % PARTITIONS, timestamp=time.time_ns() // 1_000_000)
            p.poll(0)
            i += 1
        p.flush(30)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def stalls(bootstrap: str, topic: str, start_ms: int, end_ms: int) -> list[float]:
    """Per source partition, the longest score latency (s) of the events in [start, end)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"stall-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    c.assign([TopicPartition(topic, p, 0) for p in parts if ends[p]])
    worst = [0.0] * PARTITIONS
    left = sum(ends.values())
    deadline = time.monotonic() + 120
    while left > 0 and time.monotonic() < deadline:
        for m in c.consume(5000, timeout=0.5):
            if m.error():
                continue
            left -= 1
            doc = json.loads(m.value())
            ev_ms = doc["event_time_ms"] if "event_time_ms" in doc else None
            src = doc.get("source") or {}
            if ev_ms is None or not (start_ms <= ev_ms < end_ms):
                continue
            lat = (m.timestamp()[1] - ev_ms) / 1000.0
            p = src.get("partition", 0)
            worst[p] = max(worst[p], lat)
    c.close()
    return worst


def run_once(bootstrap: str, strategy: str, args) -> list[float]:
    run_id = f"stall-{uuid.uuid4().hex[:8]}"
    topic = f"{run_id}-events"
    create_topic(bootstrap, topic, PARTITIONS)
    settings = grudge_settings(run_id, topic, None, {
        "runtime": "batch", "emit_scores": "every", "cells_per_level": 20_000,
        "kafka.partition.assignment.strategy": strategy, "session_timeout_s": 10,
        **dict(kv.split("=", 1) for kv in args.set)})
    work = scratch_dir("bench-stall-")
    stop = threading.Event()
    procs: list[Proc] = []
    try:
        port_a = free_port()
        a = Proc(grudge_worker_cmd("abuse_scores", bootstrap, port_a, settings), work / "a.log", work)
        procs.append(a)
        wait_ready(port_a, a)
        th = traffic(bootstrap, topic, args.rate, stop)
        time.sleep(args.join_after)
        port_b = free_port()
        join_ms = time.time_ns() // 1_000_000
        b = Proc(grudge_worker_cmd("abuse_scores", bootstrap, port_b, settings), work / "b.log", work)
        procs.append(b)
        time.sleep(args.window)
        stop.set()
        th.join(60)
        time.sleep(3)  # the last outputs
        return sorted(stalls(bootstrap, f"{run_id}-scores", join_ms, join_ms + int(args.window * 1000)))
    finally:
        stop.set()
        for p in procs:
            p.stop()
        delete_topics(bootstrap, run_id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--join-after", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a worker setting for both workers (heartbeat_interval_s=1, say)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="eager,cooperative or one of them")
    args = ap.parse_args()
    chosen = {name: STRATEGIES[name] for name in args.strategies.split(",")}
    results: dict[str, list[list[float]]] = {name: [] for name in chosen}
    with broker() as bootstrap:
        for i in range(args.runs):
            for name, strategy in chosen.items():  # interleaved: the machine's noise hits both
                worst = run_once(bootstrap, strategy, args)
                results[name].append(worst)
                print(f"run {i + 1} {name:12s} per-partition stall (s): {' '.join(f'{x:.2f}' for x in worst)}",
                      flush=True)
    summary = {}
    for name, runs in results.items():
        low = statistics.median(statistics.median(w[:PARTITIONS // 2]) for w in runs)
        high = statistics.median(statistics.median(w[PARTITIONS // 2:]) for w in runs)
        summary[name] = {"unmoved_stall_s": round(low, 3), "moved_stall_s": round(high, 3)}
        print(f"{name:12s} stall of the partitions left in place {low:6.2f} s, of those that move {high:6.2f} s "
              f"(medians of {len(runs)} runs)")
    emit({"bench": "rebalance_stall", "rate": args.rate, "set": args.set, **summary})


if __name__ == "__main__":
    main()
