"""Baseline Faust workers for bench_faust.py and bench_faust_memory.py (run as a subprocess).

Two agents over the same event topic (JSON ``{"outcome": ...}`` keyed by client id, record
timestamp = event time), both plain faust-streaming with the ``kafka://`` (aiokafka) driver,
the memory store and raw serializers:

- ``--mode count``: (a) the bare agent; it only counts events (``--take N`` reads
  ``stream.take_events(N, within)`` batches instead of one event at a time);
- ``--mode table``: (b) the exact baseline: a Faust Table ``scores`` (changelogged, one
  changelog partition per source partition) whose value per client is
  ``(score, last_ms)`` packed as 16 bytes; on each event the score decays
  exponentially to the record timestamp and the outcome's delta is added, clamped to [0, 1]
  (bad +0.04, good -0.001, lambda 0.01/s: the abuse_scores topology's defaults). Late
  events are weighted by exp(-lambda * lateness), as the sketch operator does.

The worker measures inside its own process: the monotonic time and process CPU time
(all threads) when the first event reaches the agent and when the ``--expected``-th
does, plus VmRSS / VmHWM at that moment. It writes them to ``--out`` as JSON and stops
itself with SIGTERM (Faust's graceful path); ``--timeout`` bounds the run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import struct
import time
from pathlib import Path

import faust

VALUE = struct.Struct("<dq")  # score, last event time (ms)
DELTAS = {b'{"outcome":"bad"}': 0.04, b'{"outcome":"good"}': -0.001}


def status_kb(field: str) -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--expected", type=int, required=True)
    ap.add_argument("--app-id", required=True)
    ap.add_argument("--mode", choices=("count", "table"), required=True)
    ap.add_argument("--take", type=int, default=0, help="count mode: take_events batch size (0 = per event)")
    ap.add_argument("--decay-per-s", type=float, default=0.01)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()

    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        web_enabled=False,
        autodiscover=False,
        datadir=str(Path.cwd() / "faust-data"),
        topic_partitions=args.partitions,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
    )
    source = app.topic(args.topic, key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")

    st = {"n": 0, "t_first": None, "cpu_first": None, "wall_first": None}
    done = asyncio.Event()
    t_start = time.monotonic()

    def report(reason: str) -> None:
        if done.is_set():
            return
        done.set()
        result = {
            "reason": reason,
            "mode": args.mode,
            "events": st["n"],
            "t_first": st["t_first"],
            "t_last": time.monotonic(),
            "cpu_first": st["cpu_first"],
            "cpu_last": time.process_time(),
            "wall_first": st["wall_first"],
            "wall_last": time.time(),
            "startup_s": None if st["t_first"] is None else st["t_first"] - t_start,
            "rss_kb": status_kb("VmRSS"),
            "hwm_kb": status_kb("VmHWM"),
            "table_keys": len(table) if table is not None else None,
        }
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(args.out)
        os.kill(os.getpid(), signal.SIGTERM)

    def first() -> None:
        st["t_first"] = time.monotonic()
        st["cpu_first"] = time.process_time()
        st["wall_first"] = time.time()

    expected = args.expected
    table = None

    if args.mode == "count":
        if args.take:
            @app.agent(source)
            async def count_batches(stream):
                async for events in stream.take_events(args.take, within=0.05):
                    if st["t_first"] is None:
                        first()
                    st["n"] += len(events)
                    if st["n"] >= expected:
                        report("complete")
        else:
            @app.agent(source)
            async def count(stream):
                async for _event in stream.events():
                    if st["t_first"] is None:
                        first()
                    st["n"] += 1
                    if st["n"] >= expected:
                        report("complete")
    else:
        # The app's key/value serializers are raw, so the changelog carries the packed bytes.
        table = app.Table("scores", partitions=args.partitions, key_type=bytes, value_type=bytes)
        lam_per_ms = args.decay_per_s / 1000.0
        exp = math.exp
        pack, unpack = VALUE.pack, VALUE.unpack

        @app.agent(source)
        async def scores(stream):
            async for event in stream.events():
                if st["t_first"] is None:
                    first()
                msg = event.message
                delta = DELTAS.get(msg.value)
                if delta is not None:
                    ts = int(round(msg.timestamp * 1000))
                    old = table.get(msg.key)
                    if old is None:
                        score, last = 0.0, ts
                    else:
                        score, last = unpack(old)
                    if ts >= last:
                        score *= exp(-lam_per_ms * (ts - last))
                        last = ts
                    else:
                        delta *= exp(-lam_per_ms * (last - ts))
                    score = min(1.0, max(0.0, score + delta))
                    table[msg.key] = pack(score, last)
                st["n"] += 1
                if st["n"] >= expected:
                    report("complete")

    @app.task
    async def watchdog():
        await asyncio.sleep(args.timeout)
        report("timeout")

    worker = faust.Worker(app, loglevel="WARNING", quiet=True)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
