"""A pure-Python twin of ForgettingBloom, for differential tests only.

Each generation is a plain ``set`` of bit positions (no interleaving, no
popcount bookkeeping); rotation replaces the oldest set; murmur3 hashes come
from the independent ``mmh3`` package. Time rotation is due at the newest
generation's start + period (starts on the grid, origin 0, re-phased to the
event time by a capacity rotation); ``overload="raise_fp"`` never rotates by
capacity.
"""

from __future__ import annotations

import math

import mmh3

from grudge_stream.hashing import hash64
from score_reference import independent_index
from grudge_stream.sketches.bloom import bloom_sizing


class BloomReference:
    def __init__(self, capacity, fp_rate, generations=2, period_ms=None, seed=0, hasher="murmur3",
                 overload="shrink_window", index_scheme="independent"):
        self.index_scheme = index_scheme
        sz = bloom_sizing(capacity, fp_rate, generations)
        self.m, self.k, self.G = sz.positions, sz.hashes, generations
        self.capacity, self.period_ms, self.seed, self.hasher = capacity, period_ms, seed, hasher
        self.gens = [set() for _ in range(generations)]
        self.counts = [0] * generations
        self.newest = 0
        self.rotations = 0
        self.overloads = 0
        self.raise_fp = overload == "raise_fp"
        self.start = None  # event-time start of the newest generation (None: no time yet)
        self.latest = None  # the latest event time of a write

    def hash(self, key) -> int:
        if isinstance(key, str):
            key = key.encode("utf-8")
        if self.hasher == "murmur3":
            return mmh3.hash64(bytes(key), self.seed & 0xFFFFFFFF, signed=False)[0]
        return hash64(bytes(key), self.seed, "siphash")

    def positions(self, h: int) -> list[int]:
        if self.index_scheme == "km":
            h1, h2 = h & 0xFFFFFFFF, h >> 32
            return [((h1 + i * h2) & 0xFFFFFFFF) % self.m for i in range(self.k)]
        return [independent_index(h, i, self.m) for i in range(self.k)]

    def rotate(self):
        old = (self.newest + 1) % self.G
        self.gens[old] = set()
        self.counts[old] = 0
        self.newest = old
        self.rotations += 1

    def due(self, now_ms) -> int:
        """Time rotations due at now_ms."""
        if self.period_ms is None or self.start is None or now_ms is None:
            return 0
        if self.start + self.period_ms > 2**63 - 1:
            return 0  # the next rotation lies beyond the int64 range
        return max(0, (now_ms - self.start) // self.period_ms)

    def advance(self, now_ms):
        if self.period_ms is None:
            return
        self.latest = now_ms if self.latest is None else max(self.latest, now_ms)
        if self.start is None:
            self.start = max(now_ms // self.period_ms * self.period_ms, -(2**63))
            return
        r = self.due(now_ms)
        if r:
            if r >= self.G:
                self.gens = [set() for _ in range(self.G)]
                self.counts = [0] * self.G
                self.rotations += r
                self.newest = self.rotations % self.G
            else:
                for _ in range(r):
                    self.rotate()
            self.start += r * self.period_ms

    def live(self, now_ms=None) -> list[int]:
        pending = self.due(now_ms)
        n = max(0, self.G - pending)
        return [(self.newest - i) % self.G for i in range(n)]

    def probe(self, h: int, gens) -> bool:
        pos = self.positions(h)
        return any(all(p in self.gens[g] for p in pos) for g in gens)

    def insert(self, h: int):
        gen = self.gens[self.newest]
        pos = self.positions(h)
        new = [p for p in pos if p not in gen]
        gen.update(pos)
        if new:
            self.counts[self.newest] += 1
            if self.counts[self.newest] >= self.capacity:
                if self.raise_fp:
                    self.overloads += self.counts[self.newest] > self.capacity
                else:
                    self.rotate()
                    self.overloads += 1
                    if self.start is not None:
                        self.start = self.latest  # a late event does not move time back

    def add(self, key, now_ms=None):
        self.advance(now_ms)
        self.insert(self.hash(key))

    def add_if_absent(self, key, now_ms=None) -> bool:
        self.advance(now_ms)
        h = self.hash(key)
        if self.probe(h, range(self.G)):
            return False
        self.insert(h)
        return True

    def contains(self, key, now_ms=None) -> bool:
        return self.probe(self.hash(key), self.live(now_ms))

    def union_bits(self) -> int:
        return len(set().union(*self.gens))

    def approx_count(self) -> float:
        u = self.union_bits()
        return math.inf if u >= self.m else -(self.m / self.k) * math.log1p(-u / self.m)

    def fp_rate_estimate(self) -> float:
        keep = 1.0
        for g in self.gens:
            keep *= 1.0 - (len(g) / self.m) ** self.k
        return 1.0 - keep
