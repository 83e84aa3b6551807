"""Read-only reads of one key's sketch state, for ``Operator.describe_key`` (live queries).

A ScoreSketch read (``query``, ``query_detailed``) writes the decay back into the
key's cells (docs/score-sketch.md, "Reads write the decay back too"). A live query
that did so would make the state depend on when somebody asked: the stored values
would round differently from a replay of the same records, and the next snapshot
would differ bit for bit. ``score_detail`` therefore reads a copy of the cells and
applies the kernel's own per-cell step (decay to ``now_ms``, nothing stored) in
Python, with the same operations in the same order, so its answer equals what
``query_detailed(key, now_ms)`` would return on a copy of the sketch, bit for bit
(tests/unit/test_partitioner.py checks it against ``copy().query_detailed``).

The copy is the whole cell table (``levels × cells_per_level × 16`` bytes, 6.4 MB
for the abuse_scores default): about a millisecond, paid per query, never per event.
"""
from __future__ import annotations

import math
from typing import Any

# Decay codes of the kernel (grudge_stream._cyext._score): DECAY_NONE, _EXPONENTIAL, _LINEAR.
from grudge_stream._cyext._score import DECAY_EXPONENTIAL, DECAY_LINEAR


def score_detail(sketch: Any, key: bytes, now_ms: int | None) -> dict:
    """``{"score", "levels", "cell_indexes"}`` of ``key`` in a ScoreSketch at ``now_ms``,
    without writing anything (``now_ms=None``: the cells as stored, undecayed)."""
    cfg = sketch.config
    h = sketch.key_hash(key)
    L, M = cfg.levels, cfg.cells_per_level
    h1, h2 = h & 0xFFFFFFFF, h >> 32
    # gh_km_index (cyext/ghash.h): uint32 arithmetic, then mod M.
    idx = [((h1 + i * h2) & 0xFFFFFFFF) % M for i in range(L)]
    cells = sketch._cells()
    code, param = cfg.decay._code, cfg.decay._param
    levels = []
    for i in range(L):
        s = float(cells["score"][i, idx[i]])
        last = int(cells["last_ms"][i, idx[i]])
        if now_ms is not None and now_ms > last and s != 0.0:
            dt = now_ms - last
            if code == DECAY_EXPONENTIAL:
                s = s * math.exp(-param * (float(dt) / 1000.0))
            elif code == DECAY_LINEAR:
                step = (param * float(dt)) / 1000.0
                s = max(s - step, 0.0) if s > 0.0 else min(s + step, 0.0)
        levels.append(s)
    agg = cfg.aggregator
    if agg == "mean":
        acc = 0.0
        for s in levels:
            acc += s
        score = acc / L
    else:
        score = min(levels) if agg == "min" else max(levels)
    return {"score": score, "levels": levels, "cell_indexes": idx}


def split_score_detail(sketch: Any, key: bytes, now_ms: int | None) -> dict:
    """``SplitScoreSketch.query_detailed`` without writing: the clamped score ``P - F`` and
    both halves' per-level reads (punishment and forgiveness)."""
    p = score_detail(sketch.pos, key, now_ms)
    f = score_detail(sketch.neg, key, now_ms)
    return {"score": min(sketch.hi, max(sketch.lo, p["score"] - f["score"])),
            "punishment": p["levels"], "forgiveness": f["levels"],
            "punishment_total": p["score"], "forgiveness_total": f["score"],
            "cell_indexes": p["cell_indexes"]}
