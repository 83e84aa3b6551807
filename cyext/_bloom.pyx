# ForgettingBloom kernel: G generations of a Bloom filter interleaved in one bit array
# (a group of group_bits >= G bits per position, bit g of a group = generation g), so a
# lookup over every live generation costs k word loads, not G*k. Rotation clears the
# oldest generation's bit of every group. Design and byte format: docs/forgetting-bloom.md.
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t, INT64_MAX
from libc.stdlib cimport free
from libc.string cimport memset
from libc.math cimport log, pow
cimport numpy as cnp
import numpy as np
import math

from ghash cimport (Hasher, make_hasher, hash_key, set_siphash_key, gh_ix_word, gh_ix_reduce,
                    GH_IX_KM, GH_IX_INDEPENDENT)

from grudge_stream._cyext._hashing import algorithm_code
from grudge_stream.envelope import KIND_FORGETTING_BLOOM, pack, unpack
from grudge_stream.sketches import bloom_config as _bloom_config
from grudge_stream.sketches._validate import scheme_of_dict

include "_common.pxi"

cnp.import_array()

cdef extern from "gsketch.h" nogil:
    uint64_t gs_fastmod_magic(uint32_t d)
    uint32_t gs_km_index_p(uint64_t h, uint32_t i, uint64_t magic, uint32_t d, uint32_t pmask)
    void gs_indexes(int ix, uint64_t h, uint32_t n, uint64_t magic, uint32_t d, uint32_t pmask,
                    uint32_t* out)
    void gs_prefetch_w(const void* p)
    void gs_prefetch_r(const void* p)
    void* gs_alloc_zeroed(size_t n)
    int64_t gs_floordiv(int64_t a, int64_t b)

cdef extern from *:
    """
    static inline int gb_popcount64(uint64_t x) { return __builtin_popcountll(x); }
    """
    int gb_popcount64(uint64_t x) nogil

cdef enum:
    MAXG = 64       # mirrors grudge_stream.sketches.bloom_config.MAX_GENERATIONS
    PF = 8          # prefetch distance in keys (power of two)
    MAXK = 64       # mirrors grudge_stream.sketches.bloom_config.MAX_HASHES

# Snapshot header format (the "format" field; format 1 had none, see from_bytes).
FORMAT = 2
_CFG_FIELDS_V1 = frozenset({"capacity", "fp_rate", "generations", "period_ms", "seed", "hasher"})
_STATE_FIELDS_V1 = frozenset({"positions", "hashes", "newest", "rotations", "period_index", "counts",
                              "popcounts", "union_popcount"})
_CFG_FIELDS = _CFG_FIELDS_V1 | {"overload"}
_STATE_FIELDS = frozenset({"format", "positions", "hashes", "newest", "rotations", "generation_starts",
                           "latest_ms", "counts", "popcounts", "union_popcount", "overloads"})


cdef object _config_module():
    """The pure-Python config module (it never imports this kernel)."""
    return _bloom_config


cdef class ForgettingBloom(_Sketch):
    """ForgettingBloom(*, capacity, fp_rate, generations=2, period_ms=None, seed=0,
    hasher="murmur3", overload="shrink_window", index_scheme="independent", clock=None)

    A Bloom filter that forgets gradually: a set of known keys for dedup, novelty
    and skip-the-check caches.

    ``generations`` (2..64) Bloom filters share one sizing: each holds up to
    ``capacity`` inserts and is sized for ``1 - (1 - fp_rate)**(1/generations)``,
    so ``contains`` over all of them stays within ``fp_rate`` even when every
    generation is full. Inserts go to the newest generation; a key is present
    while any live generation holds it. The oldest generation is cleared and
    becomes the newest (a rotation) when event time reaches the newest
    generation's start + ``period_ms`` (generations start on the grid of
    multiples of ``period_ms``, origin 0, until a capacity rotation re-phases
    them) and, with ``overload="shrink_window"`` (the default), when the newest
    generation's insert count reaches ``capacity``; a capacity rotation at
    event time t starts the new generation at t. Forgetting is gradual, never a
    cliff. With ``generations=G`` and period P, a key added at t stays present
    until the G-th rotation after t: with time rotations only, at least
    ``(G-1) * P`` and at most ``G * P``; with 2 generations, at least P
    whenever no span of P event time holds more than ``capacity`` inserts
    (docs/forgetting-bloom.md states the bound for G > 2). With
    ``overload="raise_fp"`` nothing rotates by capacity: the window holds and
    the false-positive rate rises past the target (``fp_rate_estimate``).

    Error direction: "absent" is always true; "present" can be false (rate
    about ``fp_rate``, see :meth:`fp_rate_estimate`). As a skip-the-check cache
    it fails open, so insert only keys the backend accepted.

    ``index_scheme``: how a key's k positions derive from its 64-bit hash,
    ``"independent"`` (default) or ``"km"`` (Kirsch-Mitzenmacher, grudge-stream 0.2's;
    two keys then share all k positions with probability about ``positions**-2``
    instead of ``positions**-k``): docs/hashing.md.

    Memory: ``bloom_sizing(capacity, fp_rate, generations).memory_bytes``
    (``positions * group_bits / 8``; 2.75 MB for 1M keys at 1 % with 2 generations).
    """

    cdef uint64_t* _words
    cdef Py_ssize_t _nwords
    cdef uint32_t _m, _pmask, _k
    cdef int _ix                    # index scheme: GH_IX_INDEPENDENT or GH_IX_KM
    cdef uint64_t _magic
    cdef int _G, _lgw, _lgpw
    cdef uint64_t _gmask            # the G generation bits of one group (at offset 0)
    cdef uint64_t _lowpat           # bit 0 of every group of a word
    cdef uint64_t _capacity
    cdef int _newest
    cdef int64_t _counts[MAXG]      # inserts (adds that set a new bit) per generation
    cdef int64_t _pops[MAXG]        # set bits per generation
    cdef int64_t _union_pop         # positions with any generation bit set
    cdef int64_t _rotations
    cdef int64_t _overloads         # capacity rotations (shrink_window) / inserts beyond capacity (raise_fp)
    cdef bint _raise_fp             # overload="raise_fp": no capacity rotation
    cdef int64_t _period_ms         # 0: no time-based rotation
    cdef int64_t _starts[MAXG]      # event-time start of each physical generation (once started)
    cdef int64_t _win_hi            # the next time rotation is due: start of the newest + period (saturated)
    cdef int64_t _t_hi              # the latest event time of a write (once started)
    cdef bint _started
    cdef _Scratch _scratch          # reused hash buffer for key lists (avoids page faults per batch)

    def __cinit__(self, *args, **kwargs):
        self._words = NULL

    def __dealloc__(self):
        free(self._words)

    def __init__(self, *, capacity, fp_rate, generations=2, period_ms=None, seed=0,
                 hasher="murmur3", overload="shrink_window", index_scheme="independent", clock=None):
        cfg = _config_module().BloomConfig(capacity=capacity, fp_rate=fp_rate, generations=generations,
                                           period_ms=period_ms, seed=seed, hasher=hasher,
                                           overload=overload, index_scheme=index_scheme)
        self._setup(cfg, clock)

    cdef _setup(self, cfg, clock):
        cdef int g
        if self._words != NULL:
            raise RuntimeError("ForgettingBloom is already initialised")
        clock = _clock_of(clock)
        sz = cfg.sizing
        self._config = cfg
        self._bind_clock(clock)
        self._scratch = _Scratch()
        self._m = sz.positions
        self._magic = gs_fastmod_magic(self._m)
        self._pmask = (self._m - 1) if (self._m & (self._m - 1)) == 0 else 0
        self._ix = GH_IX_INDEPENDENT if cfg.index_scheme == "independent" else GH_IX_KM
        self._k = sz.hashes
        self._G = cfg.generations
        self._lgw = 0
        while (1 << self._lgw) < sz.group_bits:
            self._lgw += 1
        self._lgpw = 6 - self._lgw
        self._gmask = 0xFFFFFFFFFFFFFFFFULL if self._G == 64 else ((1ULL << self._G) - 1)
        self._lowpat = 0
        for g in range(0, 64, sz.group_bits):
            self._lowpat |= 1ULL << g
        self._capacity = cfg.capacity
        self._nwords = sz.words
        self._words = <uint64_t*>gs_alloc_zeroed(<size_t>self._nwords * 8)
        if self._words == NULL:
            raise MemoryError(f"cannot allocate {self._nwords * 8} bytes of Bloom bits")
        self._newest = 0
        for g in range(MAXG):
            self._counts[g] = 0
            self._pops[g] = 0
            self._starts[g] = 0
        self._union_pop = 0
        self._rotations = 0
        self._overloads = 0
        self._raise_fp = cfg.overload == "raise_fp"
        self._period_ms = 0 if cfg.period_ms is None else cfg.period_ms
        self._started = False
        self._win_hi = -INT64_MAX - 1
        self._t_hi = -INT64_MAX - 1
        self._hasher = make_hasher(algorithm_code(cfg.hasher), <uint64_t>cfg.seed)

    # ------------------------------------------------------------------ properties

    capacity = _from_config("capacity")
    fp_rate = _from_config("fp_rate")
    generations = _from_config("generations")
    period_ms = _from_config("period_ms")
    overload = _from_config("overload", """``"shrink_window"`` or ``"raise_fp"``: what gives way under overload.""")

    @property
    def hashes(self):
        """k, the indexes per key."""
        return self._k

    @property
    def shape(self):
        """``(rows, cells_per_row)`` = ``(1, positions)``: the ``hashes`` positions of a key
        share one row of position groups (see every sketch's ``shape``)."""
        return (1, self._m)

    @property
    def positions(self):
        """m, the bit positions per generation."""
        return self._m

    @property
    def rotations(self):
        """Rotations so far (each period boundary crossed counts once, as does each
        capacity-triggered rotation)."""
        return self._rotations

    @property
    def overloads(self):
        """Overload events so far. ``shrink_window``: capacity rotations (a generation
        reached ``capacity`` before its period ended; at or below the capacity rate
        this only re-phases the generations, ``effective_window_ms`` shows whether
        the window shrank); ``raise_fp``: inserts beyond ``capacity`` into a
        generation (each one raises the fp rate above the sizing's target)."""
        return self._overloads

    @property
    def period_index(self):
        """floor(start of the newest generation / period_ms): without capacity
        rotations, the period of the latest operation. None (no period, or no
        operation yet)."""
        if not (self._started and self._period_ms):
            return None
        return gs_floordiv(self._starts[self._newest], self._period_ms)

    @property
    def generation_starts_ms(self):
        """Event-time start of each live generation, oldest first (the newest last), or
        None (no period, or no operation yet). A time rotation starts a generation
        ``period_ms`` after the previous one; a capacity rotation starts it at the
        event time that filled the previous one."""
        if not (self._started and self._period_ms):
            return None
        return [self._starts[(self._newest + 1 + i) % self._G] for i in range(self._G)]

    @property
    def effective_window_ms(self):
        """The event time a key added now is remembered for at the current insert rate
        (None without a period). ``raise_fp``: ``(G-1) * period_ms`` (the window never
        shrinks). ``shrink_window``: the span of the G-1 completed generations (start
        of the oldest live generation to the start of the newest), at most
        ``(G-1) * period_ms``; below that, capacity rotations have shortened it."""
        if not self._period_ms:
            return None
        full = (self._G - 1) * self._config.period_ms
        if self._raise_fp or not self._started:
            return full
        newest_start = self._starts[self._newest]
        oldest_start = self._starts[(self._newest + 1) % self._G]
        return min(newest_start - oldest_start, full)

    @property
    def newest_fill(self):
        """Inserts in the newest generation / ``capacity`` (1.0 = full; above 1 only with
        ``overload="raise_fp"``)."""
        return <double>self._counts[self._newest] / <double>self._capacity

    def generation_counts(self):
        """Inserts per generation, newest first."""
        return [self._counts[(self._newest - i + self._G) % self._G] for i in range(self._G)]

    def fill_ratios(self):
        """Fraction of set bits per generation, newest first."""
        return [<double>self._pops[(self._newest - i + self._G) % self._G] / <double>self._m for i in range(self._G)]

    def memory_bytes(self):
        """Bytes of the bit array (fixed at construction)."""
        return self._nwords * 8

    def approx_count(self):
        """Estimated number of distinct keys held by the live generations together:
        ``-(m / k) * ln(1 - U / m)`` with U the positions where any generation has a
        bit set (the union of generations is itself a Bloom filter, as they share
        their hashing). ``inf`` when every position is set."""
        if self._union_pop >= self._m:
            return math.inf
        return -(<double>self._m / self._k) * math.log1p(-<double>self._union_pop / self._m)

    def fp_rate_estimate(self):
        """Probability that ``contains`` of a never-added key answers True right now:
        ``1 - prod_g (1 - (X_g / m)**k)`` over the live generations (X_g = set bits)."""
        cdef double keep = 1.0
        cdef int g
        for g in range(self._G):
            keep *= 1.0 - pow(<double>self._pops[g] / self._m, <double>self._k)
        return 1.0 - keep

    def __repr__(self):
        c = self._config
        return (f"ForgettingBloom(capacity={c.capacity}, fp_rate={c.fp_rate}, generations={c.generations}, "
                f"period_ms={c.period_ms}, seed={c.seed}, hasher={c.hasher!r}, overload={c.overload!r}, "
                f"index_scheme={c.index_scheme!r})")

    # ------------------------------------------------------------------ generations

    cdef inline uint64_t _genpat(self, int g) noexcept nogil:
        return self._lowpat << g

    cdef inline uint64_t _fold(self, uint64_t w) noexcept nogil:
        """Bit 0 of each group := OR of the group's bits."""
        cdef int s = 1
        while s < (1 << self._lgw):
            w |= w >> s
            s <<= 1
        return w & self._lowpat

    cdef void _rotate(self) noexcept nogil:
        """Clear the oldest generation; it becomes the newest."""
        cdef int old = (self._newest + 1) % self._G
        cdef uint64_t pat = self._genpat(old)
        cdef uint64_t w, w2
        cdef int64_t lost = 0
        cdef Py_ssize_t i
        cdef uint64_t* words = self._words
        for i in range(self._nwords):
            w = words[i]
            if w & pat:
                w2 = w & ~pat
                lost += gb_popcount64(self._fold(w)) - gb_popcount64(self._fold(w2))
                words[i] = w2
        self._union_pop -= lost
        self._pops[old] = 0
        self._counts[old] = 0
        self._newest = old
        self._rotations += 1

    cdef inline void _set_newest_start(self, int64_t s) noexcept nogil:
        """The newest generation starts at s; its time rotation is due at s + period."""
        self._starts[self._newest] = s
        self._win_hi = INT64_MAX if s > INT64_MAX - self._period_ms else s + self._period_ms

    cdef void _derive_older_starts(self) noexcept nogil:
        """Older generations start one period apart before the newest (saturated): the
        grid they had when they were rotated by time (used after a jump that cleared
        every generation, and for snapshots written before the starts were kept)."""
        cdef int i, g
        cdef int64_t s = self._starts[self._newest]
        for i in range(1, self._G):
            g = (self._newest - i + self._G) % self._G
            s = (-INT64_MAX - 1) if s < -INT64_MAX - 1 + self._period_ms else s - self._period_ms
            self._starts[g] = s

    cdef void _capacity_full(self) noexcept nogil:
        """The newest generation reached capacity (shrink_window): rotate, and start the
        new generation at the current event time (the latest time of a write: a late
        event does not move time backwards)."""
        self._rotate()
        self._overloads += 1
        if self._period_ms and self._started:
            self._set_newest_start(self._t_hi)

    cdef void _clear_all(self, int64_t r) noexcept nogil:
        """r >= G rotations at once: every generation is cleared."""
        cdef int g
        memset(self._words, 0, <size_t>self._nwords * 8)
        for g in range(self._G):
            self._pops[g] = 0
            self._counts[g] = 0
        self._union_pop = 0
        # newest == rotations mod G always; the count saturates (a jump of 2**63 periods).
        self._rotations = INT64_MAX if r > INT64_MAX - self._rotations else self._rotations + r
        self._newest = <int>(self._rotations % self._G)

    cdef void _start_at(self, int64_t t) noexcept nogil:
        """The first operation with a time: the newest generation starts at the period
        grid point at or before t (floor(t / period) * period, saturated)."""
        cdef uint64_t mod = <uint64_t>t - <uint64_t>gs_floordiv(t, self._period_ms) * <uint64_t>self._period_ms
        cdef int64_t s
        if <uint64_t>t - <uint64_t>(-INT64_MAX - 1) < mod:
            s = -INT64_MAX - 1
        else:
            s = <int64_t>(<uint64_t>t - mod)
        self._started = True
        self._t_hi = t
        self._set_newest_start(s)
        self._derive_older_starts()

    cdef inline int64_t _pending_at(self, int64_t t) noexcept nogil:
        """Time rotations due at t >= win_hi: 1 + (t - win_hi) div period, saturated; 0
        when the next rotation lies beyond the int64 range (win_hi saturated)."""
        cdef uint64_t q
        if self._starts[self._newest] > INT64_MAX - self._period_ms:
            return 0
        q = (<uint64_t>t - <uint64_t>self._win_hi) / <uint64_t>self._period_ms
        return <int64_t>(q + 1) if q < <uint64_t>(INT64_MAX - 1) else INT64_MAX

    cdef void _advance(self, int64_t t) noexcept nogil:
        """Event time t (>= win_hi, or the first time): one rotation per period_ms elapsed
        since the newest generation's start, each new generation starting one period
        after the previous one (so the grid is kept until a capacity rotation re-phases it)."""
        cdef uint64_t q, P
        cdef int64_t r, i, base
        if not self._started:
            self._start_at(t)
            return
        if t < self._win_hi:
            return
        r = self._pending_at(t)
        if r == 0:
            return
        P = <uint64_t>self._period_ms
        q = (<uint64_t>t - <uint64_t>self._win_hi) / P      # rotations due - 1
        base = self._win_hi                                   # the first new generation's start
        if r >= self._G:
            self._clear_all(r)
            self._set_newest_start(<int64_t>(<uint64_t>base + q * P))   # <= t: no overflow
            self._derive_older_starts()
        else:
            for i in range(r):
                self._rotate()
                self._set_newest_start(<int64_t>(<uint64_t>base + <uint64_t>i * P))

    cdef inline int64_t _now(self, object now_ms) except? -1:
        return _clock_now(now_ms, self._clock, self._wall, False)

    cdef int64_t _advance_to(self, object now_ms) except? -1:
        """Rotate for event time now_ms; return it (0 without a period)."""
        cdef int64_t t
        if self._period_ms == 0:
            if now_ms is not None:
                self._now(now_ms)   # validated, then unused: rotation is by capacity only
            return 0
        t = self._now(now_ms)
        if t >= self._win_hi:
            self._advance(t)
        if t > self._t_hi:
            self._t_hi = t
        return t

    cdef uint64_t _live_after(self, int64_t pending) noexcept nogil:
        """Generation mask of what would still be live after `pending` rotations."""
        cdef uint64_t mask = 0
        cdef int64_t i
        if pending <= 0:
            return self._gmask
        for i in range(self._G - pending if pending < self._G else 0):
            mask |= 1ULL << ((self._newest - i + self._G) % self._G)
        return mask

    cdef uint64_t _read_mask(self, object now_ms) except? 0xFFFFFFFFFFFFFFFF:
        """The live generations for a read at now_ms; reads never rotate (state is
        unchanged) but do not see generations a rotation due by then would clear."""
        cdef int64_t t, p
        if self._period_ms == 0:
            if now_ms is not None:
                self._now(now_ms)
            return self._gmask
        t = self._now(now_ms)
        if not self._started or t < self._win_hi:
            return self._gmask
        return self._live_after(self._pending_at(t))

    # ------------------------------------------------------------------ bits

    cdef inline bint _probe(self, uint64_t h, uint64_t live) noexcept nogil:
        """True when some generation in `live` has all k bits of h set."""
        cdef uint64_t acc = live, w = 0
        cdef uint32_t i, idx
        cdef int lgw = self._lgw, lgpw = self._lgpw
        cdef uint32_t pwm = (1u << lgpw) - 1
        cdef bint ix = self._ix == GH_IX_INDEPENDENT
        for i in range(self._k):
            # Index by index, so a miss stops early (independent: a word per two indexes).
            if ix:
                if (i & 1) == 0:
                    w = gh_ix_word(h, i >> 1)
                idx = gh_ix_reduce(<uint32_t>(w >> ((i & 1) * 32)), self._m)
            else:
                idx = gs_km_index_p(h, i, self._magic, self._m, self._pmask)
            acc &= self._words[idx >> lgpw] >> ((idx & pwm) << lgw)
            if (acc & live) == 0:
                return False
        return True

    cdef inline bint _probe_at(self, const uint32_t* idx, uint64_t live) noexcept nogil:
        """``_probe`` over indexes already computed (``_indexes``)."""
        cdef uint64_t acc = live
        cdef uint32_t i
        cdef int lgw = self._lgw, lgpw = self._lgpw
        cdef uint32_t pwm = (1u << lgpw) - 1
        for i in range(self._k):
            acc &= self._words[idx[i] >> lgpw] >> ((idx[i] & pwm) << lgw)
            if (acc & live) == 0:
                return False
        return True

    cdef inline void _indexes(self, uint64_t h, uint32_t* idx) noexcept nogil:
        """h's k positions under the filter's index scheme."""
        gs_indexes(self._ix, h, self._k, self._magic, self._m, self._pmask, idx)

    cdef inline void _insert(self, uint64_t h) noexcept nogil:
        cdef uint32_t idx[MAXK]
        self._indexes(h, idx)
        self._insert_at(idx)

    cdef inline void _insert_at(self, const uint32_t* idx) noexcept nogil:
        """Set the k bits at ``idx`` in the newest generation (``_set_bits``); when that
        fills it, rotate (shrink_window) or count an overload (raise_fp, beyond capacity)."""
        if self._set_bits(idx, self._newest):
            if not self._raise_fp:
                self._capacity_full()
            elif <uint64_t>self._counts[self._newest] > self._capacity:
                self._overloads += 1

    cdef inline bint _set_bits(self, const uint32_t* idx, int g) noexcept nogil:
        """Set the k bits at word indexes ``idx`` in generation g, counted as an insert when
        one was new; True when that insert brought g to its capacity."""
        cdef uint32_t r, off
        cdef int lgw = self._lgw, lgpw = self._lgpw
        cdef uint32_t pwm = (1u << lgpw) - 1
        cdef uint64_t gmask = self._gmask
        cdef uint64_t* wp
        cdef uint64_t w, bit
        cdef int64_t newbits = 0, newunion = 0
        for r in range(self._k):
            wp = self._words + (idx[r] >> lgpw)
            off = (idx[r] & pwm) << lgw
            w = wp[0]
            bit = 1ULL << (off + <uint32_t>g)
            if (w & bit) == 0:
                newbits += 1
                if ((w >> off) & gmask) == 0:
                    newunion += 1
                wp[0] = w | bit
        if newbits == 0:
            return False
        self._pops[g] += newbits
        self._union_pop += newunion
        self._counts[g] += 1
        return <uint64_t>self._counts[g] >= self._capacity

    cdef inline void _prefetch(self, uint64_t h, uint32_t* idx) noexcept nogil:
        """h's positions into ``idx``, their words prefetched."""
        cdef uint32_t i
        self._indexes(h, idx)
        for i in range(self._k):
            gs_prefetch_r(self._words + (idx[i] >> self._lgpw))

    cdef void _run(self, int op, const uint64_t* hs, Py_ssize_t n, const int64_t* ts,
                   uint8_t* out) noexcept nogil:
        """op 0: add, 1: add_if_absent (out = was new), in order, at event times ts (NULL:
        the batch's one time, already applied). The k word indexes of key
        i + PF are computed into a ring and their lines prefetched while key i runs, so
        the probe and the insert of key i reuse them from the ring and find them in cache."""
        cdef uint32_t ring[PF * MAXK]
        cdef uint32_t* slot
        cdef uint64_t* words = self._words
        cdef uint64_t magic = self._magic, gmask = self._gmask
        cdef uint32_t m = self._m, pmask = self._pmask, k = self._k
        cdef int lgw = self._lgw, lgpw = self._lgpw
        cdef uint32_t pwm = (1u << lgpw) - 1
        cdef int64_t win_hi = self._win_hi
        cdef bint raise_fp = self._raise_fp
        cdef int64_t t_hi = self._t_hi
        cdef Py_ssize_t i, j
        cdef uint32_t r, idx
        cdef uint64_t acc = 0, h
        cdef int g = self._newest
        cdef int ix = self._ix
        for j in range(n if n < PF else PF):
            slot = ring + j * MAXK
            gs_indexes(ix, hs[j], k, magic, m, pmask, slot)
            for r in range(k):
                gs_prefetch_w(words + (slot[r] >> lgpw))
        for i in range(n):
            slot = ring + (i & (PF - 1)) * MAXK
            if ts != NULL:
                if ts[i] >= win_hi:
                    self._advance(ts[i])
                    win_hi = self._win_hi
                    g = self._newest
                if ts[i] > t_hi:
                    t_hi = ts[i]
            if op == 1:
                acc = gmask
                for r in range(k):
                    idx = slot[r]
                    acc &= words[idx >> lgpw] >> ((idx & pwm) << lgw)
                    if (acc & gmask) == 0:
                        break
                out[i] = (acc & gmask) == 0
            if (op == 0 or (acc & gmask) == 0) and self._set_bits(slot, g):
                if not raise_fp:
                    self._t_hi = t_hi
                    self._capacity_full()
                    g = self._newest
                    win_hi = self._win_hi
                elif <uint64_t>self._counts[g] > self._capacity:
                    self._overloads += 1
            j = i + PF
            if j < n:
                gs_indexes(ix, hs[j], k, magic, m, pmask, slot)
                for r in range(k):
                    gs_prefetch_w(words + (slot[r] >> lgpw))
        self._t_hi = t_hi

    cdef void _run_contains(self, const uint64_t* hs, Py_ssize_t n, const int64_t* ts,
                            uint64_t live0, uint8_t* out) noexcept nogil:
        """contains for each key: the positions of key i + PF computed into a ring and their
        words prefetched while key i is probed from the ring."""
        cdef uint32_t ring[PF * MAXK]
        cdef Py_ssize_t i
        cdef uint64_t live
        cdef int64_t p
        for i in range(n if n < PF else PF):
            self._prefetch(hs[i], ring + i * MAXK)
        for i in range(n):
            live = live0
            if ts != NULL and self._started and ts[i] >= self._win_hi:
                live = self._live_after(self._pending_at(ts[i]))
            out[i] = self._probe_at(ring + (i & (PF - 1)) * MAXK, live) if live else False
            if i + PF < n:
                self._prefetch(hs[i + PF], ring + ((i + PF) & (PF - 1)) * MAXK)

    # ------------------------------------------------------------------ single-key API

    def add(self, key, now_ms=None):
        """Insert ``key`` into the newest generation (refreshing it if it was only in an
        older one). Only insert keys a backend accepted when used as a cache."""
        cdef uint64_t h = hash_key(&self._hasher, key)
        self._advance_to(now_ms)
        self._insert(h)

    def contains(self, key, now_ms=None):
        """True when some live generation holds ``key`` (false positives possible, false
        negatives not). A read: it rotates nothing, but ignores generations that a
        rotation due at ``now_ms`` would clear."""
        cdef uint64_t h = hash_key(&self._hasher, key)
        cdef uint64_t live = self._read_mask(now_ms)
        return self._probe(h, live) if live else False

    def __contains__(self, key):
        return self.contains(key)

    def add_if_absent(self, key, now_ms=None):
        """Streaming dedup: True (and insert) when ``key`` is in no live generation;
        False (no insert, no refresh) when it is, or looks like it is (a false positive)."""
        cdef uint32_t idx[MAXK]
        cdef uint64_t h = hash_key(&self._hasher, key)
        self._advance_to(now_ms)
        self._indexes(h, idx)
        if self._probe_at(idx, self._gmask):
            return False
        self._insert_at(idx)
        return True

    # ------------------------------------------------------------------ batch API

    cdef tuple _batch(self, keys, now_ms):
        hashes = _batch_hashes(&self._hasher, self._scratch, keys)[0]
        n = hashes.shape[0]
        if self._period_ms == 0:
            if now_ms is not None:
                _batch_times(now_ms, n, False)
            return hashes, None, None
        t0, tarr = _batch_times(now_ms, n, False)
        if tarr is None:
            return hashes, (self._now(None) if t0 is None else t0), None
        return hashes, None, tarr

    def add_many(self, keys, now_ms=None):
        """Batch twin of :meth:`add` (same as the single adds in order). ``keys``: a
        list/tuple of bytes/str, a 2-D uint8 array of fixed-width keys, or a uint64
        array of pre-hashed keys; ``now_ms``: None, one time, or one per key."""
        hashes, t0, tarr = self._batch(keys, now_ms)
        self._run_batch(0, hashes, t0, tarr, None)

    def add_if_absent_many(self, keys, now_ms=None):
        """Batch twin of :meth:`add_if_absent`: a bool array, True where the key was new
        (a key repeated within the batch is new only the first time)."""
        hashes, t0, tarr = self._batch(keys, now_ms)
        out = np.zeros(hashes.shape[0], dtype=np.bool_)
        self._run_batch(1, hashes, t0, tarr, out)
        return out

    cdef _run_batch(self, int op, hashes, t0, tarr, out):
        cdef const uint64_t[::1] hv = hashes
        cdef const int64_t[::1] tv
        cdef const int64_t* tp = NULL
        cdef uint8_t[::1] ov
        cdef uint8_t* op_out = NULL
        cdef Py_ssize_t n = hv.shape[0]
        if t0 is not None:
            self._advance_to(t0)
        if n == 0:
            return
        if tarr is not None:
            tv = tarr
            tp = &tv[0]
        if out is not None:
            ov = out.view(np.uint8)
            op_out = &ov[0]
        # The GIL stays held: every call is atomic to other threads (docs/count-min.md, "Threads").
        self._run(op, &hv[0], n, tp, op_out)

    def contains_many(self, keys, now_ms=None):
        """Batch twin of :meth:`contains`: a bool array."""
        hashes, t0, tarr = self._batch(keys, now_ms)
        cdef const uint64_t[::1] hv = hashes
        cdef const int64_t[::1] tv
        cdef const int64_t* tp = NULL
        cdef Py_ssize_t n = hv.shape[0]
        out = np.zeros(n, dtype=np.bool_)
        cdef uint8_t[::1] ov = out.view(np.uint8)
        cdef uint64_t live0 = self._gmask
        if t0 is not None:
            live0 = self._read_mask(t0)
        if n == 0:
            return out
        if tarr is not None:
            tv = tarr
            tp = &tv[0]
        # The GIL stays held: every call is atomic to other threads (docs/count-min.md, "Threads").
        self._run_contains(&hv[0], n, tp, live0, &ov[0])
        return out

    # ------------------------------------------------------------------ merge

    def merge(self, ForgettingBloom other not None):
        """Union ``other`` into this filter: identical config and seed, and aligned
        generations (same number of rotations, the same generation starts when both
        have seen time), else MismatchError. Generation g of the result holds both
        inputs' generation g, so every key present in either input is present in the
        result."""
        cdef Py_ssize_t i
        cdef int g
        cdef uint64_t* a = self._words
        cdef uint64_t* b = other._words
        if other._config != self._config:
            raise MismatchError(
                f"cannot merge Bloom filters with different configs: {self._config} vs {other._config}")
        if other._rotations != self._rotations or (
                self._period_ms and self._started and other._started
                and self.generation_starts_ms != other.generation_starts_ms):
            raise MismatchError(
                f"cannot merge Bloom filters whose generations are not aligned (rotations "
                f"{self._rotations} vs {other._rotations}, generation starts {self.generation_starts_ms} "
                f"vs {other.generation_starts_ms}). Operator action: merge snapshots taken at the same "
                f"period, of filters without capacity rotations.")
        # The GIL stays held: every call is atomic to other threads (docs/count-min.md, "Threads").
        for i in range(self._nwords):
            a[i] |= b[i]
        self._recount()
        for g in range(self._G):
            c = self._counts[g] + other._counts[g]
            self._counts[g] = min(c, self._pops[g]) if self._raise_fp else min(c, self._config.capacity, self._pops[g])
        if not self._started and other._started:
            self._started = True
            for g in range(self._G):
                self._starts[g] = other._starts[g]
            self._win_hi = other._win_hi
            self._t_hi = other._t_hi
        elif other._started and other._t_hi > self._t_hi:
            self._t_hi = other._t_hi
        self._overloads = max(self._overloads, other._overloads)
        if not self._raise_fp and <uint64_t>self._counts[self._newest] >= self._capacity:
            self._capacity_full()

    cdef _recount(self):
        """Recompute per-generation popcounts and the union popcount from the bits."""
        cdef int g
        cdef Py_ssize_t i
        cdef uint64_t w
        cdef int64_t u = 0
        for g in range(self._G):
            self._pops[g] = 0
        for i in range(self._nwords):
            w = self._words[i]
            if w:
                u += gb_popcount64(self._fold(w))
                for g in range(self._G):
                    self._pops[g] += gb_popcount64(w & self._genpat(g))
        self._union_pop = u

    # ------------------------------------------------------------------ snapshots

    def to_bytes(self):
        """Serialize: envelope + JSON header (format 2: config, sizing, generation
        state) + the little-endian bit array (docs/forgetting-bloom.md)."""
        header = self._config.to_dict()
        header.update(self._state_header())
        bits = np.asarray(<uint64_t[:self._nwords]>self._words).astype("<u8", copy=False).tobytes()
        return pack(KIND_FORGETTING_BLOOM, header, bits)

    cdef dict _state_header(self):
        return {
            "format": FORMAT,
            "positions": self._m,
            "hashes": self._k,
            "newest": self._newest,
            "rotations": self._rotations,
            "generation_starts": ([self._starts[g] for g in range(self._G)]
                                  if (self._started and self._period_ms) else None),
            "latest_ms": self._t_hi if (self._started and self._period_ms) else None,
            "counts": [self._counts[g] for g in range(self._G)],
            "popcounts": [self._pops[g] for g in range(self._G)],
            "union_popcount": self._union_pop,
            "overloads": self._overloads,
        }

    @classmethod
    def from_bytes(cls, data, *, clock=None):
        """Restore a filter from :meth:`to_bytes` (format 2, or format 1 written by earlier
        releases: its generations start on the period grid and ``overload`` is
        ``shrink_window``); anything truncated, corrupted, of another kind or of an
        unknown format, or violating an invariant raises SnapshotError."""
        header, payload = unpack(data, KIND_FORGETTING_BLOOM)
        fmt = header.get("format", 1)
        if fmt == 1 and "format" not in header:
            cfg_fields, state_fields = _CFG_FIELDS_V1, _STATE_FIELDS_V1
        elif type(fmt) is int and fmt == FORMAT:
            cfg_fields, state_fields = _CFG_FIELDS, _STATE_FIELDS
        else:
            raise SnapshotError(f"ForgettingBloom snapshot has an unknown header format {fmt!r}; this release "
                                f"reads format {FORMAT} and format 1 (no format field). Operator action: load "
                                f"it with the release that wrote it.")
        # index_scheme: absent in 0.2 snapshots and in KM ones, which keep that form.
        if set(header) - {"index_scheme"} != cfg_fields | state_fields or \
                (fmt == 1 and "index_scheme" in header):
            raise SnapshotError(f"ForgettingBloom snapshot (format {fmt}) header has fields {sorted(header)}, "
                                f"expected {sorted(cfg_fields | state_fields)} (and index_scheme)")
        if type(header["fp_rate"]) is not float:
            raise SnapshotError("ForgettingBloom snapshot fp_rate is not a float")
        if fmt == FORMAT and type(header["overload"]) is not str:
            raise SnapshotError("ForgettingBloom snapshot overload is not a string")
        try:
            cfg = _config_module().BloomConfig(**{k: header[k] for k in cfg_fields},
                                               index_scheme=scheme_of_dict(header))
        except (ConfigError, TypeError) as exc:
            raise SnapshotError(f"ForgettingBloom snapshot holds an invalid config: {exc}") from None
        cdef ForgettingBloom self = ForgettingBloom.__new__(ForgettingBloom)
        self._setup(cfg, clock)
        self._load(header, payload, fmt)
        return self

    cdef _load(self, dict header, payload, int fmt):
        cdef int g
        cdef Py_ssize_t i
        cdef uint64_t unused
        def is_int(v, lo, hi):
            return type(v) is int and lo <= v <= hi
        if header["positions"] != self._m or header["hashes"] != self._k:
            raise SnapshotError(
                f"ForgettingBloom snapshot was sized as m={header['positions']}, k={header['hashes']}; "
                f"this release sizes the same config as m={self._m}, k={self._k}")
        G = self._G
        if not is_int(header["rotations"], 0, INT64_MAX):
            raise SnapshotError("ForgettingBloom snapshot rotations is not a non-negative integer")
        if not is_int(header["newest"], 0, G - 1) or header["newest"] != header["rotations"] % G:
            raise SnapshotError("ForgettingBloom snapshot newest generation is inconsistent with its rotations")
        newest = header["newest"]
        starts = None
        if fmt == 1:
            pidx = header["period_index"]
            if pidx is not None and (not self._period_ms or not is_int(pidx, -(1 << 63), (1 << 63) - 1)):
                raise SnapshotError("ForgettingBloom snapshot period_index is invalid")
            if pidx is not None:
                # Format 1 rotated on the grid only: the newest generation started at pidx * period.
                s = max(pidx * self._period_ms, -(1 << 63))
                starts = [None] * G
                for i in range(G):
                    starts[(newest - i) % G] = max(s - i * self._period_ms, -(1 << 63))
            overloads = 0
            latest = None if starts is None else starts[newest]
        else:
            starts = header["generation_starts"]
            if starts is not None:
                if (not self._period_ms or type(starts) is not list or len(starts) != G
                        or not all(is_int(v, -(1 << 63), (1 << 63) - 1) for v in starts)):
                    raise SnapshotError("ForgettingBloom snapshot generation_starts is invalid")
                ring = [starts[(newest + 1 + i) % G] for i in range(G)]   # oldest first
                if any(ring[i] > ring[i + 1] for i in range(G - 1)):
                    raise SnapshotError("ForgettingBloom snapshot generation starts are not in order")
            latest = header["latest_ms"]
            if (latest is None) != (starts is None) or (
                    latest is not None and not is_int(latest, starts[newest], (1 << 63) - 1)):
                raise SnapshotError("ForgettingBloom snapshot latest_ms is invalid")
            overloads = header["overloads"]
            if not is_int(overloads, 0, INT64_MAX) or (not self._raise_fp and overloads > header["rotations"]):
                raise SnapshotError("ForgettingBloom snapshot overloads is invalid")
        cap = INT64_MAX if self._raise_fp else self._config.capacity
        counts, pops = header["counts"], header["popcounts"]
        if (type(counts) is not list or type(pops) is not list or len(counts) != G or len(pops) != G):
            raise SnapshotError(f"ForgettingBloom snapshot needs {G} counts and popcounts")
        if payload.nbytes != self._nwords * 8:
            raise SnapshotError(f"ForgettingBloom payload is {payload.nbytes} bytes, expected {self._nwords * 8}")
        bits = np.frombuffer(payload, dtype="<u8").astype(np.uint64)
        cdef const uint64_t[::1] bv = bits
        # Bits of generation slots >= G (groups wider than G) must be zero.
        unused = 0
        for g in range(G, 1 << self._lgw):
            unused |= self._genpat(g)
        for i in range(self._nwords):
            if bv[i] & unused:
                raise SnapshotError("ForgettingBloom snapshot sets bits of generations that do not exist")
            self._words[i] = bv[i]
        self._recount()
        for g in range(G):
            if (not is_int(counts[g], 0, cap) or type(pops[g]) is not int
                    or pops[g] != self._pops[g]):
                raise SnapshotError(f"ForgettingBloom generation {g} state does not match its bits")
            if counts[g] > self._pops[g]:
                raise SnapshotError(f"ForgettingBloom generation {g} counts more inserts than set bits")
            self._counts[g] = counts[g]
        if type(header["union_popcount"]) is not int or header["union_popcount"] != self._union_pop:
            raise SnapshotError("ForgettingBloom snapshot union popcount does not match its bits")
        if not self._raise_fp and counts[newest] >= self._config.capacity:
            raise SnapshotError("ForgettingBloom newest generation is at capacity (it should have rotated)")
        if self._period_ms and starts is None and (self._union_pop or header["rotations"]):
            raise SnapshotError("ForgettingBloom snapshot has content but no generation start")
        self._newest = newest
        self._rotations = header["rotations"]
        self._overloads = overloads
        if starts is not None:
            for g in range(G):
                self._starts[g] = starts[g]
            self._started = True
            self._t_hi = latest
            self._set_newest_start(starts[newest])
