"""The abuse_scores operator's column path in process, without a broker: CPU per event of
what a batch worker does with one partition's batch once it is consumed (decode, validate,
the sketch batch, the alert latch), the part of the worker the runtime cannot hide.

Builds one operator per partition from the topology (as a worker does), then feeds it
batches of ``--batch`` records of one partition, as columns (offsets, timestamps, keys,
values; each key a fresh bytes object, as a consumed message's is): the bench_batch.py
workload (uniform clients, 2% bad outcomes, every 5000th client abusive).

Run: .venv/bin/python benchmarks/bench_operator.py [--events 2000000] [--runs 5]
Side by side with another installation: benchmarks/ab.py --against OTHER/bin/python bench_operator.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import BENCH_KEY, PARTS, abuse_draw, abuse_value, emit  # noqa: E402

from grudge_stream.topology import Settings, load_topology  # noqa: E402


def workload(n: int, keys: int, batch: int) -> list[tuple[int, list, list, list, list]]:
    """``(partition, offsets, timestamps, keys, values)`` batches, each of one partition's
    records in offset order, partitions taken in turn: bench_batch.py's events."""
    ks, draw = abuse_draw(n, keys)
    t0 = 1_700_000_000_000
    per_part: list[list[tuple[int, int]]] = [[] for _ in range(PARTS)]
    for i in range(n):
        per_part[int(ks[i]) % PARTS].append((i, int(ks[i])))
    by_part = []
    for p, rows in enumerate(per_part):
        mine = []
        for s in range(0, len(rows), batch):
            chunk = rows[s:s + batch]
            mine.append((p, list(range(s, s + len(chunk))), [t0 + i // 2000 for i, _ in chunk],
                         [b"client-%08d" % k for _, k in chunk],
                         [abuse_value(k, draw[i]) for i, k in chunk]))
        by_part.append(mine)
    return [m[r] for r in range(max(len(m) for m in by_part)) for m in by_part if r < len(m)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=2_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    settings = Settings({
        "source_topic": "bench-events", "operator_id": "bench-op",
        "seed": BENCH_KEY,
    }, environ={})
    topology = load_topology("abuse_scores", settings)
    batches = workload(args.events, args.keys, args.batch)
    cpu_ns: list[float] = []
    outputs = 0
    for _ in range(args.runs):
        ops = [topology.make_operator(p) for p in range(PARTS)]
        outputs = 0
        t = time.process_time_ns()
        for p, offs, tss, ks, vs in batches:
            outputs += len(ops[p].process_columns(topology.source_topic, p, offs, tss, ks, vs))
        cpu_ns.append((time.process_time_ns() - t) / args.events)
    med = statistics.median(cpu_ns)
    print(f"abuse_scores process_columns, {args.events:,} events over {args.keys:,} keys, "
          f"batches of {args.batch:,}: {med:.0f} ns CPU/event (median of {args.runs}; runs "
          f"{', '.join(f'{x:.0f}' for x in cpu_ns)}); {outputs:,} outputs; load {os.getloadavg()[0]:.1f}")
    emit({"cpu_ns_per_event": med, "outputs": outputs})


if __name__ == "__main__":
    main()
