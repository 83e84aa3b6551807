"""SplitScoreSketch: signed feedback scores whose errors stay one-sided.

One ``min`` ScoreSketch holding both signs lets a colliding key's negative deltas
pull a shared cell below an abuser's score, and ``min`` picks it: benign traffic
hides abusers. Here punishment (positive deltas) and forgiveness (the magnitudes
of negative deltas) live in two ScoreSketches of the same shape, decay and seed,
each fed only non-negative amounts, so each keeps the ``min`` guarantee of never
under-estimating its own sum. A key's score is ``clamp(P - F, lo, hi)``.

The clamp is kept exact: a positive delta adds only ``min(delta, hi - score)`` to
P and a negative one only ``min(-delta, score - lo)`` to F, so a key with a long
clean history has banked no forgiveness (its score sits at ``lo`` and nothing was
added), exactly as the clamped exact model discards it. Consequences:

- framing an innocent needs colliding punished keys on all ``levels`` of its P
  cells (as with one sketch);
- hiding an abuser needs colliding forgiven keys on all ``levels`` of its F
  cells; one helper key on one cell no longer suffices;
- a key that turns abusive is raised no later than the exact model raises it,
  unless all its F cells are shared.

Exponential decay (or none) only: linear decay would shrink P and F by the same
amount and leave ``P - F`` unchanged. Memory is twice a ScoreSketch's.
Format: ``docs/score-sketch.md`` ("Split-sign scores").
"""
from __future__ import annotations

import struct
from typing import Any, Callable

import numpy as np

from grudge_stream import envelope
from grudge_stream._cyext._score import ScoreSketch, split_apply, split_apply_one, split_peek
from grudge_stream.exceptions import ConfigError, SnapshotError

__all__ = ["SplitScoreSketch"]

_FORMAT = 1
_LEN = struct.Struct("<Q")


class SplitScoreSketch:
    """``SplitScoreSketch(levels, cells_per_level, decay, lo=0.0, hi=1.0,
    hasher="murmur3", seed=None, index_scheme="independent", clock=None)`` (keywords).

    The ScoreSketch interface an operator needs (``update``, ``query``,
    ``update_and_query`` and their ``*_many`` forms, ``key_hashes``,
    ``use_hash_key``, ``to_bytes``/``from_bytes``) over signed deltas. The
    aggregator is ``min`` (the only one with a one-sided error). Thread-safe per
    event, like ScoreSketch.
    """

    __slots__ = ("pos", "neg", "lo", "hi")

    def __init__(self, *, levels: int, cells_per_level: int, decay: Any, lo: float = 0.0,
                 hi: float = 1.0, hasher: str = "murmur3", seed: int | None = None,
                 index_scheme: str = "independent", clock: Any = None,
                 aggregator: str = "min") -> None:
        if aggregator != "min":
            raise ConfigError("split-sign scores use the min aggregator (the one-sided error is the point)")
        lo, hi = float(lo), float(hi)
        if not (lo < hi) or lo > 0.0 or hi < 0.0 or lo != lo or hi != hi:
            raise ConfigError(f"split-sign scores need lo <= 0 <= hi and lo < hi, got [{lo!r}, {hi!r}]")
        if getattr(decay, "kind", None) == "linear":
            raise ConfigError("split-sign scores need exponential decay or none: linear decay would "
                              "shrink punishment and forgiveness alike and leave their difference unchanged")
        self.pos = ScoreSketch(levels=levels, cells_per_level=cells_per_level, decay=decay, lo=0.0,
                               hi=float("inf") if getattr(decay, "kind", None) != "none" else 1e300,
                               aggregator="min", hasher=hasher, seed=seed,
                               index_scheme=index_scheme, clock=clock)
        self.neg = self.pos.copy()  # empty: same config, seed and clock
        self.lo, self.hi = lo, hi

    # -- identity -------------------------------------------------------------------------

    @property
    def config(self) -> tuple[Any, float, float]:
        """(the halves' ScoreSketchConfig, lo, hi)."""
        return (self.pos.config, self.lo, self.hi)

    @property
    def seed(self) -> int:
        return self.pos.seed

    @property
    def index_scheme(self) -> str:
        return str(self.pos.config.index_scheme)

    @property
    def levels(self) -> int:
        return self.pos.levels

    @property
    def cells_per_level(self) -> int:
        return self.pos.cells_per_level

    @property
    def watermark_ms(self) -> int | None:
        return self.pos.watermark_ms

    @property
    def clock(self) -> Any:
        return self.pos.clock

    def copy(self) -> SplitScoreSketch:
        """An independent sketch with the same config, clock and state."""
        sk = SplitScoreSketch.__new__(SplitScoreSketch)
        sk.pos, sk.neg, sk.lo, sk.hi = self.pos.copy(), self.neg.copy(), self.lo, self.hi
        return sk

    def memory_bytes(self) -> int:
        return self.pos.memory_bytes() + self.neg.memory_bytes()

    def __repr__(self) -> str:
        return (f"SplitScoreSketch(levels={self.levels}, cells_per_level={self.cells_per_level}, "
                f"clamp=[{self.lo}, {self.hi}])")

    def use_hash_key(self, key: Any) -> None:
        self.pos.use_hash_key(key)
        self.neg.use_hash_key(key)

    def key_hash(self, key: Any) -> int:
        return self.pos.key_hash(key)

    def key_hashes(self, keys: Any) -> np.ndarray:
        return self.pos.key_hashes(keys)

    # -- operations -----------------------------------------------------------------------

    def update_and_query_many(self, keys: Any, deltas: Any, now_ms: Any = None) -> np.ndarray:
        """Apply each signed delta in order; the scores after each event."""
        scores = split_apply(self.pos, self.neg, keys, deltas, now_ms, self.lo, self.hi)
        assert scores is not None  # want_scores defaults to true
        return scores

    def update_many(self, keys: Any, deltas: Any, now_ms: Any = None) -> None:
        split_apply(self.pos, self.neg, keys, deltas, now_ms, self.lo, self.hi, False)

    def update_and_query(self, key: Any, delta: float, now_ms: int | None = None) -> float:
        return split_apply_one(self.pos, self.neg, key, delta, now_ms, self.lo, self.hi)

    def update(self, key: Any, delta: float, now_ms: int | None = None) -> None:
        split_apply(self.pos, self.neg, [key], delta, now_ms, self.lo, self.hi, False)

    def query_many(self, keys: Any, now_ms: Any = None) -> np.ndarray:
        hashes = self.pos.key_hashes(keys)  # a uint64 hash array passes through as is
        if now_ms is None:
            now_ms = self.pos.clock.now_ms()
        diff = self.pos.query_many(hashes, now_ms) - self.neg.query_many(hashes, now_ms)
        return np.clip(diff, self.lo, self.hi)

    def query(self, key: Any, now_ms: int | None = None) -> float:
        return float(self.query_many([key], now_ms)[0])

    def query_detailed(self, key: Any, now_ms: int | None = None) -> dict[str, Any]:
        """The score and each half's per-level read (punishment, forgiveness)."""
        if now_ms is None:
            now_ms = self.pos.clock.now_ms()
        p = self.pos.query_detailed(key, now_ms)
        f = self.neg.query_detailed(key, now_ms)
        return {"score": min(self.hi, max(self.lo, p.aggregate - f.aggregate)),
                "punishment": list(p.level_scores), "forgiveness": list(f.level_scores),
                "cell_indexes": list(p.cell_indexes)}

    def peek_detailed(self, key: Any, now_ms: int) -> dict[str, Any]:
        """``query_detailed`` without writing anything (``ScoreSketch.peek_detailed``): one
        kernel read of both halves under both locks, so it never sees half of a batch."""
        score, p, f = split_peek(self.pos, self.neg, key, now_ms, self.lo, self.hi)
        return {"score": score,
                "punishment": list(p.level_scores), "forgiveness": list(f.level_scores),
                "punishment_total": p.aggregate, "forgiveness_total": f.aggregate,
                "cell_indexes": list(p.cell_indexes)}

    def cells_in_use(self) -> tuple[int, int]:
        """Non-zero cells of (punishment, forgiveness)."""
        return (int(np.count_nonzero(self.pos._cells()["score"])),
                int(np.count_nonzero(self.neg._cells()["score"])))

    # -- bytes ----------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Both halves in one checksummed envelope (docs/score-sketch.md)."""
        return self.to_bytes_later()()

    def to_bytes_later(self) -> Callable[[], bytes]:
        """``to_bytes`` in two steps: both halves' cells copied now, the snapshot made by
        calling the result (later, on any thread)."""
        later = self.envelope_later()
        return lambda: envelope.build(later())

    def envelope_later(self) -> Callable[[], envelope.Envelope]:
        """``to_bytes_later`` whose result makes the envelope not built yet
        (``envelope.later``), the halves' envelopes within it: a snapshot that holds the sketch
        writes all of it in place, in one copy."""
        later_a, later_b = self.pos.envelope_later(), self.neg.envelope_later()
        lo, hi = self.lo, self.hi

        def make() -> envelope.Envelope:
            a, b = later_a(), later_b()
            header = {"format": _FORMAT, "lo": lo, "hi": hi, "halves": [len(a), len(b)]}
            return envelope.later(envelope.KIND_SPLIT_SCORE, header, (a, b))
        return make

    @classmethod
    def from_bytes(cls, data: Any, *, clock: Any = None) -> SplitScoreSketch:
        header, payload = envelope.unpack(data, envelope.KIND_SPLIT_SCORE)
        if header.get("format") != _FORMAT:
            raise SnapshotError(f"SplitScoreSketch snapshot format {header.get('format')!r} is not "
                                f"supported (this release reads {_FORMAT})")
        try:
            la, lb = (int(x) for x in header["halves"])
            lo, hi = float(header["lo"]), float(header["hi"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"SplitScoreSketch snapshot header is malformed: {exc}") from None
        if la < 0 or lb < 0 or la + lb != payload.nbytes:
            raise SnapshotError("SplitScoreSketch snapshot halves do not add up to its payload")
        pos = ScoreSketch.from_bytes(bytes(payload[:la]), clock=clock)
        neg = ScoreSketch.from_bytes(bytes(payload[la:]), clock=clock)
        if pos.config != neg.config:
            raise SnapshotError("SplitScoreSketch snapshot halves have different configurations")
        if not (lo < hi and lo <= 0.0 <= hi):
            raise SnapshotError(f"SplitScoreSketch snapshot has an invalid clamp [{lo}, {hi}]")
        sk = cls.__new__(cls)
        sk.pos, sk.neg, sk.lo, sk.hi = pos, neg, lo, hi
        return sk

