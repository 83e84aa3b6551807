"""Every shipped operator in process, without a broker: events per second through
``process`` (records, as the runtimes hand operators that read headers) and
``process_columns`` (columns, as they hand every other operator), batches of one
partition's records.

The workload per topology: ``--keys`` uniform keys, timestamps 1 ms apart with 1% of
events late by up to a minute, valid payloads with 1% undecodable ones.

Run: .venv/bin/python benchmarks/bench_operators.py [--events 300000] [--runs 3]
Side by side with another installation: benchmarks/ab.py --against OTHER/bin/python bench_operators.py
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import emit  # noqa: E402

from grudge_stream.operators.records import SourceRecord  # noqa: E402
from grudge_stream.topology import Settings, load_topology  # noqa: E402

SEED = "00112233445566778899aabbccddeeff"
T0 = 1_700_000_000_000
PAYLOADS = {
    "abuse_scores": [b'{"outcome":"good"}'] * 49 + [b'{"outcome":"bad"}'],
    "rate_limit": [b'{"cost":1}', b'{"cost":2}'],
    "heavy_hitters": [b""],
    "dedup": [b"payload"],
    "known_keys": [b'{"event":"seen"}', b'{"event":"accepted"}'],
}


def workload(name: str, n: int, keys: int, batch: int, topic: str) -> list[list[SourceRecord]]:
    rnd = random.Random(7)
    pay = PAYLOADS[name]
    recs = []
    for i in range(n):
        ts = T0 + i - (rnd.randrange(60_000) if rnd.random() < 0.01 else 0)
        value = b"{junk" if rnd.random() < 0.01 else rnd.choice(pay)
        recs.append(SourceRecord(topic, 0, i, ts, b"client-%d" % rnd.randrange(keys), value,
                                 [("request-id", b"r%d" % i)]))
    return [recs[s:s + batch] for s in range(0, n, batch)]


def run(name: str, batches: list[list[SourceRecord]], columns: bool) -> float:
    topo = load_topology(name, Settings({"seed": SEED}, environ={}))
    op = topo.make_operator(0)
    topic = topo.source_topic
    cols = [([r.offset for r in b], [r.timestamp_ms for r in b], [bytes(r.key) for r in b], [r.value for r in b])
            for b in batches] if columns else None
    now = T0 + sum(len(b) for b in batches)
    t0 = time.perf_counter()
    if cols is not None:
        for c in cols:
            op.process_columns(topic, 0, *c, processing_ms=now)
    else:
        for b in batches:
            op.process(b, processing_ms=now)
    return sum(len(b) for b in batches) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=2_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--topologies", default=",".join(PAYLOADS))
    args = ap.parse_args()
    summary: dict[str, dict[str, float]] = {}
    for name in args.topologies.split(","):
        topic = load_topology(name, Settings({"seed": SEED}, environ={})).source_topic
        batches = workload(name, args.events, args.keys, args.batch, topic)
        for columns in (False, True):
            rates = [run(name, batches, columns) for _ in range(args.runs)]
            summary.setdefault(name, {})["columns_per_s" if columns else "records_per_s"] = statistics.median(rates)
            print(f"{name:14s} {'columns' if columns else 'records':8s} {statistics.median(rates) / 1e3:9.1f} k events/s "
                  f"(runs: {', '.join(f'{r / 1e3:.1f}' for r in rates)})", flush=True)
    emit(summary)


if __name__ == "__main__":
    main()
