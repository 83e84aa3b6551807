"""``grudge-stream worker ...`` with in-process timestamps of the first and last record processed.

Usage (what bench_faust.py runs)::

    python benchmarks/grudge_timed_worker.py --out RESULT.json --expected N -- worker abuse_scores ...

Everything after ``--`` goes to ``grudge_stream.cli.main`` unchanged, so the worker is the
product's own, in this very process. The only addition is a thin wrapper around
``PartitionSlot.process`` and ``PartitionSlot.process_columns`` (the per-partition entry
points of every runtime and drain path): it notes the monotonic clock and the process CPU
clock (all threads) when the first record arrives, counts the records handed in, and when
the count reaches ``--expected`` writes the first/last times to ``--out``. Cost: two clock
reads per batch call. With ``--trace FILE`` it also writes one line per call (wall-clock
start and end, partition, first and last offset, record count), which
bench_alert_latency.py uses to split a latency into "until processed" and "after".

Why not poll /metrics only: with the batch drain a whole backlog is processed with few
returns to the event loop, so the web page answers late and a poll's timestamp says little
about when the records were processed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        raise SystemExit("usage: grudge_timed_worker.py --out FILE --expected N -- <grudge-stream args>")
    i = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--expected", type=int, required=True)
    ap.add_argument("--trace", type=Path, default=None,
                    help="append one line per process call: wall_start wall_end partition first_offset "
                         "last_offset records (for latency breakdowns)")
    ap.add_argument("--fetch-max-wait-ms", type=int, default=None,
                    help="experiment: override the fetch.max.wait.ms that faust-streaming 0.15.3 hardcodes "
                         "(1500) for its aiokafka consumer")
    args = ap.parse_args(argv[:i])
    cli_args = argv[i + 1:]

    if args.fetch_max_wait_ms is not None:
        from faust.transport.drivers import aiokafka as faust_aiokafka

        orig_create = faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer

        def create_worker_consumer(self, transport):
            consumer = orig_create(self, transport)
            consumer._fetch_max_wait_ms = args.fetch_max_wait_ms  # read when the fetcher starts
            return consumer

        faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer = create_worker_consumer

    from grudge_stream import partitions

    # (t_q, n_q): the clock and count when a quarter of the records is done; the rate over
    # the last three quarters leaves out the backlog the consumer prefetched before the
    # first record was processed (aiokafka fetches up to 1 MB per partition ahead).
    st = {"n": 0, "t_first": None, "cpu_first": None, "written": False, "calls": 0, "t_q": None, "n_q": None}
    quarter = args.expected // 4
    mono, cpu = time.monotonic, time.process_time

    def before() -> None:
        if st["t_first"] is None:
            st["t_first"], st["cpu_first"] = mono(), cpu()

    def after(n: int) -> None:
        st["n"] += n
        st["calls"] += 1
        if st["t_q"] is None and st["n"] >= quarter:
            st["t_q"], st["n_q"] = mono(), st["n"]
        if not st["written"] and st["n"] >= args.expected:
            st["written"] = True
            result = {"events": st["n"], "t_first": st["t_first"], "t_last": mono(),
                      "cpu_first": st["cpu_first"], "cpu_last": cpu(), "calls": st["calls"],
                      "t_q": st["t_q"], "n_q": st["n_q"]}
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result))
            tmp.replace(args.out)

    trace = open(args.trace, "a", buffering=1) if args.trace is not None else None
    wall = time.time

    def traced(slot, first_off, last_off, n, t0) -> None:
        if trace is not None and n:
            trace.write(f"{t0:.6f} {wall():.6f} {slot.partition} {first_off} {last_off} {n}\n")

    orig_process = partitions.PartitionSlot.process
    orig_columns = getattr(partitions.PartitionSlot, "process_columns", None)

    def process(self, records):
        before()
        t0 = wall()
        out = orig_process(self, records)
        if records:
            traced(self, records[0].offset, records[-1].offset, len(records), t0)
        after(len(records))
        return out

    partitions.PartitionSlot.process = process
    if orig_columns is not None:
        def process_columns(self, topic, offsets, *rest, **kw):
            before()
            t0 = wall()
            out = orig_columns(self, topic, offsets, *rest, **kw)
            if len(offsets):
                traced(self, offsets[0], offsets[-1], len(offsets), t0)
            after(len(offsets))
            return out

        partitions.PartitionSlot.process_columns = process_columns

    from grudge_stream.cli import main as cli_main

    return int(cli_main(cli_args) or 0)


if __name__ == "__main__":
    sys.exit(main())
