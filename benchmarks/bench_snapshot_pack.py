"""What a snapshot's serialization costs: CRC-32C and the packing of one partition's state.

Run: .venv/bin/python benchmarks/bench_snapshot_pack.py [--runs 3] [--cells 100000]
     [--baseline-python OTHER/bin/python]

One split-score sketch of 4 levels x ``--cells`` cells per level (the abuse_scores
operator's state: 12.8 MB at 100,000) with 20,000 keys in it. Each round times, medians of
15 calls: the copy taken on the loop (``envelope_later``), the packing of that copy into an
operator envelope with the split sketch's and its halves' envelopes inside it (every byte
copied once and checksummed by three envelopes: what a background round's serialization
does), and one CRC-32C pass over the blob, with the implementation this installation uses
and with the portable tables. ``--baseline-python``: the same rounds in another
installation (without the portable column where it has none), alternating, in one run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import emit  # noqa: E402


def one_round(cells: int) -> dict:
    from grudge_stream import SplitScoreSketch, envelope
    from grudge_stream._cyext import _hashing
    from grudge_stream.sketches.score_config import Exponential

    sk = SplitScoreSketch(levels=4, cells_per_level=cells, decay=Exponential(0.01), hasher="siphash")
    for i in range(20_000):
        sk.update(f"k{i}".encode(), 0.04, 1000 + i)
    take, pack, crc, portable = [], [], [], []
    for _ in range(15):
        t = time.perf_counter()
        make = sk.envelope_later()
        take.append(time.perf_counter() - t)
        t = time.perf_counter()
        blob = envelope.pack_parts(envelope.KIND_OPERATOR, {"bench": 1}, [make()])
        pack.append(time.perf_counter() - t)
        view = memoryview(blob)
        t = time.perf_counter()
        _hashing.crc32c(view)
        crc.append(time.perf_counter() - t)
        if hasattr(_hashing, "crc32c_portable"):
            t = time.perf_counter()
            _hashing.crc32c_portable(view)
            portable.append(time.perf_counter() - t)
        del blob, view, make
    impl = _hashing.crc32c_implementation() if hasattr(_hashing, "crc32c_implementation") else "portable"
    ms = lambda xs: round(statistics.median(xs) * 1e3, 2) if xs else None  # noqa: E731
    return {"bytes": 16 * 4 * cells * 2, "crc32c": impl, "take_ms": ms(take), "pack_ms": ms(pack),
            "crc_ms": ms(crc), "crc_portable_ms": ms(portable)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cells", type=int, default=100_000)
    ap.add_argument("--baseline-python", default=None)
    ap.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_round:
        print(json.dumps(one_round(args.cells)))
        return
    sides = [("this", sys.executable)] + ([("baseline", args.baseline_python)] if args.baseline_python else [])
    rows: dict[str, list[dict]] = {name: [] for name, _ in sides}
    here = os.path.abspath(__file__)
    for run in range(args.runs):
        for name, py in sides:
            out = subprocess.run([py, here, "--one-round", "--cells", str(args.cells)], check=True,
                                 capture_output=True, text=True, cwd="/").stdout
            r = json.loads(out.strip().splitlines()[-1])
            rows[name].append(r)
            print(f"run {run + 1}/{args.runs} {name:8s} ({r['crc32c']}): take {r['take_ms']} ms, pack "
                  f"{r['pack_ms']} ms, CRC-32C {r['crc_ms']} ms (portable tables {r['crc_portable_ms']} ms) "
                  f"over {r['bytes'] / 1e6:.1f} MB", flush=True)
    summary = {}
    for name, rs in rows.items():
        summary[name] = {k: statistics.median(r[k] for r in rs) for k in ("take_ms", "pack_ms", "crc_ms")
                         if all(r[k] is not None for r in rs)}
        print(f"{name:8s} medians of {len(rs)} rounds: " + ", ".join(f"{k} {v:.2f}" for k, v in summary[name].items()))
    emit({"bench": "snapshot_pack", "runs": args.runs, "cells": args.cells, "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
