"""Faust throughput side by side: bare agent, exact Faust Table baseline, grudge-stream worker.

One event topic (8 partitions, N records over N distinct 16-byte client ids,
10% ``bad``, event time 1 ms apart) is produced once with confluent-kafka; then, for each
run, every variant reads it from the beginning under a fresh consumer group / app id:

- (a) ``count``: a bare faust-streaming agent (kafka:// driver, memory store, raw
  serializers) that only counts events (benchmarks/faust_baseline_worker.py);
- (b) ``table``: a Faust agent keeping an exact per-key decayed score in a changelogged
  Faust Table (same worker script, ``--mode table``);
- (c) ``grudge``: ``grudge-stream worker abuse_scores`` (levels 4, cells_per_level 100000,
  checkpoint_interval_s 5, emit_scores crossings), once per available ``drain`` setting;
- (d), only when asked: the same topology on the confluent-kafka batch runtime
  (``worker --runtime batch``), for reference — not a Faust agent.

Runs are interleaved (a, b, c, a, b, c, ...) so machine noise hits all alike.
Throughput = events / (time the last event was processed - time the first was), both
taken inside the worker process: by benchmarks/faust_baseline_worker.py for (a) and (b),
and for (c)/(d) by benchmarks/grudge_timed_worker.py, which runs the product's own
``grudge-stream worker`` in-process with a two-clock-read wrapper around the
per-partition process calls. Worker CPU time over the same interval is the process CPU
clock (all threads: the Faust loop, aiokafka's thread, librdkafka, the checkpoint
executor). /metrics is also polled (``grudge_events_total``) as a cross-check.

    .venv/bin/python benchmarks/bench_faust.py                      # 200k records, 3 runs (~8 min)
    .venv/bin/python benchmarks/bench_faust.py --records 1000000    # the issue's figure (~35 min)
    .venv/bin/python benchmarks/bench_faust.py --variants a,c --drains batch

Uses $KAFKA_BOOTSTRAP_SERVERS, else starts a local broker for the run. Topics it
creates are named ``bench-<id>-...`` and deleted at the end (``--keep-topics`` keeps them).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit  # noqa: E402
from kafkabench import (Proc, broker, delete_topics, free_port, grudge_worker_cmd, http_get, loadavg,  # noqa: E402
                        metric_samples, metrics_sum, produce_events, python, scratch_dir)

HERE = Path(__file__).resolve().parent
BASELINE_WORKER = HERE / "faust_baseline_worker.py"
TIMED_WORKER = HERE / "grudge_timed_worker.py"


def available_drains() -> list[str]:
    """The ``drain`` values the installed runtime accepts ([] when it has no such setting)."""
    from grudge_stream.settings import COMMON

    return next((list(s.choices) for s in COMMON if s.name == "drain"), [])


def parse_drains(arg: str) -> list[str | None]:
    """``--drains``: ``auto`` (every drain the runtime has), ``none`` (its default), or a list."""
    if arg == "auto":
        return list(available_drains()) or [None]
    if arg == "none":
        return [None]
    return [d.strip() for d in arg.split(",")]


def run_baseline(mode: str, bootstrap: str, topic: str, partitions: int, records: int, app_id: str,
                 timeout: float, take: int = 0, retries: int = 2) -> dict:
    """One run of faust_baseline_worker.py; retried under a new app id if no event ever arrives.

    A run where Faust stops delivering part way (reason ``stalled``) is kept: its rate is
    that of the events that did arrive, and ``stalled_at`` says how many.
    """
    failures = []
    for attempt in range(retries + 1):
        aid = app_id if attempt == 0 else f"{app_id}-retry{attempt}"
        work = scratch_dir(f"bench-{mode}-")
        out = work / "result.json"
        cmd = [python(), str(BASELINE_WORKER), "--bootstrap", bootstrap, "--topic", topic,
               "--partitions", str(partitions), "--expected", str(records), "--app-id", aid,
               "--mode", mode, "--out", str(out), "--timeout", str(timeout)]
        if take:
            cmd += ["--take", str(take)]
        p = Proc(cmd, work / "worker.log", work)
        deadline = time.monotonic() + timeout + 120
        try:
            while p.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            if p.alive():
                raise RuntimeError(f"{mode} worker did not stop; log:\n{p.log_tail()}")
        finally:
            p.kill()
        if not out.exists():
            raise RuntimeError(f"{mode} worker wrote no result; log:\n{p.log_tail()}")
        r = json.loads(out.read_text())
        if r["reason"] == "no_events" or r["events"] < 1000:
            failures.append({"app_id": aid, "reason": r["reason"], "events": r["events"],
                             "diagnostics": r.get("diagnostics")})
            print(f"# {mode} worker {aid}: {r['reason']} after {r['events']} events; retrying "
                  f"(log {work / 'worker.log'})", flush=True)
            continue
        secs = r["t_last"] - r["t_first"]
        res = {
            "events": r["events"], "seconds": secs, "rate": (r["events"] - 1) / secs,
            "cpu_s": r["cpu_last"] - r["cpu_first"], "cpu_events": r["cpu_events"],
            "rss_kb": r["rss_kb"], "hwm_kb": r["hwm_kb"], "startup_s": r["startup_s"],
            "table_keys": r.get("table_keys"), "failed_attempts": failures,
            "rate_last3q": (r["events"] - r["n_q"]) / (r["t_last"] - r["t_q"])
            if r.get("t_q") and r["t_last"] > r["t_q"] else None,
        }
        if r["reason"] != "complete":
            res["stalled_at"] = r["events"]
            res["stall_reason"] = r["reason"]
            res["diagnostics"] = r.get("diagnostics")
            print(f"# {mode} worker {aid}: {r['reason']} after {r['events']:,} of {records:,} events "
                  f"(log {work / 'worker.log'})", flush=True)
        return res
    raise RuntimeError(f"{mode} worker delivered no events in {retries + 1} attempts: {failures}")


def grudge_settings(run_id: str, topic: str, drain: str | None, extra: dict | None = None) -> dict:
    s = {
        "source_topic": topic,
        "alerts_topic": f"{run_id}-alerts",
        "scores_topic": f"{run_id}-scores",
        "dead_letter_topic": f"{run_id}-dlq",
        "snapshot_topic": f"{run_id}-snapshots",
        "app_name": f"{run_id}-app",
        "operator_id": f"{run_id}-op",
        "levels": 4,
        "cells_per_level": 100_000,
        "checkpoint_interval_s": 5,
        "emit_scores": "crossings",
        "seed": "2b7e151628aed2a6abf7158809cf4f3c",  # a fixed benchmark key (not a secret)
    }
    if drain:
        s["drain"] = drain
    s.update(extra or {})
    return s


def run_grudge(bootstrap: str, topic: str, records: int, run_id: str, drain: str | None, timeout: float,
               poll_s: float, extra: dict | None = None, stop: bool = True, runtime: str | None = None) -> dict:
    """One run of the abuse_scores worker under grudge_timed_worker.py (in-process timestamps).

    /metrics is polled too: for the snapshot figures at the end, and as a cross-check of
    the rate (the first poll that sees events to the first that sees them all).
    """
    work = scratch_dir("bench-grudge-")
    port = free_port()
    out = work / "timing.json"
    cli = grudge_worker_cmd("abuse_scores", bootstrap, port, grudge_settings(run_id, topic, drain, extra),
                            runtime=runtime)
    cmd = [python(), str(TIMED_WORKER), "--out", str(out), "--expected", str(records), "--"] + cli[3:]
    p = Proc(cmd, work / "worker.log", work)
    t_spawn = time.monotonic()
    first = last = None  # (t, events) from /metrics polls
    text = b""
    try:
        deadline = t_spawn + timeout
        while True:
            if not p.alive():
                raise RuntimeError(f"grudge worker exited ({p.proc.returncode}); log:\n{p.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"grudge worker timed out at {last or first}; log:\n{p.log_tail()}")
            status, text = http_get(port, "/metrics", timeout=10)
            t = time.monotonic()
            if status == 200:
                n = metrics_sum(text, "grudge_events_total")
                if n > 0 and first is None:
                    first = (t, n)
                if n >= records and out.exists():
                    last = (t, n)
                    break
            time.sleep(poll_s)
        rss, hwm = p.rss_kb(), p.hwm_kb()
        snap_n = metrics_sum(text, "grudge_snapshots_total")
        snap_s = metrics_sum(text, "grudge_snapshot_duration_seconds_sum")
        snap_bytes = [v for _, v in metric_samples(text, "grudge_snapshot_bytes")]
        alerts = metrics_sum(text, "grudge_alerts_total")
        t_stop = time.monotonic()
        code = p.stop(120) if stop else p.kill()
        stop_s = time.monotonic() - t_stop
    finally:
        p.kill()
    r = json.loads(out.read_text())
    secs = r["t_last"] - r["t_first"]
    poll_rate = (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else None
    return {
        "events": r["events"], "seconds": secs, "rate": r["events"] / secs,
        "cpu_s": r["cpu_last"] - r["cpu_first"], "cpu_events": r["events"], "rss_kb": rss, "hwm_kb": hwm,
        "startup_s": r["t_first"] - t_spawn, "batch_calls": r["calls"],
        "metrics_poll_rate": poll_rate,
        "rate_last3q": (r["events"] - r["n_q"]) / (r["t_last"] - r["t_q"])
        if r.get("t_q") and r["t_last"] > r["t_q"] else None,
        "snapshots": int(snap_n), "snapshot_s_total": snap_s,
        "snapshot_bytes": max(snap_bytes) if snap_bytes else None, "alerts": int(alerts),
        "stop_s": stop_s, "exit_code": code, "log": str(work / "worker.log"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000,
                    help="records (the issue's figure: 1000000, about 35 min for 3 runs of a, b, c)")
    ap.add_argument("--keys", type=int, default=None, help="distinct keys (default: = records)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variants", default="a,b,c",
                    help="subset of a,b,c; d adds the confluent-kafka batch runtime (worker --runtime batch)")
    ap.add_argument("--drains", default="auto",
                    help="drain settings for (c): auto (every value the runtime has), none, or e.g. agent,batch")
    ap.add_argument("--take", type=int, default=0, help="(a) reads take_events(N) batches instead of events")
    ap.add_argument("--poll-s", type=float, default=0.1)
    ap.add_argument("--timeout", type=float, default=None, help="per worker run (default from --records)")
    ap.add_argument("--keep-topics", action="store_true")
    args = ap.parse_args()

    keys = args.keys or args.records
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    drains = parse_drains(args.drains)
    timeout = args.timeout or max(300.0, args.records / 1500.0)
    prefix = f"bench-{uuid.uuid4().hex[:6]}"

    labels: list[tuple[str, str, str | None]] = []  # (label, kind, drain)
    for v in variants:
        if v == "a":
            labels.append(("a bare agent" + (f" take({args.take})" if args.take else ""), "a", None))
        elif v == "b":
            labels.append(("b Faust Table", "b", None))
        elif v == "c":
            for d in drains:
                labels.append((f"c grudge drain={d}" if d else "c grudge", "c", d))
        elif v == "d":
            labels.append(("d grudge --runtime batch", "d", None))
        else:
            raise SystemExit(f"unknown variant {v!r}")

    results: dict[str, list[dict]] = {lab: [] for lab, _, _ in labels}
    loads: list[list[float]] = [loadavg()]
    with broker() as bs:
        topic = f"{prefix}-events"
        print(f"# broker {bs}; producing {args.records:,} records over {keys:,} keys to {topic} "
              f"({args.partitions} partitions)", flush=True)
        info = produce_events(bs, topic, partitions=args.partitions, records=args.records, keys=keys)
        print(f"# produced in {info['produce_seconds']} s; load average {loadavg()}", flush=True)
        try:
            for run in range(args.runs):
                for lab, kind, drain in labels:
                    rid = f"{prefix}-r{run}{kind}{drain or ''}"
                    la = loadavg()
                    if kind == "a":
                        r = run_baseline("count", bs, topic, args.partitions, args.records, rid + "-app",
                                         timeout, take=args.take)
                    elif kind == "b":
                        r = run_baseline("table", bs, topic, args.partitions, args.records, rid + "-app",
                                         timeout)
                    elif kind == "c":
                        r = run_grudge(bs, topic, args.records, rid, drain, timeout, args.poll_s)
                    else:
                        r = run_grudge(bs, topic, args.records, rid, None, timeout, args.poll_s, runtime="batch")
                    r["load_before"] = la
                    results[lab].append(r)
                    loads.append(loadavg())
                    extra = ""
                    if r.get("stalled_at") is not None:
                        extra += f"  STALLED after {r['stalled_at']:,} events (rate over those)"
                    if r.get("failed_attempts"):
                        extra += f"  ({len(r['failed_attempts'])} attempt(s) got no events)"
                    if kind in ("c", "d"):
                        pr = r["metrics_poll_rate"]
                        extra += (f"  snapshots {r['snapshots']} taking {r['snapshot_s_total']:.2f}s, "
                                  f"alerts {r['alerts']}, {r['batch_calls']} process calls, "
                                  f"stop {r['stop_s']:.1f}s, /metrics-poll rate "
                                  f"{'-' if pr is None else f'{pr:,.0f}'}")
                    print(f"run {run + 1}/{args.runs} {lab:24s} {r['rate']:>12,.0f} ev/s  "
                          f"{r['seconds']:7.2f}s  cpu {r['cpu_s']:7.2f}s "
                          f"({1e6 * r['cpu_s'] / r['cpu_events']:.1f} us/ev)  rss {r['rss_kb'] / 1024:.0f} MiB  "
                          f"startup {r['startup_s']:.1f}s  load {la[0]:.2f}{extra}", flush=True)
        finally:
            if not args.keep_topics:
                n = delete_topics(bs, prefix)
                print(f"# deleted {n} topics {prefix}-*", flush=True)

    med = {}
    for lab, rs in results.items():
        if not rs:
            continue
        med[lab] = {
            "rate": statistics.median(r["rate"] for r in rs),
            "rates": [round(r["rate"]) for r in rs],
            "rate_last3q": statistics.median(r["rate_last3q"] or 0.0 for r in rs),
            "cpu_us_per_event": statistics.median(1e6 * r["cpu_s"] / r["cpu_events"] for r in rs),
            "cpu_share": statistics.median(r["cpu_s"] / r["seconds"] for r in rs),
            "rss_mib": statistics.median(r["rss_kb"] / 1024 for r in rs),
            "events_min": min(r["events"] for r in rs),
            "stalled_runs": sum(1 for r in rs if r.get("stalled_at") is not None),
            "no_event_attempts": sum(len(r.get("failed_attempts") or ()) for r in rs),
        }
        for k in ("snapshots", "snapshot_s_total", "alerts"):
            if k in rs[0]:
                med[lab][k] = statistics.median(r[k] for r in rs)

    print()
    print(f"{args.records:,} records, {keys:,} keys, {args.partitions} partitions, median of {args.runs} "
          f"run(s), interleaved; load average before {loads[0]} after {loads[-1]}")
    print(f"{'variant':26s} {'events/s (median)':>18s} {'runs':>30s} {'last 3/4 ev/s':>14s} {'CPU us/ev':>10s} "
          f"{'CPU/wall':>9s} {'RSS MiB':>8s}")
    for lab, m in med.items():
        print(f"{lab:26s} {m['rate']:>18,.0f} {str(m['rates']):>30s} {m['rate_last3q']:>14,.0f} "
              f"{m['cpu_us_per_event']:>10.1f} {m['cpu_share']:>9.2f} {m['rss_mib']:>8.0f}")
    for lab, m in med.items():
        if m["stalled_runs"] or m["no_event_attempts"]:
            print(f"  note: {lab}: {m['stalled_runs']} run(s) stopped receiving events part way (fewest events "
                  f"processed: {m['events_min']:,}); {m['no_event_attempts']} attempt(s) received none and "
                  "were retried under a new app id")
    ratios = {}
    a = next((m["rate"] for lab, m in med.items() if lab.startswith("a ")), None)
    b = next((m["rate"] for lab, m in med.items() if lab.startswith("b ")), None)
    print()
    for lab, m in med.items():
        if not lab.startswith(("c ", "d ")):
            continue
        name = lab[2:].strip()
        if a:
            ratios[f"{name}/a"] = m["rate"] / a
            want = 3.0 if ("drain=batch" in lab or lab.startswith("d ")) else 0.8
            print(f"({name}) / (a) = {m['rate'] / a:5.2f}   target >= {want}: "
                  f"{'met' if m['rate'] / a >= want else 'NOT met'}")
            if "drain=batch" in lab or lab.startswith("d "):
                want08 = m["rate"] / a >= 0.8
                print(f"({name}) / (a) >= 0.8 too: {'met' if want08 else 'NOT met'}")
        if b:
            ratios[f"{name}/b"] = m["rate"] / b
            print(f"({name}) / (b) = {m['rate'] / b:5.2f}   target >= 3: "
                  f"{'met' if m['rate'] / b >= 3 else 'NOT met'}")
    emit({"bench": "faust", "records": args.records, "keys": keys, "partitions": args.partitions,
          "runs": args.runs, "medians": med, "ratios": ratios, "loadavg": [loads[0], loads[-1]],
          "raw": {lab: [{k: v for k, v in r.items() if k != "log"} for r in rs] for lab, rs in results.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
