"""How long a background snapshot round stops the consume loop: the old path (every copy with
the GIL held) beside the new one (the copies and checksums in the kernels, without it), in one
run, interleaved.

An ``abuse_scores`` operator (``--levels`` x ``--cells`` per level, split scores: two
sketches; the default 4 x 100,000 makes the ~13 MB round of one partition) is fed
``--fill`` events. Each round then does what the batch worker does (grudge_stream.runtime.
checkpointer): on the loop, at a batch boundary, the state is copied; on a writer thread the
copy is serialized (the operator envelope around the sketch envelopes) and cut into chunk
records that are ``produce``d. No broker is needed: the producer points at a closed port, so
``produce`` copies each record into librdkafka's queue (as it does with a broker; the lz4
compression of the topic would run later in librdkafka's own threads) and the queue is
purged after the round. ``--bootstrap`` sends to a broker instead and waits for the acks.

Meanwhile the loop thread runs a stand-in consume loop and records the longest gap between
two of its steps: the longest time it waited for the GIL the writer held. ``--loop wait``
(default) wakes every 0.5 ms (a loop waiting for records, the GIL released meanwhile);
``--loop busy`` runs Python steps of ~20 us back to back (a backlog: the interpreter's switch
interval, 5 ms, then also bounds what it waits for a writer that runs Python). Printed per
size, medians of ``--runs`` rounds of each path (alternating which goes first): ``take`` (the
state copy on the loop, ``snapshot_write``: the same code in both paths, a stop of the loop
itself), the longest loop stall while the writer runs (median, and the worst of the runs),
the loop's longest gap with no writer for as long as a round (the machine's noise floor), and
the round's duration. ``--steps`` first times each step of a round on its own.

The old path is the code of earlier releases, kept for this comparison and the tests
(``envelope.pack_py``, ``checkpoint.format.encode_chunk_py``, the joins it made); both paths
must give the same bytes, checked every round::

    .venv/bin/python benchmarks/bench_snapshot_stall.py
    .venv/bin/python benchmarks/bench_snapshot_stall.py --steps --cells 100000 1000000 --runs 9
    .venv/bin/python benchmarks/bench_snapshot_stall.py --loop busy
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import numpy as np
from confluent_kafka import Producer

from grudge_stream import envelope
from grudge_stream.checkpoint import CheckpointStore
from grudge_stream.checkpoint.format import chunk_key, encode_chunk_py
from grudge_stream.checkpoint.store import SnapshotWrite, _chunk_delivered
from grudge_stream.operators.base import SourceRecord
from grudge_stream.partitions import snapshot_write
from grudge_stream.topology import Settings, load_topology

TOPIC = "bench-snapshot-stall"


def make_operator(levels: int, cells: int, fill: int):
    settings = Settings({"levels": str(levels), "cells_per_level": str(cells),
                         "seed": "2b7e151628aed2a6abf7158809cf4f3c"}, environ={})
    topology = load_topology("abuse_scores", settings)
    op = topology.make_operator(0)
    rng = np.random.default_rng(1)
    clients = rng.integers(0, 1_000_000, fill)
    for start in range(0, fill, 10_000):
        op.process([SourceRecord(topology.source_topic, 0, i, 1_700_000_000_000 + i, b"c%d" % clients[i],
                                 b'{"outcome":"bad"}' if i % 10 == 0 else b'{"outcome":"good"}')
                    for i in range(start, min(fill, start + 10_000))])
    return topology, op


class Slot:
    """The part of a PartitionSlot that snapshot_write reads."""

    def __init__(self, topology, op) -> None:
        self.topology, self.operator, self.partition, self.partition_count = topology, op, 0, 1
        self.unsnapshotted = 0


def old_take(op):
    """The copies of the cells the old serialization packs (the loop's memcpy, the same in both
    paths, is ``snapshot_write``)."""
    return [op.sketch.pos._cells(), op.sketch.neg._cells()], op.latch.to_bytes()


def old_serialize(taken, headers) -> bytes:
    """Earlier releases' make(): each ScoreSketch envelope, the split one around ``a + b``,
    the operator's around the joined sections; every copy with the GIL held."""
    (cells_a, cells_b), latch = taken
    pack = envelope.pack_py
    a = pack(envelope.KIND_SCORE_SKETCH, headers["a"], cells_a.view(np.uint8).ravel())
    b = pack(envelope.KIND_SCORE_SKETCH, headers["b"], cells_b.view(np.uint8).ravel())
    sketch = pack(envelope.KIND_SPLIT_SCORE, headers["split"], a + b)
    return pack(envelope.KIND_OPERATOR, headers["op"], b"".join(d for d in (sketch, latch)))


def old_chunks(store: CheckpointStore, producer, write) -> list:
    """Earlier releases' chunk loop: each slice copied twice (bytes(), +) with the GIL."""
    view = memoryview(write.blob)
    count = max(1, -(-len(view) // store.chunk_bytes))
    offsets: list = [None] * count
    errors: list = []
    for i in range(count):
        data = view[i * store.chunk_bytes:(i + 1) * store.chunk_bytes]
        store._produce(producer, 0, chunk_key(write.operator_id, write.partition, 0, i),
                       encode_chunk_py(1, i, count, data), _chunk_delivered(offsets, errors, i))
    return offsets


def headers_of(blob: bytes) -> dict:
    """The header dicts inside an operator snapshot (so the old path packs the same ones)."""
    op_h, payload = envelope.unpack(blob, envelope.KIND_OPERATOR)
    (_, n_sketch), _ = op_h["sections"]
    split_h, halves = envelope.unpack(bytes(payload[:n_sketch]), envelope.KIND_SPLIT_SCORE)
    la = split_h["halves"][0]
    return {"op": op_h, "split": split_h,
            "a": envelope.unpack(bytes(halves[:la]), envelope.KIND_SCORE_SKETCH)[0],
            "b": envelope.unpack(bytes(halves[la:]), envelope.KIND_SCORE_SKETCH)[0]}


def step() -> int:
    """One small step of the busy stand-in loop (~20 us of Python)."""
    return sum(i * i for i in range(150))


def nap() -> None:
    """One step of the waiting stand-in loop: a consume loop waiting for records (the GIL
    released), woken every 0.5 ms."""
    time.sleep(0.0005)


def loop_while(busy: threading.Event | None, seconds: float = 0.0, work=nap) -> float:
    """Run steps until ``busy`` clears (or for ``seconds``); the longest gap between two."""
    longest, last = 0.0, time.perf_counter()
    end = last + seconds
    while (busy.is_set() if busy is not None else time.perf_counter() < end):
        work()
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    return longest


def steps(op, headers: dict, store: CheckpointStore, producer, runs: int) -> None:
    """Each step of one round on its own, old path and new: what it costs, and whether it holds
    the GIL (medians of ``runs``; a chunk step per 512 KiB record, the median over records)."""
    from grudge_stream.envelope import _CRC, _HEAD, _PLEN, FORMAT_VERSION, MAGIC, canonical_json
    from grudge_stream.checkpoint.format import encode_chunk
    from grudge_stream.hashing import crc32c
    times: dict[str, list[float]] = {}

    def t(name, f, *a):
        t0 = time.perf_counter()
        r = f(*a)
        times.setdefault(name, []).append(time.perf_counter() - t0)
        return r

    def pack(kind, header, payload, what):
        hdr = canonical_json(header)
        body = t(f"old {what}: b''.join (GIL)", b"".join, (_HEAD.pack(MAGIC, FORMAT_VERSION, kind, len(hdr)), hdr,
                                                         _PLEN.pack(memoryview(payload).nbytes), payload))
        crc = t(f"old {what}: crc32c (no GIL)", crc32c, body)
        return t(f"old {what}: body + crc (GIL)", lambda: body + _CRC.pack(crc))

    for _ in range(runs):
        (ca, cb), latch = t("the cells copied (as the loop's take does)", old_take, op)
        a = pack(envelope.KIND_SCORE_SKETCH, headers["a"], ca.view(np.uint8).ravel(), "ScoreSketch envelope")
        b = pack(envelope.KIND_SCORE_SKETCH, headers["b"], cb.view(np.uint8).ravel(), "ScoreSketch envelope")
        ab = t("old split sketch: a + b (GIL)", lambda: a + b)
        sk = pack(envelope.KIND_SPLIT_SCORE, headers["split"], ab, "split envelope")
        joined = t("old operator: b''.join(sections) (GIL)", b"".join, (sk, latch))
        blob = pack(envelope.KIND_OPERATOR, headers["op"], joined, "operator envelope")
        view = memoryview(blob)
        for i in range(0, len(blob), store.chunk_bytes):
            rec = t("old chunk record: bytes() + concat (GIL), crc32c (no GIL)", encode_chunk_py, 1, 0, 1,
                    view[i:i + store.chunk_bytes])
            t("produce() of a chunk record (GIL; both paths)", store._produce, producer, 0, b"k", rec, None)
            t("new chunk record: one copy + crc32c (no GIL)", encode_chunk, 1, 0, 1, view[i:i + store.chunk_bytes])
        producer.purge()
        producer.poll(0)
        make = op.snapshot_taken()
        assert t("new make(): the envelopes built in place (no GIL)", make) == blob
    for name, v in times.items():
        print(f"  {name:<62} {statistics.median(v) * 1e3:8.2f} ms  (max {max(v) * 1e3:.2f})")


def one_round(path: str, slot: Slot, store: CheckpointStore, producer, headers: dict, flush: bool,
              expected: list, work) -> dict:
    op = slot.operator
    # The loop's step is the same code in both paths (the old one only held the GIL through the
    # memcpy): both take it. The old serialization reads copies made beforehand, untimed.
    taken = old_take(op) if path == "old" else None
    t0 = time.perf_counter()
    write = snapshot_write(slot, deferred=True)
    take = time.perf_counter() - t0
    busy = threading.Event()
    busy.set()
    out: dict = {}

    def writer() -> None:
        try:
            t = time.perf_counter()
            if path == "old":
                blob = old_serialize(taken, headers)
                w = SnapshotWrite(op.operator_id, 0, blob, None, None, "", TOPIC, 1)
                old_chunks(store, producer, w)
            else:
                w = write.serialized()
                blob = w.blob
                store.produce_chunks(producer, 0, w, 1, 0)
            if flush:
                producer.flush(60)
            out["round"] = time.perf_counter() - t
            out["blob"] = blob
        except BaseException as exc:  # noqa: BLE001 - raised again on the loop thread
            out["error"] = exc
        finally:
            busy.clear()

    th = threading.Thread(target=writer)
    th.start()
    stall = loop_while(busy, work=work)
    th.join()
    if "error" in out:
        raise out["error"]
    if not flush:
        producer.purge()
        producer.poll(0)
    if expected and out["blob"] != expected[0]:
        raise AssertionError(f"the {path} path made other bytes")
    expected[:] = [out["blob"]]
    return {"take": take, "stall": stall, "round": out["round"], "size": len(out["blob"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, default=4)
    ap.add_argument("--cells", type=int, nargs="+", default=[100_000, 1_000_000],
                    help="cells per level, one size after another (default: the abuse_scores default and 10x)")
    ap.add_argument("--fill", type=int, default=100_000, help="events fed to the operator first")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--chunk-bytes", type=int, default=512 * 1024)
    ap.add_argument("--loop", choices=("wait", "busy"), default="wait",
                    help="the stand-in consume loop: wakes every 0.5 ms (wait, default), or runs Python "
                         "steps of ~20 us back to back (busy: a backlog; the switch interval then bounds "
                         "each stall too)")
    ap.add_argument("--steps", action="store_true", help="first, each step of a round on its own, for the "
                    "first size: its time and whether it holds the GIL")
    ap.add_argument("--bootstrap", default=None, help="send the chunks to this broker (default: none)")
    args = ap.parse_args()

    flush = args.bootstrap is not None
    work = nap if args.loop == "wait" else step
    conf = {"bootstrap.servers": args.bootstrap or "127.0.0.1:9", "linger.ms": 0, "compression.type": "lz4",
            "queue.buffering.max.kbytes": 2_097_151, "message.timeout.ms": 300_000, "log_level": 0}
    if flush:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": args.bootstrap})  # kept until the future resolves
        exc = admin.create_topics(
            [NewTopic(TOPIC, num_partitions=1, replication_factor=1,
                      config={"max.message.bytes": str(2 * args.chunk_bytes)})])[TOPIC].exception(30)
        if exc is not None and "already exists" not in str(exc):
            raise SystemExit(f"cannot create {TOPIC}: {exc}")
    producer = Producer(conf)
    if flush:
        deadline = time.monotonic() + 30
        while TOPIC not in producer.list_topics(TOPIC, timeout=10).topics or \
                producer.list_topics(TOPIC, timeout=10).topics[TOPIC].error is not None:
            if time.monotonic() > deadline:
                raise SystemExit(f"topic {TOPIC} not there on {args.bootstrap}")
            time.sleep(0.2)
    store = CheckpointStore(args.bootstrap or "127.0.0.1:9", TOPIC, chunk_bytes=args.chunk_bytes)
    print(f"# python {sys.version.split()[0]}, switch interval {sys.getswitchinterval() * 1e3:.0f} ms, "
          f"{'broker ' + args.bootstrap if flush else 'no broker (produce into the queue, then purge)'}; "
          f"loop {args.loop}; "
          f"medians of {args.runs} rounds per path, interleaved", flush=True)
    table = (f"{'cells/level':>11} {'round MB':>8} {'path':>4} {'take ms':>8} {'loop stall ms':>13} "
             f"{'(max)':>7} {'idle ms':>7} {'round ms':>8}")
    for cells in args.cells:
        topology, op = make_operator(args.levels, cells, args.fill)
        slot = Slot(topology, op)
        headers = headers_of(op.snapshot())
        if args.steps and cells == args.cells[0]:
            print(f"# the steps of one round, {args.levels} x {cells:,} cells per level, medians of {args.runs}:")
            steps(op, headers, store, producer, args.runs)
        if table:
            print(table, flush=True)
            table = ""
        expected: list = []
        res: dict[str, list[dict]] = {"old": [], "new": []}
        idle = []
        for run in range(args.runs):
            for path in (("old", "new") if run % 2 == 0 else ("new", "old")):
                res[path].append(one_round(path, slot, store, producer, headers, flush, expected, work))
            idle.append(loop_while(None, statistics.median(r["round"] for r in res["new"]), work))
        for path in ("old", "new"):
            rs = res[path]
            med = {k: statistics.median(r[k] for r in rs) * 1e3 for k in ("take", "stall", "round")}
            print(f"{cells:>11,} {rs[0]['size'] / 1e6:>8.1f} {path:>4} {med['take']:>8.2f} {med['stall']:>13.2f} "
                  f"{max(r['stall'] for r in rs) * 1e3:>7.1f} {statistics.median(idle) * 1e3:>7.2f} "
                  f"{med['round']:>8.1f}", flush=True)
        del op, slot, expected


if __name__ == "__main__":
    main()
