"""A Faust worker that counts one topic, run as a subprocess by test_faust_broker.py.

Not a test module (pytest does not collect it). It runs a real
``faust.Worker`` against ``kafka://BOOTSTRAP`` and, once it has seen
``--expected`` distinct (partition, offset) pairs or ``--timeout`` seconds
have passed, writes what it saw to ``--out`` as JSON and stops itself with
SIGTERM, the same graceful path a deployed worker takes.

Why a subprocess: a Faust worker owns its event loop, installs signal
handlers (main thread only), configures logging and keeps module-level app
state; a wedged consumer in a subprocess can still be killed by the test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import faust


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--expected", type=int, required=True)
    ap.add_argument("--app-id", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()

    t_start = time.monotonic()
    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        web_enabled=False,
        autodiscover=False,
        datadir=str(Path.cwd() / "faust-data"),
        topic_partitions=args.partitions,  # internal topics (changelog, leader) on the real broker
        topic_replication_factor=1,
        topic_allow_declare=True,
        consumer_auto_offset_reset="earliest",
    )
    source = app.topic(args.topic, key_serializer="raw", value_serializer="raw")
    # A changelog-backed table: Faust creates "<app_id>-key-counts-changelog"
    # itself (auto.create.topics.enable=false on the test broker).
    key_counts = app.Table(
        "key-counts",
        default=int,
        partitions=args.partitions,
        key_type=str,
        value_type=int,
    )

    seen: set[tuple[int, int]] = set()
    per_partition: Counter[int] = Counter()
    keys: set[bytes] = set()
    stats = {"events": 0, "first_event_s": None, "done_s": None}
    finished = asyncio.Event()

    def report(reason: str) -> None:
        if finished.is_set():
            return
        finished.set()
        result = {
            "reason": reason,
            "events": stats["events"],
            "distinct": len(seen),
            "seen": sorted(seen),
            "per_partition": {str(p): n for p, n in sorted(per_partition.items())},
            "distinct_keys": len(keys),
            "table_total": sum(v for _, v in key_counts.items()),
            "table_keys": sum(1 for _ in key_counts),
            "first_event_s": stats["first_event_s"],
            "done_s": round(time.monotonic() - t_start, 3),
        }
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(args.out)
        # Graceful stop through the worker's own SIGTERM handler.
        os.kill(os.getpid(), signal.SIGTERM)

    @app.agent(source)
    async def count(stream):
        async for event in stream.events():
            msg = event.message
            if stats["first_event_s"] is None:
                stats["first_event_s"] = round(time.monotonic() - t_start, 3)
            stats["events"] += 1
            seen.add((msg.partition, msg.offset))
            per_partition[msg.partition] += 1
            keys.add(msg.key)
            key_counts[msg.key.decode()] += 1
            if len(seen) >= args.expected:
                report("complete")

    @app.task
    async def watchdog():
        await asyncio.sleep(args.timeout)
        report("timeout")

    worker = faust.Worker(app, loglevel="WARNING", quiet=True)
    worker.execute_from_commandline()  # raises SystemExit when stopped


if __name__ == "__main__":
    main()
