"""What a score answer reveals, without a broker: by default the score and its verdict only,
never a cell index or a per-level read, so a framing search run through the query API finds
nothing; with ``query_debug_detail`` the same search finds colliding keys (the control that
shows the search works)."""
from __future__ import annotations

import json
import random
import threading

from grudge_stream.operators.records import SourceRecord
from grudge_stream.serving import ScoreQueries, partition_for
from grudge_stream.topology import Settings, load_topology

# Every field a default answer may carry (docs/serving.md, "What an answer reveals").
ALLOWED = {"key", "key_b64", "partition", "watermark_ms", "kind", "score", "raised", "raise_at", "clear_at",
           "override", "served_by", "forwarded_by", "partitioner_check", "level", "burst", "tokens_available",
           "estimate", "seen", "known"}
N = 1  # one partition: every key is local
CELLS = 1500  # small, so a few thousand candidates hold colliders for every level


class _Slot:
    def __init__(self, op) -> None:
        self.operator, self.partition, self.partition_count = op, 0, N
        self.snapshotted_offset, self.restore_mode = None, "fresh"
        self.lock = threading.Lock()


def _operator():
    topo = load_topology("abuse_scores", Settings({"seed": "00112233445566778899aabbccddeeff",
                                                   "cells_per_level": str(CELLS)}, environ={}))
    op = topo.make_operator(0)
    rnd = random.Random(7)
    t = 1_700_000_000_000
    recs = []
    for off in range(4000):
        t += rnd.randint(0, 20)
        key = "victim" if rnd.random() < 0.05 else f"user-{rnd.randrange(500)}"
        recs.append(SourceRecord(topo.source_topic, 0, off, t, key.encode(),
                                 b'{"outcome":"bad"}' if rnd.random() < 0.5 else b'{"outcome":"good"}'))
    op.process(recs)
    return op


def _ask(q: ScoreQueries, keys: list[str]) -> list[dict]:
    out: list[dict] = []
    for i in range(0, len(keys), 1000):
        status, doc, _ = q.handle("POST", "/v1/scores", "", json.dumps(keys[i:i + 1000]).encode(), {})
        assert status == 200
        out += doc["results"]
    return out


def _fields(doc, path=()) -> set[str]:
    """Every key name anywhere in a JSON document."""
    if isinstance(doc, dict):
        return set(doc) | {n for k, v in doc.items() for n in _fields(v, path + (k,))}
    if isinstance(doc, list):
        return {n for v in doc for n in _fields(v, path)}
    return set()


def _cells_revealed(ans: dict) -> set[tuple[int, int]]:
    """(level, cell) pairs an answer gives away, wherever they sit in it."""
    found: set[tuple[int, int]] = set()

    def walk(doc):
        if isinstance(doc, dict):
            for k, v in doc.items():
                if "index" in k and isinstance(v, list):
                    found.update((lvl, int(c)) for lvl, c in enumerate(v))
                walk(v)
        elif isinstance(doc, list):
            for v in doc:
                walk(v)
    walk(ans)
    return found


def _framing_search(q: ScoreQueries) -> list[str]:
    """The attack through the API: ask for the victim and 5000 candidate keys, keep the
    candidates that share a cell with the victim (what framing it needs, level by level)."""
    victim = _ask(q, ["victim"])[0]
    target = _cells_revealed(victim)
    candidates = [f"cand-{i}" for i in range(5000)]
    return [k for k, a in zip(candidates, _ask(q, candidates)) if _cells_revealed(a) & target]


def test_default_answers_reveal_the_score_only_and_the_search_finds_nothing() -> None:
    op = _operator()
    q = ScoreQueries({0: _Slot(op)}.get, lambda: N)
    answers = _ask(q, ["victim", "user-1", "never-seen"])
    assert answers[0]["score"] > 0 and all(partition_for(b"victim", N) == a["partition"] for a in answers)
    leaked = _fields(answers) - ALLOWED
    assert not leaked, f"the default answer carries {leaked}"
    text = json.dumps(answers)
    assert "cell" not in text and "punishment" not in text and "forgiveness" not in text
    assert _framing_search(q) == []


def test_debug_detail_answers_show_the_cells_and_the_same_search_finds_colliders() -> None:
    op = _operator()
    q = ScoreQueries({0: _Slot(op)}.get, lambda: N, debug_detail=True)
    ans = _ask(q, ["victim"])[0]
    assert len(ans["detail"]["cell_indexes"]) == op.sketch.levels
    assert {"next_offset", "snapshot_offset", "restore_mode"} <= set(ans)
    found = _framing_search(q)
    # 5000 candidates, 1500 cells a level: about 3 per level collide. The search works; the
    # default answer is what stops it.
    assert len(found) >= op.sketch.levels
    victim_cells = op.sketch.peek_detailed(b"victim", op.watermark)["cell_indexes"]
    for k in found:
        cells = op.sketch.peek_detailed(k.encode(), op.watermark)["cell_indexes"]
        assert any(a == b for a, b in zip(cells, victim_cells))
