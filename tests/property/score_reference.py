"""Pure-Python reference models of ScoreSketch and Rotator (tests only).

Written from the spec (SKETCHES.md section 1 and docs/score-sketch.md), not from
the kernel: every float operation is spelled out in the same order the spec
gives, so kernel and reference must agree bit for bit. Slow and obvious on
purpose; never import it from the package.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from grudge_stream.hashing import hash64, splitmix64

INT64_MIN = -(2**63)
DBL_MAX = sys.float_info.max
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def km_index(h: int, i: int, m: int) -> int:
    h1, h2 = h & 0xFFFFFFFF, h >> 32
    return ((h1 + i * h2) & 0xFFFFFFFF) % m


IX_MUL = 0xBF58476D1CE4E5B9


def ix_word(h: int, j: int) -> int:
    """Word j of the independent scheme: h itself for j = 0, else the 128-bit product of
    h + j * GOLDEN (mod 2**64) and IX_MUL with its two 64-bit halves xored."""
    if j == 0:
        return h
    p = ((h + j * GOLDEN) & MASK64) * IX_MUL
    return (p & MASK64) ^ (p >> 64)


def independent_index(h: int, i: int, m: int) -> int:
    """Level i from its own 32 bits: the low half of word i // 2 for even i, its high half
    for odd i, reduced as (x * m) >> 32."""
    word = ix_word(h, i // 2)
    x = (word >> (32 * (i & 1))) & 0xFFFFFFFF
    return (x * m) >> 32


def level_index(scheme: str, h: int, i: int, m: int) -> int:
    return independent_index(h, i, m) if scheme == "independent" else km_index(h, i, m)


def decay(kind: str, param: float, s: float, last: int, now: int) -> float:
    """The spec's decay of one cell from `last` to `now` (dt = max(0, now - last))."""
    dt = now - last
    if dt <= 0 or s == 0.0:
        return s
    if kind == "exponential":
        return s * math.exp(-param * (dt / 1000.0))
    if kind == "linear":
        step = (param * dt) / 1000.0
        if s > 0.0:
            t = s - step
            return t if t > 0.0 else 0.0
        t = s + step
        return t if t < 0.0 else 0.0
    return s


def aggregate(name: str, values: Sequence[float]) -> float:
    if name == "mean":
        acc = 0.0
        for v in values:
            acc = acc + v
        return acc / len(values)
    acc = values[0]
    for v in values[1:]:
        if (v < acc) if name == "min" else (v > acc):
            acc = v
    return acc


@dataclass
class RefConfig:
    levels: int
    cells_per_level: int
    decay_kind: str  # "exponential" | "linear" | "none"
    param: float
    lo: float
    hi: float
    aggregator: str
    hasher: str
    seed: int
    index_scheme: str = "independent"

    @classmethod
    def of(cls, cfg) -> "RefConfig":
        d = cfg.decay.to_dict()
        param = d.get("lambda_per_s", d.get("rate_per_s", 0.0))
        return cls(
            cfg.levels,
            cfg.cells_per_level,
            d["kind"],
            param,
            cfg.lo,
            cfg.hi,
            cfg.aggregator,
            cfg.hasher,
            cfg.seed,
            cfg.index_scheme,
        )


class RefTable:
    """One L x M table of (score, last_ms) with the spec's per-cell step."""

    def __init__(self, cfg: RefConfig) -> None:
        self.cfg = cfg
        self.score = [[0.0] * cfg.cells_per_level for _ in range(cfg.levels)]
        self.last = [[INT64_MIN] * cfg.cells_per_level for _ in range(cfg.levels)]
        self.lo = max(cfg.lo, -DBL_MAX)  # adds that overflow saturate at the finite extremes
        self.hi = min(cfg.hi, DBL_MAX)

    def clamp(self, s: float) -> float:
        if s < self.lo:
            return self.lo
        if s > self.hi:
            return self.hi
        return s

    def indexes(self, h: int) -> List[int]:
        return [level_index(self.cfg.index_scheme, h, i, self.cfg.cells_per_level)
                for i in range(self.cfg.levels)]

    def _stamp(self, i: int, j: int, now: int) -> None:
        if now > self.last[i][j]:
            self.last[i][j] = now

    def read(self, h: int, now: int) -> Tuple[float, List[float], List[int]]:
        idx = self.indexes(h)
        vals = []
        for i, j in enumerate(idx):
            s = self.clamp(
                decay(self.cfg.decay_kind, self.cfg.param, self.score[i][j], self.last[i][j], now)
            )
            self.score[i][j] = s
            self._stamp(i, j, now)
            vals.append(s)
        return aggregate(self.cfg.aggregator, vals), vals, idx

    def write(self, h: int, now: int, delta: float) -> float:
        vals = []
        for i, j in enumerate(self.indexes(h)):
            s = decay(self.cfg.decay_kind, self.cfg.param, self.score[i][j], self.last[i][j], now)
            s = self.clamp(s + delta)
            self.score[i][j] = s
            self._stamp(i, j, now)
            vals.append(s)
        return aggregate(self.cfg.aggregator, vals)

    def try_write(self, h: int, now: int, delta: float, limit: float, penalty: float = 0.0) -> bool:
        idx = self.indexes(h)
        decayed = [
            decay(self.cfg.decay_kind, self.cfg.param, self.score[i][j], self.last[i][j], now)
            for i, j in enumerate(idx)
        ]
        admit = aggregate(self.cfg.aggregator, decayed) + delta <= limit
        for (i, j), s in zip(enumerate(idx), decayed):
            if admit:
                s = self.clamp(s + delta)
            elif penalty != 0.0:
                s = self.clamp(s + penalty)
            self.score[i][j] = s
            self._stamp(i, j, now)
        return admit

    def peek(self, h: int, at: int) -> float:
        vals = [
            decay(self.cfg.decay_kind, self.cfg.param, self.score[i][j], self.last[i][j], at)
            for i, j in enumerate(self.indexes(h))
        ]
        return aggregate(self.cfg.aggregator, vals)

    def merge_from(self, other: "RefTable") -> None:
        for i in range(self.cfg.levels):
            for j in range(self.cfg.cells_per_level):
                la, lb = self.last[i][j], other.last[i][j]
                t = la if la >= lb else lb
                a = decay(self.cfg.decay_kind, self.cfg.param, self.score[i][j], la, t)
                b = decay(self.cfg.decay_kind, self.cfg.param, other.score[i][j], lb, t)
                self.score[i][j] = self.clamp(a + b)
                self.last[i][j] = t

    def cells(self) -> List[Tuple[float, int]]:
        return [
            (self.score[i][j], self.last[i][j])
            for i in range(self.cfg.levels)
            for j in range(self.cfg.cells_per_level)
        ]


class RefScoreSketch:
    def __init__(self, cfg: RefConfig) -> None:
        self.cfg = cfg
        self.table = RefTable(cfg)
        self.watermark: Optional[int] = None

    def hash(self, key) -> int:
        return hash64(key, self.cfg.seed, self.cfg.hasher)

    def _see(self, now: int) -> None:
        if self.watermark is None or now > self.watermark:
            self.watermark = now

    def update(self, h: int, delta: float, now: int) -> float:
        self._see(now)
        return self.table.write(h, now, delta)

    def query(self, h: int, now: int) -> float:
        self._see(now)
        return self.table.read(h, now)[0]

    def query_detailed(self, h: int, now: int):
        self._see(now)
        return self.table.read(h, now)

    def try_update(self, h: int, delta: float, limit: float, now: int) -> bool:
        self._see(now)
        return self.table.try_write(h, now, delta, limit)

    def merge(self, other: "RefScoreSketch") -> None:
        self.table.merge_from(other.table)
        if other.watermark is not None:
            self._see(other.watermark)

    def cells(self):
        return self.table.cells()


def generation_seed(seed: int, number: int) -> int:
    """Output number+2 of splitmix64 from `seed`."""
    return splitmix64((seed + ((number + 2) * GOLDEN)) & MASK64)


def remix(h: int, gseed: int) -> int:
    return splitmix64(h ^ gseed)


class RefRotator:
    def __init__(self, cfg: RefConfig, generations: int, period_ms: Optional[int]) -> None:
        self.cfg = cfg
        self.n = generations
        self.period = period_ms
        self.gens = [RefTable(cfg) for _ in range(generations)]  # oldest first
        self.rotations = 0
        self.epoch = 0
        self.watermark: Optional[int] = None

    def hash(self, key) -> int:
        return hash64(key, self.cfg.seed, self.cfg.hasher)

    def seeds(self) -> List[int]:
        return [generation_seed(self.cfg.seed, self.rotations + g) for g in range(self.n)]

    def rotate(self, k: int = 1) -> None:
        for _ in range(min(k, self.n)):
            self.gens.pop(0)
            self.gens.append(RefTable(self.cfg))
        self.rotations += k

    def _advance(self, now: int) -> None:
        if self.period is not None:
            e = now // self.period  # Python floors
            if e > self.epoch:
                self.rotate(e - self.epoch)
                self.epoch = e
        if self.watermark is None or now > self.watermark:
            self.watermark = now

    def update(self, h: int, delta: float, now: int) -> float:
        self._advance(now)
        seeds = self.seeds()
        out = self.gens[0].write(remix(h, seeds[0]), now, delta)
        for g in range(1, self.n):
            self.gens[g].write(remix(h, seeds[g]), now, delta)
        return out

    def query(self, h: int, now: int) -> float:
        self._advance(now)
        return self.gens[0].read(remix(h, self.seeds()[0]), now)[0]

    def query_detailed(self, h: int, now: int):
        self._advance(now)
        return self.gens[0].read(remix(h, self.seeds()[0]), now)

    def try_update(self, h: int, delta: float, limit: float, now: int) -> bool:
        self._advance(now)
        seeds = self.seeds()
        ok = self.gens[0].try_write(remix(h, seeds[0]), now, delta, limit)
        if ok:
            for g in range(1, self.n):
                self.gens[g].write(remix(h, seeds[g]), now, delta)
        return ok

    def merge(self, other: "RefRotator") -> None:
        for a, b in zip(self.gens, other.gens):
            a.merge_from(b)
        if other.watermark is not None and (
            self.watermark is None or other.watermark > self.watermark
        ):
            self.watermark = other.watermark

    def cells(self):
        out = []
        for g in self.gens:
            out.extend(g.cells())
        return out


@dataclass
class ScalarBucket:
    """One key's token bucket as a plain debt: the recipe's model with no sketch at all."""

    rate_per_s: float
    burst: float
    penalty: float = 0.0
    max_debt: float = math.inf
    debt: float = 0.0
    last: int = INT64_MIN

    def _at(self, now: int) -> float:
        return decay("linear", self.rate_per_s, self.debt, self.last, now)

    def _clamp(self, s: float) -> float:
        return 0.0 if s < 0.0 else (self.max_debt if s > self.max_debt else s)

    def allow(self, cost: float, now: int) -> Tuple[bool, Optional[int], float]:
        d = self._at(now)
        ok = d + cost <= self.burst
        if ok:
            d = self._clamp(d + cost)
        elif self.penalty != 0.0:
            d = self._clamp(d + self.penalty)
        self.debt = d
        if now > self.last:
            self.last = now
        return ok, (0 if ok else self.retry_after(cost, now)), d

    def admits_at(self, cost: float, at: int) -> bool:
        return self._at(at) + cost <= self.burst

    def retry_after(self, cost: float, now: int) -> Optional[int]:
        """Smallest w >= 0 with an admission at now + w, by galloping then bisection."""
        if not 0.0 + cost <= self.burst:
            return None
        if self.admits_at(cost, now):
            return 0
        hi = 1
        while not self.admits_at(cost, now + hi):
            hi *= 2
        lo = hi // 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.admits_at(cost, now + mid):
                hi = mid
            else:
                lo = mid
        return hi
