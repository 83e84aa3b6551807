"""Snapshot write and restore time of one abuse_scores partition (4 x 100,000 ScoreSketch).

Against the real broker, through ``grudge_stream.checkpoint.CheckpointStore`` (chunked
records on a compacted topic, manifest last) and ``grudge_stream.partitions.restore_partition``:

- ``serialize``: ``operator.snapshot()`` (sketch + latch bytes, envelope, CRC);
- ``write``: ``store.write(...)`` of that blob (chunks produced with acks=all, flushed,
  then the manifest, flushed) — what a worker's checkpoint does per partition, minus
  the serialization and the output flush;
- ``read``: a fresh ``CheckpointStore`` (as a restarted worker has) finds the newest
  manifest and fetches and verifies the chunks (``store.restore``);
- ``load``: ``operator.restore(blob)`` (envelope check, sketch and latch rebuilt);
- ``restore_partition``: the runtime's whole restore of one partition with a fresh
  store (read, the probe restore that vets the snapshot, the real restore);
- ``checkpoint round``: one round of a worker that owns all 8 partitions, as the runtimes
  do it (``partitions.checkpoint_slots``: ``CheckpointStore.write_many``, each blob
  serialized while the previous one's chunks are sent, one wait for all chunks and one
  for all manifests), beside the same round partition by partition (serialize, write,
  wait, for each in turn).

The operator is first fed ``--fill`` events over random keys so that the sketch cells are
not all zero (an empty sketch compresses to nothing on the wire).

    .venv/bin/python benchmarks/bench_checkpoint.py                # median of 7
    .venv/bin/python benchmarks/bench_checkpoint.py --runs 15 --cells 200000
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit  # noqa: E402
from kafkabench import BAD, BASE_TS_MS, GOOD, broker, client_keys, delete_topics, loadavg  # noqa: E402

from grudge_stream.checkpoint import CheckpointStore, SnapshotWrite  # noqa: E402
from grudge_stream.operators.records import SourceRecord  # noqa: E402
from grudge_stream.partitions import restore_partition  # noqa: E402
from grudge_stream.topology import Settings, load_topology  # noqa: E402


def timed(fn, runs: int, warmup: int = 1) -> tuple[float, list[float], object]:
    out = None
    for _ in range(warmup):
        out = fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), samples, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, default=4)
    ap.add_argument("--cells", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--fill", type=int, default=200_000, help="events fed to each operator before snapshotting")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--chunk-bytes", type=int, default=512 * 1024)
    args = ap.parse_args()

    prefix = f"benchckpt-{uuid.uuid4().hex[:6]}"
    la0 = loadavg()
    with broker() as bs:
        settings = Settings({
            "source_topic": f"{prefix}-events", "snapshot_topic": f"{prefix}-snapshots",
            "operator_id": f"{prefix}-op", "levels": str(args.levels), "cells_per_level": str(args.cells),
            "seed": "2b7e151628aed2a6abf7158809cf4f3c", "bootstrap_servers": bs,
        }, environ={})
        topology = load_topology("abuse_scores", settings)
        op_id = topology.operator_id
        store = CheckpointStore(bs, topology.snapshot_topic, chunk_bytes=args.chunk_bytes)
        store.ensure_topic(args.partitions)

        keys = client_keys(args.fill, seed=3)
        ops = []
        t0 = time.perf_counter()
        for p in range(args.partitions):
            op = topology.make_operator(p)
            recs = [SourceRecord(topology.source_topic, p, i, BASE_TS_MS + i, keys[(i * 7 + p) % len(keys)],
                                 BAD if i % 10 == 0 else GOOD) for i in range(args.fill)]
            op.process(recs)
            ops.append(op)
        fill_s = time.perf_counter() - t0
        op = ops[0]
        print(f"# broker {bs}; {args.partitions} operators of {args.levels} x {args.cells:,} cells, "
              f"each fed {args.fill:,} events in {fill_s / args.partitions:.2f} s", flush=True)

        def write_one(o=op, blob=None):
            blob = blob if blob is not None else o.snapshot()
            return store.write(op_id, o.partition, blob, next_offset=o.next_offset, watermark=o.watermark,
                               fingerprint=o.fingerprint, source_topic=topology.source_topic,
                               partition_count=args.partitions)

        ser_s, ser_samples, blob = timed(op.snapshot, args.runs)
        size = len(blob)
        write_s, write_samples, ref = timed(lambda: write_one(blob=blob), args.runs)
        chunks = len(ref.offsets)

        def read_fresh():
            fresh = CheckpointStore(bs, topology.snapshot_topic)
            res = fresh.restore(op_id, 0)
            assert res.blob is not None and len(res.blob) == size
            return res.blob

        read_s, read_samples, got = timed(read_fresh, args.runs)

        def load():
            o = topology.make_operator(0)
            o.restore(got)
            return o

        load_s, load_samples, restored = timed(load, args.runs)
        assert restored.sketch_bytes() == op.sketch_bytes() and restored.next_offset == op.next_offset

        def rp():
            fresh = CheckpointStore(bs, topology.snapshot_topic)
            out = restore_partition(topology, fresh, 0, args.partitions, lambda: 0)
            assert out.mode == "snapshot", out.mode
            return out

        rp_s, rp_samples, _ = timed(rp, args.runs)

        def round_one_by_one():
            for o in ops:
                write_one(o)

        def round_together():
            store.write_many(SnapshotWrite(op_id, o.partition, o.snapshot(), o.next_offset, o.watermark,
                                           o.fingerprint, topology.source_topic, args.partitions) for o in ops)

        seq_samples: list[float] = []
        round_samples: list[float] = []
        for _ in range(max(3, args.runs // 2)):  # interleaved: the machine is shared and noisy
            seq_samples.append(timed(round_one_by_one, 1, warmup=0)[0])
            round_samples.append(timed(round_together, 1, warmup=0)[0])
        seq_s, round_s = statistics.median(seq_samples), statistics.median(round_samples)
        store.close()
        delete_topics(bs, prefix)

    rows = [
        ("serialize (operator.snapshot)", ser_s, ser_samples),
        ("write (CheckpointStore.write)", write_s, write_samples),
        ("read newest (fresh store.restore)", read_s, read_samples),
        ("load (operator.restore)", load_s, load_samples),
        ("restore_partition (fresh store)", rp_s, rp_samples),
        (f"checkpoint round, {args.partitions} partitions", round_s, round_samples),
        ("checkpoint round, one by one", seq_s, seq_samples),
    ]
    print()
    print(f"snapshot of one partition: {args.levels} x {args.cells:,} ScoreSketch + latch, {size:,} bytes "
          f"({size / 2**20:.2f} MiB) in {chunks} chunks of <= {args.chunk_bytes // 1024} KiB, lz4 on the wire; "
          f"median of {args.runs} (round: {len(round_samples)}); load average before {la0} after {loadavg()}")
    print(f"{'step':40s} {'median ms':>10s} {'min ms':>8s} {'max ms':>8s} {'MB/s':>8s}")
    for name, med, samples in rows:
        nbytes = size * (args.partitions if name.startswith("checkpoint round") else 1)
        print(f"{name:40s} {1e3 * med:>10.1f} {1e3 * min(samples):>8.1f} {1e3 * max(samples):>8.1f} "
              f"{nbytes / med / 1e6:>8.0f}")
    emit({"bench": "checkpoint", "levels": args.levels, "cells_per_level": args.cells, "snapshot_bytes": size,
          "chunks": chunks, "runs": args.runs,
          "median_ms": {name: round(1e3 * med, 2) for name, med, _ in rows},
          "loadavg": [la0, loadavg()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
