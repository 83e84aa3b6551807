"""The ``abuse_scores`` job as a Quix Streams application whose state is grudge-stream's.

The same application as benchmarks/peers/quix_app.py (same Quix settings, same source,
same scores: bad +0.04, good -0.001, exponential decay 0.01/s in event time, clamped to
[0, 1], raised at 0.5, cleared at 0.25), with one change: the per-client score lives in a
``ScoreState`` bound through ``grudge_stream.quix`` (a 4 x 100,000-cell split-sign sketch
per partition, the batch worker's default size) instead of Quix's RocksDB state. Alerts
are the state's own (``--alerts-topic``); its snapshots are written at Quix's checkpoints.
So ``run_peers.py --systems quix,quix-grudge`` puts what a Quix user gets from each state
side by side: events per CPU-second, memory, state on disk and in topics, restart time.

Run with the project's interpreter (grudge-stream and quixstreams installed).
Benchmark instrumentation only: the first record prints ``FIRST <epoch_ms>
<process_cpu_ns>``, the ``--expected``-th ``DONE <n> <epoch_ms> <cpu_ns>``.
"""
from __future__ import annotations

import json
import sys
import time

from quix_app import BAD, GOOD, application, parser  # the same app and arguments as Quix's own state

from grudge_stream import quix as grudge
from grudge_stream.hashkey import HashKey
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

SEED = "2b7e151628aed2a6abf7158809cf4f3c"  # the benchmarks' fixed hash key (not a secret)


def main() -> int:
    ap = parser()
    ap.add_argument("--cells", type=int, default=100_000, help="cells per level of the sketch")
    args = ap.parse_args()
    app = application(args)
    source = app.topic(args.topic, key_deserializer="bytes", value_deserializer="bytes")
    judge = grudge.scores(
        app, f"{args.app_id}-abuse", source=source, bootstrap_servers=args.bootstrap,
        hash_key=HashKey.parse(SEED),
        sketch=ScoreSketchConfig(levels=4, cells_per_level=args.cells, decay=Exponential(args.decay_per_s),
                                 lo=0.0, hi=1.0, aggregator="min", hasher="siphash"),
        raise_at=0.5, clear_at=0.25, alerts_topic=args.alerts_topic,
    )

    deltas = {BAD: 0.04, GOOD: -0.001}
    outcomes = {"bad": 0.04, "good": -0.001}
    st = {"n": 0}
    expected = args.expected
    out = sys.stdout

    def delta_of(value: bytes):
        n = st["n"] = st["n"] + 1
        if n == 1:
            out.write(f"FIRST {int(time.time() * 1000)} {time.process_time_ns()}\n")
            out.flush()
        if n == expected:
            out.write(f"DONE {n} {int(time.time() * 1000)} {time.process_time_ns()}\n")
            out.flush()
        delta = deltas.get(value)
        if delta is None:
            try:
                delta = outcomes.get(json.loads(value).get("outcome"))
            except (ValueError, AttributeError):
                delta = None
        return delta

    sdf = app.dataframe(source)
    sdf = judge.update(sdf, delta_of, key_of=lambda value, key: key or None)  # noqa: F841 - the app runs it
    out.write(f"START {int(time.time() * 1000)}\n")
    out.flush()
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
