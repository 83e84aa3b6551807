"""A pure-Python twin of DecayingCountMin, for differential tests only.

It follows the rules of docs/count-min.md with none of the kernel's tricks: every
cell keeps its full (unbounded) epoch stamp, so there is no modular comparison and
no re-basing sweep, the top-k candidate set is a dict scanned for its minimum, and
murmur3 hashes come from the independent ``mmh3`` package.
"""

from __future__ import annotations

import mmh3

from grudge_stream.hashing import hash64
from score_reference import independent_index


class CountMinReference:
    def __init__(
        self, depth=4, width=64, epoch_ms=1000, counter_bits=8, seed=0, hasher="murmur3", top_k=0,
        index_scheme="independent",
    ):
        self.index_scheme = index_scheme
        self.depth, self.width, self.epoch_ms = depth, width, epoch_ms
        self.cbits, self.cmax = counter_bits, (1 << counter_bits) - 1
        self.seed, self.hasher, self.top_k = seed, hasher, top_k
        self.cells: dict[tuple[int, int], tuple[int, int]] = {}  # (row, index) -> (stamp, count)
        self.epoch = 0 if epoch_ms is None else None  # None: no event seen yet
        self.cands: dict[int, list] = {}  # hash -> [value, key]

    # hashing -----------------------------------------------------------------
    def hash(self, key) -> int:
        if isinstance(key, str):
            key = key.encode("utf-8")
        if self.hasher == "murmur3":
            return mmh3.hash64(bytes(key), self.seed & 0xFFFFFFFF, signed=False)[0]
        return hash64(bytes(key), self.seed, "siphash")

    def indexes(self, h: int) -> list[int]:
        if self.index_scheme == "km":
            h1, h2 = h & 0xFFFFFFFF, h >> 32
            return [((h1 + i * h2) & 0xFFFFFFFF) % self.width for i in range(self.depth)]
        return [independent_index(h, i, self.width) for i in range(self.depth)]

    # time ----------------------------------------------------------------------
    def epoch_of(self, now_ms: int) -> int:
        return now_ms // self.epoch_ms

    def advance(self, now_ms):
        if self.epoch_ms is None:
            return
        e = self.epoch_of(now_ms)
        if self.epoch is None:
            self.epoch = e
        elif e > self.epoch:
            d = e - self.epoch
            self.epoch = e
            for c in self.cands.values():
                c[0] = c[0] >> d if d < 64 else 0

    def tick(self, n=1):
        d = n
        self.epoch += n
        if d:
            for c in self.cands.values():
                c[0] = c[0] >> d if d < 64 else 0

    def read_epoch(self, now_ms) -> int | None:
        if self.epoch_ms is None or now_ms is None:
            return self.epoch
        e = self.epoch_of(now_ms)
        return e if self.epoch is None or e > self.epoch else self.epoch

    # cells ---------------------------------------------------------------------
    def cell(self, r: int, i: int, q: int) -> int:
        stamp, count = self.cells.get((r, i), (q, 0))
        g = q - stamp
        assert g >= 0
        return count >> g if g < self.cbits else 0

    def increment_hash(self, h: int, count: int = 1, now_ms=None, key=None):
        self.advance(now_ms)
        w = min(count, self.cmax)
        est = None
        for r, i in enumerate(self.indexes(h)):
            v = min(self.cell(r, i, self.epoch) + w, self.cmax)
            self.cells[(r, i)] = (self.epoch, v)
            est = v if est is None else min(est, v)
        if self.top_k:
            self.touch(h, est, key)

    def increment(self, key, count=1, now_ms=None):
        self.increment_hash(
            self.hash(key), count, now_ms, bytes(key) if isinstance(key, bytearray) else key
        )

    def query_hash(self, h: int, now_ms=None) -> int:
        q = self.read_epoch(now_ms)
        if q is None:
            return 0
        return min(self.cell(r, i, q) for r, i in enumerate(self.indexes(h)))

    def query(self, key, now_ms=None) -> int:
        return self.query_hash(self.hash(key), now_ms)

    # candidates ----------------------------------------------------------------
    def touch(self, h: int, est: int, key):
        """Admit (h, est) if it beats the smallest candidate; stored values are lower
        bounds refreshed from the matrix only when a candidate is about to be evicted."""
        if est == 0 or h in self.cands:
            return
        if len(self.cands) < self.top_k:
            self.cands[h] = [est, key]
            return

        def root():
            return min(self.cands, key=lambda x: (self.cands[x][0], x))

        r = root()
        if est <= self.cands[r][0]:
            return
        while True:
            cur = min(self.cell(row, i, self.epoch) for row, i in enumerate(self.indexes(r)))
            if cur <= self.cands[r][0]:
                break
            self.cands[r][0] = cur
            r = root()
        if est <= self.cands[r][0]:
            return
        del self.cands[r]
        self.cands[h] = [est, key]

    def top(self, k=None, now_ms=None):
        k = self.top_k if k is None else k
        q = self.read_epoch(now_ms)
        rows = []
        for h, (_, key) in self.cands.items():
            est = (
                self.query_hash(h, None)
                if q is None
                else min(self.cell(r, i, q) for r, i in enumerate(self.indexes(h)))
            )
            if est:
                rows.append((-est, h, key))
        rows.sort(key=lambda r: (r[0], r[1]))
        return [(h if key is None else key, -ne) for ne, h, key in rows[:k]]
