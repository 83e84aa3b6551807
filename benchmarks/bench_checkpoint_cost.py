"""What the state costs: snapshot bytes against input bytes, consume-loop stalls, alert
latency, and the restore after kill -9 — this installation beside another one, in one run.

The batch worker of ``abuse_scores`` (4 x 100,000 cells per partition, 8 partitions) on
fresh topics of the local broker, three parts:

- **cost** (``--rate`` events/s, default 2,000, for ``--seconds``, default 60, over 50,000
  clients, with planted abusers): the bytes the snapshot topic took while the traffic ran
  (the shutdown snapshots excluded) divided by the input bytes; the longest pause of the
  consume loop between two process calls (a checkpoint that stops the loop shows here,
  beside anything else: a fetch wait, the machine), and the longest stop for checkpoint
  work the worker itself measured (``grudge_checkpoint_loop_pause_max_seconds``);
  the alert latency p50 / p99. At-least-once and ``exactly_once``. It is
  ``bench_alert_latency.run_once`` with the snapshot-topic byte count.
- **latency under load**: the same at ``--high-rate`` (default 200,000 events/s; the
  figure printed is the rate the producer reached on this machine).
- **restore**: ``--restore-events`` (default 8M) preloaded, a worker started, killed with
  kill -9 once it has processed about ``--kill-at`` of them, started again: the time from
  the restart until it has processed everything the dead worker had, and the records the
  restore replayed to get there.

``--baseline-python`` names an interpreter with another grudge-stream installed (the
previous release, say); every case then runs with both, interleaved, and the summary
prints them side by side (medians of ``--runs``)::

    .venv/bin/python benchmarks/bench_checkpoint_cost.py --baseline-python /path/to/venv/bin/python
    .venv/bin/python benchmarks/bench_checkpoint_cost.py --parts cost --runs 3
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_alert_latency as lat  # noqa: E402
from bench_faust import grudge_settings  # noqa: E402
from common import emit  # noqa: E402
from kafkabench import (  # noqa: E402
    Proc, broker, delete_topics, end_offsets, free_port, grudge_worker_cmd, http_get, loadavg, metric_samples,
    produce_events, scratch_dir,
)

from grudge_stream.checkpoint import CheckpointStore  # noqa: E402
from grudge_stream.settings import Settings  # noqa: E402
from grudge_stream.topics import ensure_topology_topics  # noqa: E402
from grudge_stream.topology import load_topology  # noqa: E402


def latency_args(args, rate: float, seconds: float) -> argparse.Namespace:
    return argparse.Namespace(
        rate=rate, seconds=seconds, runs=1, population=50_000, abusers_per_s=10.0, burst=15, burst_gap_ms=10.0,
        warmup_s=5.0, tail_s=2.0, drain_s=5.0, linger_ms=5.0, checkpoint_s=5.0, partitions=args.partitions,
        fetch_max_wait_ms=None, baseline_python=args.baseline_python)


def positions(port: int, ends: dict[int, int]) -> dict[int, int] | None:
    """Each partition's next offset, from the worker's consumer-lag gauge (log end - next)."""
    status, text = http_get(port, "/metrics", timeout=1.0)
    if status != 200:
        return None
    lags = {int(labels.split('partition="')[1].split('"')[0]): v
            for labels, v in metric_samples(text, "grudge_consumer_lag_records")}
    if len(lags) < len(ends):
        return None
    return {p: ends[p] - int(lags[p]) for p in ends}


def restore_once(bs: str, args, base: bool, prefix: str) -> dict:
    """Preload, run, kill -9 part way, restart: how long until the new worker is back where
    the dead one was, and what it replayed."""
    rid = f"{prefix}-{'base' if base else 'this'}"
    topic = f"{rid}-events"
    produce_events(bs, topic, partitions=args.partitions, records=args.restore_events, keys=1_000_000,
                   bad_fraction=0.03)
    settings = grudge_settings(rid, topic, None, {"checkpoint_interval_s": 5, "group_instance_id": f"{rid}-w"})
    topology = load_topology("abuse_scores", Settings({**{k: str(v) for k, v in settings.items()},
                                                       "bootstrap_servers": bs}, environ={}))
    ensure_topology_topics(topology, bs, partitions=args.partitions)
    ends = end_offsets(bs, topic, args.partitions)
    exe = args.baseline_python if base else sys.executable
    work = scratch_dir("bench-restore-")
    port = free_port()
    cmd = [exe] + grudge_worker_cmd("abuse_scores", bs, port, settings, runtime="batch")[1:]
    worker = Proc(cmd, work / "worker-1.log", work)
    target = args.kill_at * sum(ends.values())
    reached: dict[int, int] | None = None
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            pos = positions(port, ends)
            if pos is not None and sum(pos.values()) >= target:
                reached = pos
                break
            time.sleep(0.05)
        if reached is None:
            raise RuntimeError(f"worker never reached {target:,.0f} records:\n{worker.log_tail()}")
        worker.kill()  # SIGKILL: no final snapshot
        last = positions(port, ends) or reached
    finally:
        worker.kill()
    del last
    store = CheckpointStore(bs, topology.snapshot_topic)
    snap = {}
    for p in range(args.partitions):
        m = store.read_manifest(topology.operator_id, p)
        snap[p] = m.current.next_offset if m is not None and m.current.next_offset is not None else 0
    store.close()
    replay = sum(max(0, reached[p] - snap[p]) for p in reached)
    t0 = time.monotonic()
    worker = Proc(cmd, work / "worker-2.log", work)
    ready_s = back_s = None
    try:
        deadline = t0 + 300
        while time.monotonic() < deadline:
            if ready_s is None and http_get(port, "/ready", timeout=1.0)[0] == 200:
                ready_s = time.monotonic() - t0
            pos = positions(port, ends)
            if pos is not None and all(pos[p] >= reached[p] for p in reached):
                back_s = time.monotonic() - t0
                break
            time.sleep(0.05)
    finally:
        worker.kill()
    if back_s is None:
        raise RuntimeError(f"the restarted worker never got back:\n{worker.log_tail()}")
    return {"case": "restore" + ("/base" if base else ""), "ready_s": ready_s, "back_s": back_s,
            "replayed_records": replay, "killed_at_records": sum(reached.values()),
            "snapshot_covered_records": sum(snap.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="cost,load,restore", help="comma separated: cost, load, restore")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--high-rate", type=float, default=200_000.0)
    ap.add_argument("--high-seconds", type=float, default=20.0)
    ap.add_argument("--restore-events", type=int, default=8_000_000)
    ap.add_argument("--kill-at", type=float, default=0.75, help="fraction of the preload processed at the kill")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--baseline-python", default=None)
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    variants = [False, True] if args.baseline_python else [False]
    prefix = f"benchcost-{uuid.uuid4().hex[:6]}"
    la0 = loadavg()
    rows: list[dict] = []
    with broker() as bs:
        try:
            for run in range(args.runs):
                for part, rate, seconds in (("cost", args.rate, args.seconds),
                                            ("load", args.high_rate, args.high_seconds)):
                    if part not in parts:
                        continue
                    for mode in ("batch", "batch-eos"):
                        for base in variants:
                            name = mode + ("/base" if base else "")
                            r = lat.run_once(bs, name, latency_args(args, rate, seconds), f"{prefix}-{part}{run}")
                            r.pop("latencies_ms")
                            r.update(case=f"{part} {name}", run=run, load=loadavg())
                            rows.append(r)
                            print(f"run {run + 1} {part} {name}: snapshot {r['snapshot_bytes'] / 1e6:.1f} MB = "
                                  f"{r['snapshot_to_input']:.2f}x input, longest loop pause {r['max_gap_ms']:.0f} ms "
                                  f"(for checkpoint work {r['checkpoint_stall_ms']:.0f} ms), "
                                  f"alert p50/p99 {r['p50_ms']:.0f}/{r['p99_ms']:.0f} ms, "
                                  f"{r['raised']}/{r['abusers']} alerts, produced {r['produced_per_s']:,.0f}/s; "
                                  f"load {r['load'][0]:.2f}", flush=True)
                if "restore" in parts:
                    for base in variants:
                        r = restore_once(bs, args, base, f"{prefix}-rs{run}")
                        r.update(run=run, load=loadavg())
                        rows.append(r)
                        print(f"run {run + 1} {r['case']}: ready after {r['ready_s']:.1f} s, back where it was "
                              f"killed after {r['back_s']:.1f} s, replayed {r['replayed_records']:,} records "
                              f"(killed at {r['killed_at_records']:,}, the snapshots covered "
                              f"{r['snapshot_covered_records']:,}); load {r['load'][0]:.2f}", flush=True)
        finally:
            print(f"# deleted {delete_topics(bs, prefix)} topics {prefix}-*", flush=True)
    print()
    print(f"medians of {args.runs} run(s); load average before {la0} after {loadavg()}")
    summary: dict[str, dict] = {}
    for case in dict.fromkeys(r["case"] for r in rows):
        sel = [r for r in rows if r["case"] == case]
        keys = (("ready_s", "back_s", "replayed_records") if case.startswith("restore") else
                ("snapshot_to_input", "snapshot_bytes", "max_gap_ms", "checkpoint_stall_ms", "p50_ms", "p99_ms",
                 "produced_per_s"))
        summary[case] = {k: statistics.median(r[k] for r in sel) for k in keys}
    print(f"{'case':22s} {'snap/input':>10s} {'snap MB':>9s} {'pause ms':>9s} {'ckpt ms':>8s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'events/s':>10s}")
    for case, m in summary.items():
        if case.startswith("restore"):
            continue
        print(f"{case:22s} {m['snapshot_to_input']:>10.2f} {m['snapshot_bytes'] / 1e6:>9.1f} {m['max_gap_ms']:>9.0f} "
              f"{m['checkpoint_stall_ms']:>8.0f} "
              f"{m['p50_ms']:>8.0f} {m['p99_ms']:>8.0f} {m['produced_per_s']:>10,.0f}")
    for case, m in summary.items():
        if case.startswith("restore"):
            print(f"{case:22s} ready {m['ready_s']:.1f} s, back {m['back_s']:.1f} s, "
                  f"replayed {m['replayed_records']:,.0f} records")
    emit({"bench": "checkpoint_cost", "summary": summary, "rows": rows, "loadavg": [la0, loadavg()],
          "rate": args.rate, "seconds": args.seconds, "high_rate": args.high_rate, "runs": args.runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
