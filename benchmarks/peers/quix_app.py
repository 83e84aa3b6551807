"""The grudge-stream ``abuse_scores`` job, exact per key, as a Quix Streams 3.x application.

Run by benchmarks/peers/run_peers.py with the interpreter of its own virtualenv
(``.cache/peers/quix-venv``, quixstreams pinned there), never the project's.

One ``StreamingDataFrame`` over the source topic: a stateful ``apply`` keeps, per client,
``[score, last_ms, raised]`` in the application's RocksDB state (changelog topic, checkpoint
every ``--commit-interval`` seconds: Quix Streams' defaults, at-least-once or exactly-once),
and returns an alert on each crossing, which ``to_topic`` writes to the alerts topic.
Semantics are those of FeedbackScoreOperator (grudge_stream/operators/scores.py) with an
exact score: bad +0.04, good -0.001, exponential decay in event time (the record
timestamp; an event older than the key's reference time has its delta weighted by
exp(-lambda * lateness)), clamped to [0, 1], raised at 0.5, cleared at 0.25 or below.
Quix Streams 3.x has no timers, so the sweep that clears raised clients gone quiet (every
10 s of event time) is not done here; no workload in run_peers.py spans a sweep interval.

Benchmark instrumentation only: the first record processed prints
``FIRST <epoch_ms> <process_cpu_ns>``, the ``--expected``-th ``DONE <n> <epoch_ms> <cpu_ns>``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

from quixstreams import Application, message_context

BAD = b'{"outcome":"bad"}'
GOOD = b'{"outcome":"good"}'


def parser() -> argparse.ArgumentParser:
    """The arguments run_peers.py gives a Quix peer app (this one and quix_grudge_app.py)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--app-id", required=True)
    ap.add_argument("--alerts-topic", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--expected", type=int, default=0)
    ap.add_argument("--commit-interval", type=float, default=5.0)
    ap.add_argument("--eos", action="store_true")
    ap.add_argument("--decay-per-s", type=float, default=0.01)
    ap.add_argument("--instance-id", default="", help="static membership (group.instance.id)")
    return ap


def application(args: argparse.Namespace) -> Application:
    """The Quix application of a peer app, configured alike for both states."""
    return Application(
        broker_address=args.bootstrap,
        consumer_group=args.app_id,
        auto_offset_reset="earliest",
        commit_interval=args.commit_interval,
        state_dir=args.state_dir,
        processing_guarantee="exactly-once" if args.eos else "at-least-once",
        loglevel="WARNING",
        consumer_extra_config={"group.instance.id": args.instance_id} if args.instance_id else None,
    )


def main() -> int:
    args = parser().parse_args()
    app = application(args)
    source = app.topic(args.topic, key_deserializer="bytes", value_deserializer="bytes")
    alerts = app.topic(args.alerts_topic, key_serializer="bytes", value_serializer="bytes")

    lam = args.decay_per_s / 1000.0
    deltas = {BAD: 0.04, GOOD: -0.001}
    outcomes = {"bad": 0.04, "good": -0.001}
    exp = math.exp
    st = {"n": 0}
    expected = args.expected
    out = sys.stdout

    def score(value: bytes, key: bytes, timestamp: int, headers, state):
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
            if delta is None:
                return None
        old = state.get("v")
        if old is None:
            s, last, raised = 0.0, timestamp, False
        else:
            s, last, raised = old
        if timestamp >= last:
            s *= exp(-lam * (timestamp - last))
            last = timestamp
        else:
            delta *= exp(-lam * (last - timestamp))
        s = min(1.0, max(0.0, s + delta))
        crossing = None
        if raised:
            if s <= 0.25:
                raised, crossing = False, "cleared"
        elif s >= 0.5:
            raised, crossing = True, "raised"
        state.set("v", [s, last, raised])
        if crossing is None:
            return None
        ctx = message_context()
        return json.dumps({"key": key.decode("utf-8", "replace"), "state": crossing, "score": s,
                           "event_time_ms": last,
                           "source": {"partition": ctx.partition, "offset": ctx.offset}},
                          separators=(",", ":")).encode()

    sdf = app.dataframe(source)
    sdf = sdf.apply(score, stateful=True, metadata=True)
    sdf = sdf.filter(lambda v: v is not None)
    sdf.to_topic(alerts)
    out.write(f"START {int(time.time() * 1000)}\n")
    out.flush()
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
