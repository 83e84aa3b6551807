"""Baseline Faust workers for bench_faust.py and bench_faust_memory.py (run as a subprocess).

Two agents over the same event topic (JSON ``{"outcome": ...}`` keyed by client id, record
timestamp = event time), both plain faust-streaming with the ``kafka://`` (aiokafka) driver,
the memory store and raw serializers:

- ``--mode count``: (a) the bare agent; it only counts events (``--take N`` reads
  ``stream.take_events(N, within)`` batches instead of one event at a time);
- ``--mode incr``: the agent increments a per-key count in a Faust Table
  (``counts[key] += 1``, changelogged): what a Table costs an agent per event;
- ``--mode state``: the agent updates a grudge-stream ``ScoreState`` attached to the app
  (``abuse.update(key, delta)``; levels 4, 100,000 cells per level, snapshots every 5 s):
  what the embedded state costs an agent per event (benchmarks/bench_faust_agent.py);
- ``--mode table``: (b) the exact baseline: a Faust Table ``scores`` (changelogged, one
  changelog partition per source partition) whose value per client is
  ``(score, last_ms)`` packed as 16 bytes; on each event the score decays
  exponentially to the record timestamp and the outcome's delta is added, clamped to [0, 1]
  (bad +0.04, good -0.001, lambda 0.01/s: the abuse_scores topology's defaults). Late
  events are weighted by exp(-lambda * lateness), as the sketch operator does.

The worker measures inside its own process: the monotonic time and process CPU time
(all threads) when the first event reaches the agent and when the ``--expected``-th
does, plus VmRSS / VmHWM at that moment. It writes them to ``--out`` as JSON and stops
itself with SIGTERM (Faust's graceful path).

It also stops by itself when events stop arriving: no event for ``--stall-s`` seconds
after the first (reason ``stalled``; the times then cover the events that did arrive),
no event at all within ``--start-timeout`` seconds (``no_events``), or ``--timeout``.
On a stall the consumer's flow-control state and aiokafka's partition positions are
logged and put in the result. (The one cause seen so far was the broker deleting the
event topic under the consumer: records stamped years in the past fall outside the
default 7-day retention. kafkabench.produce_events now stamps recent times and
disables retention on the topics it creates.)
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


def consumer_state(app: faust.App) -> dict:
    """Faust's flow-control view and aiokafka's partition states (diagnostics only)."""
    c = app.consumer
    out: dict = {
        "flow_active": c.flow_active,
        "active": sorted(f"{tp.topic}/{tp.partition}" for tp in (c._active_partitions or ())),
        "buffered": sorted(f"{tp.topic}/{tp.partition}" for tp in c._buffered_partitions),
        "paused": sorted(f"{tp.topic}/{tp.partition}" for tp in c._paused_partitions),
    }
    try:
        f = c._thread._consumer._fetcher
        assignment = f._subscriptions.subscription.assignment
        aio = {}
        for tp in sorted(assignment.tps):
            s = assignment.state_value(tp)
            aio[f"{tp.topic}/{tp.partition}"] = {
                "position": s.position if s.has_valid_position else None, "paused": s.paused,
                "buffered": type(f._records[tp]).__name__ if tp in f._records else None}
        out["aiokafka"] = aio
    except Exception as exc:  # noqa: BLE001 - private attributes; diagnostics only
        out["aiokafka_error"] = repr(exc)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--expected", type=int, required=True)
    ap.add_argument("--app-id", required=True)
    ap.add_argument("--mode", choices=("count", "incr", "state", "table"), required=True)
    ap.add_argument("--take", type=int, default=0, help="count mode: take_events batch size (0 = per event)")
    ap.add_argument("--decay-per-s", type=float, default=0.01)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--stall-s", type=float, default=30.0)
    ap.add_argument("--start-timeout", type=float, default=90.0)
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

    # t_first/cpu_first: first event; t_last: newest event; (tick_n, tick_cpu): the CPU
    # clock sampled once a second together with the event count.
    # (t_q, n_q): clock and count at a quarter of the records (rate over the last 3/4).
    st: dict = {"n": 0, "t_first": None, "cpu_first": None, "t_last": None, "tick_n": 0, "tick_cpu": None,
                "t_q": None, "n_q": None}
    quarter = args.expected // 4
    done = asyncio.Event()
    t_start = time.monotonic()
    table = None

    def report(reason: str, diag: dict | None = None) -> None:
        if done.is_set():
            return
        done.set()
        complete = reason == "complete"
        result = {
            "reason": reason,
            "mode": args.mode,
            "events": st["n"],
            "t_first": st["t_first"],
            "t_last": st["t_last"],
            "cpu_first": st["cpu_first"],
            # On a stall the CPU clock is read at the last tick that saw progress.
            "cpu_last": time.process_time() if complete else st["tick_cpu"],
            "cpu_events": st["n"] if complete else st["tick_n"],
            "startup_s": None if st["t_first"] is None else st["t_first"] - t_start,
            "t_q": st["t_q"], "n_q": st["n_q"],
            "rss_kb": status_kb("VmRSS"),
            "hwm_kb": status_kb("VmHWM"),
            "table_keys": len(table) if table is not None else None,
            "diagnostics": diag,
        }
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(args.out)
        os.kill(os.getpid(), signal.SIGTERM)

    def first() -> None:
        st["t_first"] = time.monotonic()
        st["cpu_first"] = time.process_time()

    expected = args.expected
    mono = time.monotonic

    if args.mode == "count":
        if args.take:
            @app.agent(source)
            async def count_batches(stream):
                async for events in stream.take_events(args.take, within=0.05):
                    if st["t_first"] is None:
                        first()
                    st["n"] += len(events)
                    st["t_last"] = mono()
                    if st["t_q"] is None and st["n"] >= quarter:
                        st["t_q"], st["n_q"] = st["t_last"], st["n"]
                    if st["n"] >= expected:
                        report("complete")
        else:
            @app.agent(source)
            async def count(stream):
                async for _event in stream.events():
                    if st["t_first"] is None:
                        first()
                    st["n"] += 1
                    st["t_last"] = mono()
                    if st["n"] == quarter:
                        st["t_q"], st["n_q"] = st["t_last"], st["n"]
                    if st["n"] >= expected:
                        report("complete")
    elif args.mode == "incr":
        # An 8-byte count (the app's serializers are raw): the changelog carries the packed value.
        table = app.Table("counts", partitions=args.partitions, default=int, key_type=bytes, value_type=bytes)
        count_of = struct.Struct("<q")

        @app.agent(source)
        async def incr(stream):
            async for event in stream.events():
                if st["t_first"] is None:
                    first()
                key = event.message.key
                old = table.get(key)
                table[key] = count_of.pack((count_of.unpack(old)[0] if old else 0) + 1)
                st["n"] += 1
                st["t_last"] = mono()
                if st["n"] == quarter:
                    st["t_q"], st["n_q"] = st["t_last"], st["n"]
                if st["n"] >= expected:
                    report("complete")
    elif args.mode == "state":
        from grudge_stream import faust as grudge
        from grudge_stream.hashkey import HashKey
        from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

        abuse = grudge.scores(app, f"{args.app_id}-abuse", source=source,
                              hash_key=HashKey.parse("2b7e151628aed2a6abf7158809cf4f3c"),  # a benchmark key
                              sketch=ScoreSketchConfig(levels=4, cells_per_level=100_000,
                                                       decay=Exponential(args.decay_per_s), lo=0.0, hi=1.0,
                                                       hasher="siphash"),
                              raise_at=0.5, clear_at=0.25, checkpoint_interval_s=5.0)
        update = abuse.update

        @app.agent(source)
        async def judge(stream):
            async for event in stream.events():
                if st["t_first"] is None:
                    first()
                msg = event.message
                delta = DELTAS.get(msg.value)
                if delta is not None:
                    update(msg.key, delta)
                st["n"] += 1
                st["t_last"] = mono()
                if st["n"] == quarter:
                    st["t_q"], st["n_q"] = st["t_last"], st["n"]
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
                st["t_last"] = mono()
                if st["n"] == quarter:
                    st["t_q"], st["n_q"] = st["t_last"], st["n"]
                if st["n"] >= expected:
                    report("complete")

    @app.timer(1.0)
    async def watchdog():
        now = mono()
        if st["n"] != st["tick_n"] or st["tick_cpu"] is None:
            st["tick_n"], st["tick_cpu"] = st["n"], time.process_time()
        if now - t_start > args.timeout:
            report("timeout", consumer_state(app))
        elif st["t_last"] is None and now - t_start > args.start_timeout:
            diag = consumer_state(app)
            print("no events:", json.dumps(diag), flush=True)
            report("no_events", diag)
        elif st["t_last"] is not None and now - st["t_last"] > args.stall_s:
            diag = consumer_state(app)
            print(f"stalled after {st['n']} events:", json.dumps(diag), flush=True)
            report("stalled", diag)

    worker = faust.Worker(app, loglevel="WARNING", quiet=True)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
