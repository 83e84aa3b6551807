"""grudge-stream state in a confluent-kafka consumer loop of your own.

The loop reads ``logins`` (JSON ``{"outcome": "bad"}`` or ``"good"``, keyed by the
user), keeps a decaying abuse score per user in a ``ScoreState`` and gets alerts on
``<app>-abuse-alerts``. What the state asks of the loop:

1. ``state.start()`` once; ``state.assign(partitions)`` in the assignment callback,
   seeking each partition to the offset it returns (its snapshot's);
2. ``state.update(key, delta, partition=, offset=, timestamp_ms=)`` per event;
3. ``state.checkpoint()`` before each commit, committing exactly the offsets it
   returns (never past a durable snapshot, never before the outputs are delivered);
4. ``state.revoke(partitions)`` when partitions go, ``state.close()`` at the end.

Kill it at any moment: after a restart the state is what an uninterrupted run would
hold, and every alert it emits is one an uninterrupted run emits (with the same id).

    export GRUDGE_SEED=$(python -c 'import secrets; print(secrets.token_hex(16))')
    python examples/own_loop.py

Environment: as examples/faust_app/app.py (``KAFKA_BOOTSTRAP_SERVERS``, ``GRUDGE_SEED``,
``EXAMPLE_APP_ID``, ``EXAMPLE_SOURCE``).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import time

from confluent_kafka import Consumer, TopicPartition

from grudge_stream.hashkey import HashKey
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
from grudge_stream.state import ScoreState

APP_ID = os.environ.get("EXAMPLE_APP_ID", "shop-guard")
SOURCE = os.environ.get("EXAMPLE_SOURCE", "logins")
BROKER = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
DELTAS = {"bad": 0.04, "good": -0.001}
COMMIT_INTERVAL_S = 2.0

abuse = ScoreState(
    f"{APP_ID}-abuse", source_topic=SOURCE, bootstrap_servers=BROKER,
    hash_key=HashKey.parse(os.environ["GRUDGE_SEED"]),
    sketch=ScoreSketchConfig(levels=4, cells_per_level=20_000, decay=Exponential(0.01), lo=0.0, hi=1.0,
                             aggregator="min", hasher="siphash"),
    raise_at=0.5, clear_at=0.25,
)


def outcome_of(value: bytes | None) -> str | None:
    """The event's outcome, or None for a payload this loop does not understand."""
    try:
        outcome = json.loads(value or b"").get("outcome")
    except (ValueError, AttributeError):
        return None
    return outcome if outcome in DELTAS else None


def commit(consumer: Consumer, offsets: dict[int, int]) -> None:
    if offsets:
        consumer.commit(offsets=[TopicPartition(SOURCE, p, o) for p, o in offsets.items()], asynchronous=False)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    abuse.start()
    consumer = Consumer({"bootstrap.servers": BROKER, "group.id": APP_ID, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})

    def on_assign(c, partitions):
        positions = abuse.assign([tp.partition for tp in partitions])
        for tp in partitions:
            if positions.get(tp.partition) is not None:
                tp.offset = positions[tp.partition]  # resume exactly where the snapshot stands
        c.assign(partitions)

    def on_revoke(c, partitions):
        parts = [tp.partition for tp in partitions]
        commit(c, {p: o for p, o in abuse.checkpoint().items() if p in parts})
        abuse.revoke(parts, snapshot=False)  # just snapshotted

    consumer.subscribe([SOURCE], on_assign=on_assign, on_revoke=on_revoke)
    last = time.monotonic()
    try:
        while not stop:
            for m in consumer.consume(500, timeout=0.5):
                if m.error():
                    continue
                outcome = outcome_of(m.value())
                if outcome is not None and m.key():
                    abuse.update(m.key(), DELTAS[outcome], partition=m.partition(), offset=m.offset(),
                                 timestamp_ms=m.timestamp()[1])
            if time.monotonic() - last >= COMMIT_INTERVAL_S:
                # Positions: every record below them is done with (applied or skipped on purpose).
                positions = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())
                             if tp.offset >= 0}
                commit(consumer, abuse.checkpoint(positions))
                last = time.monotonic()
        positions = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment()) if tp.offset >= 0}
        commit(consumer, abuse.checkpoint(positions))
    finally:
        consumer.close()  # its revocation callback snapshots and commits
        abuse.close(snapshot=False)


if __name__ == "__main__":
    main()
