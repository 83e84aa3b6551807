"""Per-event cost of embedded state (``grudge_stream.state.ScoreState``), side by side:

- ``sketch``: the bare ``ScoreSketch.update_and_query`` per event (the floor);
- ``dict``: ``d[k] = d.get(k, 0.0) + delta`` per event (what a Faust Table's dict costs
  before its changelog);
- ``state.update``: the per-call API, as an agent calls it;
- ``state.update_many``: the batch form over columns a loop has (keys, deltas,
  partitions, offsets, timestamps), the batch worker's column pipeline;
- ``state.update_messages``: the batch form over confluent-kafka ``Message`` lists
  consumed from the broker (the columns taken out of the messages included);
- ``operator.process_columns``: the batch worker's own per-event CPU for the same
  events (its operator over one partition's raw JSON payloads; no Kafka I/O).

The same events for all: ``--events`` over ``--keys`` uniform keys on ``--partitions``
partitions, 2% of them bad (+0.04, else -0.001), timestamps 1 ms apart. The state needs
a broker (its topics, its producer; no alert is raised at this threshold, so the figures
are the CPU of the calls): KAFKA_BOOTSTRAP_SERVERS, or the dev broker started here.
Medians of ``--runs`` runs (each on new offsets, so nothing is skipped), in CPU time of
the calling thread (``time.thread_time``): what the calls cost the loop, and a figure
that holds on a machine shared with other work, where wall time does not.

Run: .venv/bin/python benchmarks/bench_embedded.py [--events 200000] [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
import zlib

sys.path.insert(0, os.path.dirname(__file__))
from common import BENCH_KEY, emit  # noqa: E402

from grudge_stream.hashkey import HashKey  # noqa: E402
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig  # noqa: E402
from grudge_stream.state import ScoreState  # noqa: E402

T0 = int(time.time() * 1000) - 86_400_000  # a day ago: no run reaches the future bound
CONFIG = ScoreSketchConfig(levels=4, cells_per_level=100_000, decay=Exponential(0.01), lo=0.0, hi=1.0,
                           aggregator="min", hasher="siphash")


def events(n: int, keys: int, partitions: int) -> tuple[list, list, list, list]:
    rnd = random.Random(7)
    ks = [f"user-{rnd.randrange(keys)}".encode() for _ in range(n)]
    deltas = [0.04 if rnd.random() < 0.02 else -0.001 for _ in range(n)]
    parts = [zlib.crc32(k) % partitions for k in ks]
    return ks, deltas, parts, [T0 + i for i in range(n)]


def per_event_us(fn, n: int, runs: int) -> tuple[float, list[float]]:
    samples = []
    for r in range(runs + 1):  # the first run warms up
        t0 = time.thread_time()
        fn(r)
        if r:
            samples.append((time.thread_time() - t0) / n * 1e6)
    return statistics.median(samples), samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    n, runs, parts_n = args.events, args.runs, args.partitions
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        from grudge_devkafka import LocalKafka

        broker = LocalKafka(quiet=True)
        bootstrap = broker.start()
    try:
        run_all(bootstrap, n, args.keys, parts_n, runs)
    finally:
        if broker is not None:
            broker.stop()


def run_all(bootstrap: str, n: int, n_keys: int, parts_n: int, runs: int) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from grudge_stream.topics import create_topics

    keys, deltas, parts, stamps = events(n, n_keys, parts_n)
    topic = f"bench-embedded-{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, {topic: (parts_n, {})})
    hash_key = HashKey.parse(BENCH_KEY)
    # raise_at above any score this traffic reaches: the figures are the calls' CPU.
    state = ScoreState(f"{topic}-abuse", source_topic=topic, bootstrap_servers=bootstrap, hash_key=hash_key,
                       sketch=CONFIG, raise_at=0.99, clear_at=0.5).start()
    state.assign(range(parts_n))
    by_part: dict[int, list[int]] = {}
    for i, p in enumerate(parts):
        by_part.setdefault(p, []).append(i)
    results: dict[str, float] = {}
    spread: dict[str, list[float]] = {}

    def record(name: str, fn) -> None:
        results[name], spread[name] = per_event_us(fn, n, runs)
        print(f"{name:28s} {results[name]:6.3f} µs/event   runs {' '.join(f'{x:.3f}' for x in spread[name])}",
              flush=True)

    sketch = state.topology.make_operator(0).sketch

    def bare(r: int) -> None:
        upd = sketch.update_and_query
        base = T0 + r * n
        for k, d, t in zip(keys, deltas, stamps):
            upd(k, d, now_ms=t + base - T0)

    table: dict[bytes, float] = {}

    def plain_dict(r: int) -> None:
        get = table.get
        for k, d in zip(keys, deltas):
            table[k] = get(k, 0.0) + d

    # Each run of a state form takes new offsets and later times (nothing skipped, nothing late).
    offset_of = [0] * n
    for p, idx in by_part.items():
        for j, i in enumerate(idx):
            offset_of[i] = j
    per_part = max(len(v) for v in by_part.values())
    base = {"n": 0}

    def next_base() -> tuple[int, int]:
        b = base["n"]
        base["n"] += 1
        return b * per_part, b * n

    def per_call(r: int) -> None:
        ob, tb = next_base()
        upd = state.update
        for k, d, p, o, t in zip(keys, deltas, parts, offset_of, stamps):
            upd(k, d, partition=p, offset=o + ob, timestamp_ms=t + tb)

    record("sketch.update_and_query", bare)
    record("dict", plain_dict)
    record("state.update (per call)", per_call)
    # Columns built before the timing, as a loop holds them after its consume().
    cols = []
    for _ in range(runs + 1):
        ob, tb = next_base()
        cols.append(([o + ob for o in offset_of], [t + tb for t in stamps]))

    def batch_cols(r: int) -> None:
        offs, ts = cols[r]
        for a in range(0, n, 500):  # consume(500) batches, as examples/own_loop.py reads
            b = a + 500
            state.update_many(keys[a:b], deltas[a:b], partitions=parts[a:b], offsets=offs[a:b],
                              timestamps_ms=ts[a:b])

    record("state.update_many (500)", batch_cols)

    # Messages: produced once (Kafka's partitioner on the key), consumed back into lists.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2_random"})
    tb0 = base["n"] * n + n
    for i, (k, d) in enumerate(zip(keys, deltas)):
        while True:
            try:
                producer.produce(topic, key=k, value=b'{"delta":%r}' % d, timestamp=T0 + tb0 + i)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(parts_n)])
    msgs: list = []
    while len(msgs) < n:
        msgs.extend(m for m in consumer.consume(10_000, timeout=1.0) if not m.error())
    consumer.close()
    msg_deltas = [json.loads(m.value())["delta"] for m in msgs]  # the loop's own decoding, untimed
    # A new state per run, started and assigned before the timing: the same messages each time.
    fresh = []
    for r in range(runs + 1):
        st = ScoreState(f"{topic}-abuse-{r}", source_topic=topic, bootstrap_servers=bootstrap, hash_key=hash_key,
                        sketch=CONFIG, raise_at=0.99, clear_at=0.5).start()
        st.assign(range(parts_n))
        fresh.append(st)

    def batch_msgs(r: int) -> None:
        st = fresh[r]
        for i in range(0, len(msgs), 500):  # consume(500) batches, as examples/own_loop.py reads
            st.update_messages(msgs[i:i + 500], msg_deltas[i:i + 500])

    record("state.update_messages (500)", batch_msgs)

    # The batch worker's operator over the same messages' raw payloads, one partition at a time.
    grouped: dict[int, tuple[list, list, list, list]] = {}
    for m in msgs:
        g = grouped.setdefault(m.partition(), ([], [], [], []))
        g[0].append(m.offset())
        g[1].append(m.timestamp()[1])
        g[2].append(m.key())
        g[3].append(m.value())

    worker_ops = [{p: state.topology.make_operator(p) for p in grouped} for _ in range(runs + 1)]

    def worker(r: int) -> None:
        for p, (o, t, k, v) in grouped.items():
            op = worker_ops[r][p]
            for a in range(0, len(o), 500):
                op.process_columns(topic, p, o[a:a + 500], t[a:a + 500], k[a:a + 500], v[a:a + 500])

    record("batch worker operator", worker)
    state.close(snapshot=False)
    for st in fresh:
        st.close(snapshot=False)
    emit({"bench": "embedded", "events": n, "keys": n_keys, "partitions": parts_n, "runs": runs,
          "us_per_event": results})


if __name__ == "__main__":
    main()
