"""Read-only reads of one key's sketch state, for ``Operator.describe_key`` (live queries).

A ScoreSketch read (``query``, ``query_detailed``) writes the decay back into the
key's cells (docs/score-sketch.md, "Reads write the decay back too"). A live query
that did so would make the state depend on when somebody asked: the stored values
would round differently from a replay of the same records, and the next snapshot
would differ bit for bit. These reads therefore use the kernel's ``peek``: one read of
the key's ``levels`` cells under the sketch's lock, decayed to ``now_ms`` with the same
operations as ``query_detailed`` and nothing stored, nothing copied. A split-sign pair
is read with ``split_peek``: both halves under both locks, never half of a batch.

The answer is the score alone. The per-level reads and the cell indexes are
``debug`` only (the ``query_debug_detail`` setting, docs/serving.md): they tell
anyone who can query which cells a key occupies, which is what a framing search
needs, and what the secret hash key exists to hide.
"""
from __future__ import annotations

from typing import Any

from grudge_stream._cyext._score import split_peek


def _now(now_ms: int | None) -> int:
    # No watermark yet: the cells as stored (a cell only decays when now is past its stamp).
    return 0 if now_ms is None else int(now_ms)


def score_detail(sketch: Any, key: bytes, now_ms: int | None, debug: bool = False) -> dict:
    """``{"score"}`` of ``key`` in a ScoreSketch at ``now_ms``, without writing anything;
    with ``debug`` also ``levels`` and ``cell_indexes`` (they leak the key's cells)."""
    d = sketch.peek_detailed(key, _now(now_ms))
    if not debug:
        return {"score": d.aggregate}
    return {"score": d.aggregate, "levels": list(d.level_scores), "cell_indexes": list(d.cell_indexes)}


def split_score_detail(sketch: Any, key: bytes, now_ms: int | None, debug: bool = False) -> dict:
    """``SplitScoreSketch.peek_detailed`` in one atomic read: the clamped score ``P - F``;
    with ``debug`` also both halves' per-level reads and totals and the cell indexes."""
    score, p, f = split_peek(sketch.pos, sketch.neg, key, _now(now_ms), sketch.lo, sketch.hi)
    if not debug:
        return {"score": score}
    return {"score": score, "punishment": list(p.level_scores), "forgiveness": list(f.level_scores),
            "punishment_total": p.aggregate, "forgiveness_total": f.aggregate,
            "cell_indexes": list(p.cell_indexes)}
