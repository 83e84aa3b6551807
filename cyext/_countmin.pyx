# DecayingCountMin kernel: depth x width packed uint32 cells (epoch stamp in the
# high 32-counter_bits bits, saturating counter in the low counter_bits bits),
# halving per idle epoch, lazily on touch; optional top-k candidate set.
# Design, invariants and byte format: docs/count-min.md.
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int32_t, int64_t, INT64_MAX
from libc.stdlib cimport free
from libc.string cimport memset
from cpython.long cimport PyLong_CheckExact
cimport numpy as cnp
import numpy as np
import math
import struct

U64_MAX = (1 << 64) - 1

from ghash cimport Hasher, make_hasher, hash_key, set_siphash_key, GH_IX_KM, GH_IX_INDEPENDENT

from grudge_stream._cyext._hashing import algorithm_code
from grudge_stream.envelope import KIND_COUNT_MIN, pack_parts, unpack
from grudge_stream.sketches import countmin_config as _countmin_config
from grudge_stream.sketches._validate import scheme_of_dict

include "_common.pxi"
include "_topk.pxi"


cdef inline const int64_t* _times_data(object tarr):
    """The first time of a per-key times array from ``_batch_times``; NULL for none or empty."""
    if tarr is None or cnp.PyArray_SIZE(<cnp.ndarray>tarr) == 0:
        return NULL
    return <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>tarr)


cnp.import_array()

cdef extern from "gsketch.h" nogil:
    uint64_t gs_fastmod_magic(uint32_t d)
    uint32_t gs_km_index(uint64_t h, uint32_t i, uint64_t magic, uint32_t d)
    uint32_t gs_km_index_p(uint64_t h, uint32_t i, uint64_t magic, uint32_t d, uint32_t pmask)
    void gs_indexes(int ix, uint64_t h, uint32_t n, uint64_t magic, uint32_t d, uint32_t pmask,
                    uint32_t* out)
    void gs_prefetch_w(const void* p)
    void gs_prefetch_r(const void* p)
    void* gs_alloc_zeroed(size_t n)
    int64_t gs_floordiv(int64_t a, int64_t b)
    void gs_cm_query4(const uint32_t* cells, const uint64_t* hs, Py_ssize_t n, int64_t* out,
                      uint32_t emod, uint32_t width, uint32_t pmask, int cbits, uint32_t smask)
    void gs_cm_query4_ix(const uint32_t* cells, const uint64_t* hs, Py_ssize_t n, int64_t* out,
                         uint32_t emod, uint32_t width, int cbits, uint32_t smask)
    void gs_cm_inc4_ix(uint32_t* cells, const uint64_t* hs, Py_ssize_t n, uint32_t w,
                       uint32_t emod, uint32_t width, int cbits, uint32_t smask)

cdef enum:
    MAX_DEPTH = 32      # mirrors grudge_stream.sketches.countmin.MAX_DEPTH
    PF = 8              # prefetch distance in events (power of two): ~8 events of 4 rows
                        # keep ~32 cache misses in flight, enough to hide DRAM/L3 latency

cdef object _config_module():
    """The pure-Python config module (it never imports this kernel)."""
    return _countmin_config


# ---- count-min's own batch values (keys: _keys.pxi, times: _common.pxi) ------------

cdef object _count_value(object count, str what="count"):
    """One non-negative integer weight as a Python int (integral floats accepted; bool,
    NaN, Inf, negative and fractional values raise InvalidInputError)."""
    if isinstance(count, bool):
        raise InvalidInputError(f"{what} must be a non-negative integer, not bool")
    if isinstance(count, (float, np.floating)):
        if not math.isfinite(count) or count != math.floor(count):
            raise InvalidInputError(f"{what} must be a non-negative integer, got {count!r}")
        count = int(count)
    try:
        v = int(count.__index__())
    except (AttributeError, TypeError):
        raise InvalidInputError(
            f"{what} must be a non-negative integer, not {type(count).__name__}") from None
    if v < 0:
        raise InvalidInputError(f"{what} must be non-negative, got {v}")
    return v


cdef tuple _batch_counts(object counts, Py_ssize_t n):
    """``(w, None)`` for None (1 each) or one weight, or ``(0, uint64 array)`` for one
    weight per event; weights above 2**64-1 saturate there (the cells saturate anyway)."""
    if counts is None:
        return 1, None
    if np.ndim(counts) == 0 and not isinstance(counts, (list, tuple)):
        return min(_count_value(counts.item() if isinstance(counts, np.ndarray) else counts),
                   U64_MAX), None
    arr = np.asarray(counts)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise _length_error("counts", n, arr.shape)
    kind = arr.dtype.kind
    if kind == "u":
        return 0, np.ascontiguousarray(arr, dtype=np.uint64)
    if kind == "i":
        if n and arr.min() < 0:
            raise InvalidInputError(f"counts must be non-negative, got {int(arr.min())}")
        return 0, np.ascontiguousarray(arr.astype(np.uint64))
    if kind == "f":
        if n and not np.isfinite(arr).all():
            raise InvalidInputError("counts must be finite (found NaN or Inf)")
        if n and (arr.min() < 0 or (arr != np.floor(arr)).any()):
            raise InvalidInputError("counts must be non-negative integers")
        return 0, np.minimum(arr, float(U64_MAX)).astype(np.uint64)
    if kind == "O":
        return 0, np.array([min(_count_value(c), U64_MAX) for c in arr], dtype=np.uint64)
    raise InvalidInputError(f"counts must be non-negative integers, got dtype {arr.dtype}")


cdef inline uint32_t _decayed(uint32_t cell, uint32_t emod, int cbits, uint32_t cmask,
                              uint32_t smask) noexcept nogil:
    """The counter of `cell` decayed to the epoch whose stamp is `emod`.

    Valid only for cells whose true stamp lies in [base_epoch, epoch] (the sketch
    invariant, so the modular idle time is the true one) or whose counter is 0."""
    cdef uint32_t g = (emod - (cell >> cbits)) & smask
    return ((cell & cmask) >> g) if g < <uint32_t>cbits else 0


cdef inline uint32_t _shifted(uint32_t v, uint64_t g) noexcept nogil:
    return (v >> g) if g < 32 else 0


ctypedef struct Geometry:
    # What every batch loop reads of the sketch: the rows x cells_per_row cell matrix
    # (every sketch's ``shape``; depth x width here) and the counter layout.
    uint32_t* cells
    uint32_t rows           # depth
    uint32_t width          # cells per row
    uint64_t magic          # gs_fastmod_magic(width)
    uint32_t pmask          # width - 1 when width is a power of two >= 2, else 0
    int ix                  # index scheme: GH_IX_INDEPENDENT or GH_IX_KM (ghash.h)
    int cbits
    uint32_t cmask
    uint32_t smask
    uint32_t emod           # the current epoch's stamp value (E mod 2**stamp_bits)
    uint32_t stamp          # emod << cbits


cdef inline void _prefetch_rows(Geometry G, uint64_t h, uint32_t* idx, bint write) noexcept nogil:
    """The key's cell index in every row (the sketch's index scheme) into ``idx``, each
    cell prefetched (for writing or reading). ``G`` is taken by value: a Geometry whose
    address is never taken stays in registers (the cells are written through uint32_t
    pointers, and the build turns off strict aliasing)."""
    cdef uint32_t* row = G.cells
    cdef uint32_t r
    gs_indexes(G.ix, h, G.rows, G.magic, G.width, G.pmask, idx)
    for r in range(G.rows):
        if write:
            gs_prefetch_w(row + idx[r])
        else:
            gs_prefetch_r(row + idx[r])
        row += G.width


cdef class DecayingCountMin(_Sketch):
    """DecayingCountMin(*, depth=4, width=65536, epoch_ms=1000, counter_bits=24, seed=0,
    hasher="murmur3", top_k=0, index_scheme="independent", clock=None)

    A count-min sketch of decaying counts: "what is hot right now".

    ``depth x width`` packed uint32 cells (the default 4 x 65536 is exactly 1 MiB).
    Each cell holds an epoch stamp (high ``32 - counter_bits`` bits) and a
    saturating counter (low ``counter_bits`` bits, max ``2**counter_bits - 1``).
    The epoch is ``floor(now_ms / epoch_ms)`` of event time, or advances with
    :meth:`tick` when ``epoch_ms=None``. A cell idle for ``g`` epochs is shifted
    right by ``g`` when next touched, so counts halve per idle epoch and a cell
    idle ``counter_bits`` epochs or more reads 0, however long it was idle.

    Parameters
    ----------
    depth, width: rows (1..32) and cells per row; memory ``4 * depth * width`` bytes.
    epoch_ms: epoch length in ms of event time, or None for manual :meth:`tick`.
    counter_bits: counter width (4..27); the stamp field gets the rest of 32 bits.
    seed, hasher: hashing (``"murmur3"`` or ``"siphash"``, use siphash for keys an
        attacker chooses); one 64-bit hash per key.
    index_scheme: how the rows' indexes derive from that hash: ``"independent"``
        (default; each row from its own 32 bits of a remix) or ``"km"``
        (Kirsch-Mitzenmacher, grudge-stream 0.2's): docs/hashing.md.
    top_k: size N of the heavy-hitter candidate set behind :meth:`top` (0 = off);
        adds ``32 * N + 4 * table`` bytes (table = next power of two >= 2N).
    clock: where ``now_ms`` is read when omitted (default the system clock).

    Error guarantee: with ``(epsilon, delta) = (e / width, e**-depth)``, an estimate
    never undercounts the key's own decayed count (unless a counter saturated) and
    exceeds it by more than ``epsilon * N`` (N = total decayed weight) with
    probability at most ``delta``. Size it with
    :func:`grudge_stream.sketches.countmin.countmin_dimensions`.
    """

    cdef uint32_t* _cells
    cdef Py_ssize_t _ncells
    cdef uint32_t _depth, _width
    cdef uint64_t _magic
    cdef uint32_t _pmask            # width - 1 when width is a power of two >= 2, else 0
    cdef int _ix                    # index scheme: GH_IX_INDEPENDENT or GH_IX_KM
    cdef int _cbits
    cdef uint32_t _cmask, _smask
    cdef int64_t _epoch_ms          # 0 in manual mode
    cdef int64_t _E                 # current epoch: max epoch seen (time never runs backwards)
    cdef int64_t _S                 # base epoch: every nonzero cell's true stamp is in [S, E]
    cdef int64_t _win_hi            # first ms of epoch E + 1 (event mode)
    cdef bint _started
    cdef _Scratch _scratch          # reused hash buffer for key lists (avoids page faults per batch)
    cdef CandidateSet _topk         # the top-k candidate set (empty with top_k=0)

    def __cinit__(self, *args, **kwargs):
        self._cells = NULL

    def __dealloc__(self):
        free(self._cells)

    def __init__(self, *, depth=4, width=65_536, epoch_ms=1_000, counter_bits=24, seed=0,
                 hasher="murmur3", top_k=0, index_scheme="independent", clock=None):
        cfg = _config_module().CountMinConfig(
            depth=depth, width=width, epoch_ms=epoch_ms, counter_bits=counter_bits,
            seed=seed, hasher=hasher, top_k=top_k, index_scheme=index_scheme)
        self._setup(cfg, clock)

    cdef _setup(self, cfg, clock):
        if self._cells != NULL:
            raise RuntimeError("DecayingCountMin is already initialised")
        clock = _clock_of(clock)
        self._config = cfg
        self._bind_clock(clock)
        self._scratch = _Scratch()
        self._depth = cfg.depth
        self._width = cfg.width
        self._magic = gs_fastmod_magic(self._width)
        self._pmask = (self._width - 1) if (self._width >= 2 and (self._width & (self._width - 1)) == 0) else 0
        self._ix = GH_IX_INDEPENDENT if cfg.index_scheme == "independent" else GH_IX_KM
        self._ncells = <Py_ssize_t>self._depth * <Py_ssize_t>self._width
        self._cbits = cfg.counter_bits
        self._cmask = (1u << self._cbits) - 1u
        self._smask = (1u << (32 - self._cbits)) - 1u
        self._epoch_ms = 0 if cfg.epoch_ms is None else cfg.epoch_ms
        self._hasher = make_hasher(algorithm_code(cfg.hasher), <uint64_t>cfg.seed)
        self._cells = <uint32_t*>gs_alloc_zeroed(<size_t>self._ncells * 4)
        if self._cells == NULL:
            raise MemoryError(f"cannot allocate {self._ncells * 4} bytes of count-min cells")
        # Manual epochs start at epoch 0; event epochs start at the first operation.
        self._E = 0
        self._S = 0
        self._started = self._epoch_ms == 0
        self._win_hi = -INT64_MAX - 1
        self._topk = CandidateSet(cfg.top_k)

    # ------------------------------------------------------------------ properties

    depth = _from_config("depth")
    width = _from_config("width")
    epoch_ms = _from_config("epoch_ms")
    counter_bits = _from_config("counter_bits")

    @property
    def shape(self):
        """``(rows, cells_per_row)`` = ``(depth, width)``, as every sketch's ``shape``."""
        return (self._depth, self._width)

    @property
    def top_k(self):
        return self._topk._topn

    @property
    def max_count(self):
        """The saturation value of a counter: ``2**counter_bits - 1``."""
        return self._cmask

    @property
    def epoch(self):
        """The sketch's current epoch (the largest seen), or None before the first
        event-time operation."""
        return self._E if self._started else None

    @property
    def base_epoch(self):
        """Every nonzero cell was stamped in ``[base_epoch, epoch]`` (see docs)."""
        return self._S if self._started else None

    def parameters(self):
        """``(epsilon, delta) = (e / width, e**-depth)`` as a named tuple."""
        return self._config.parameters

    def error_bound(self, n):
        """The additive overcount bound ``epsilon * n`` for a stream of total (decayed)
        weight ``n``; it holds for each key with probability at least ``1 - delta``."""
        cdef double nv = float(n)
        if not (nv >= 0.0) or nv == float("inf"):
            raise InvalidInputError(f"n must be a finite non-negative number, got {n!r}")
        return self._config.parameters.epsilon * nv

    def memory_bytes(self):
        """Bytes of fixed memory: cells plus the top-k candidate arrays (not the key objects)."""
        return _config_module().countmin_memory_bytes(self._depth, self._width, self._topk._topn)

    def __repr__(self):
        c = self._config
        return (f"DecayingCountMin(depth={c.depth}, width={c.width}, epoch_ms={c.epoch_ms}, "
                f"counter_bits={c.counter_bits}, seed={c.seed}, hasher={c.hasher!r}, top_k={c.top_k}, "
                f"index_scheme={c.index_scheme!r})")

    # ------------------------------------------------------------------ epochs

    cdef inline void _set_window(self) noexcept nogil:
        if self._epoch_ms == 0:
            return
        if self._E >= INT64_MAX / self._epoch_ms:
            self._win_hi = INT64_MAX
        else:
            self._win_hi = (self._E + 1) * self._epoch_ms

    cdef void _sweep(self) noexcept nogil:
        """Re-stamp every cell at the current epoch E (decaying it): afterwards S = E."""
        cdef uint32_t emod = <uint32_t>(<uint64_t>self._E) & self._smask
        cdef uint32_t stamp = emod << self._cbits
        cdef uint32_t v
        cdef Py_ssize_t i
        cdef uint32_t* cells = self._cells
        for i in range(self._ncells):
            v = _decayed(cells[i], emod, self._cbits, self._cmask, self._smask)
            cells[i] = (stamp | v) if v else 0
        self._S = self._E

    cdef void _advance(self, int64_t e) noexcept nogil:
        """Move the sketch to epoch e if it is newer (older epochs change nothing)."""
        cdef uint64_t d
        if not self._started:
            self._E = e
            self._S = e
            self._started = True
            self._set_window()
            return
        if e <= self._E:
            return
        d = <uint64_t>e - <uint64_t>self._E
        if <uint64_t>e - <uint64_t>self._S > self._smask:
            # Epoch e would be 2**stamp_bits or more after the oldest possible stamp, so
            # modular stamps would become ambiguous: re-base first.
            if d >= <uint64_t>self._cbits:
                memset(self._cells, 0, <size_t>self._ncells * 4)   # everything decays to 0
                self._S = e
            else:
                self._sweep()                                      # S = E, and e - E < cbits
        self._E = e
        self._set_window()
        if self._topk._hsize:
            self._topk._topk_decay(d)

    cdef inline int64_t _now(self, object now_ms) except? -1:
        return _clock_now(now_ms, self._clock, self._wall, False)

    cdef inline int64_t _epoch_of(self, int64_t t) noexcept nogil:
        return gs_floordiv(t, self._epoch_ms)

    cdef int _advance_to_time(self, object now_ms) except -1:
        if self._epoch_ms == 0:
            if now_ms is not None:
                self._now(now_ms)   # validated, then ignored: manual epochs move with tick()
            return 0
        cdef int64_t t = self._now(now_ms)
        if t >= self._win_hi:
            self._advance(self._epoch_of(t))
        return 0

    cdef int64_t _query_epoch(self, object now_ms) except? -1:
        """The epoch a read evaluates at: max(E, epoch(now_ms)); reads never move E."""
        cdef int64_t t, e
        if self._epoch_ms == 0:
            if now_ms is not None:
                self._now(now_ms)
            return self._E
        t = self._now(now_ms)
        e = self._epoch_of(t)
        if not self._started or e > self._E:
            return e
        return self._E

    def tick(self, epochs=1):
        """Advance a manual-epoch sketch (``epoch_ms=None``) by ``epochs`` (>= 0) epochs."""
        if self._epoch_ms != 0:
            raise ConfigError("tick() is for manual epochs (epoch_ms=None); this sketch "
                              f"derives epochs from event time (epoch_ms={self._epoch_ms})")
        if isinstance(epochs, bool) or not isinstance(epochs, int) and not hasattr(epochs, "__index__"):
            raise InvalidInputError(f"epochs must be a non-negative integer, got {epochs!r}")
        n = epochs.__index__()
        if n < 0:
            raise InvalidInputError(f"epochs must be non-negative, got {n}")
        if self._E + n > INT64_MAX:
            raise InvalidInputError("epoch counter would overflow a signed 64-bit integer")
        self._advance(self._E + <int64_t>n)
        return self._E

    # ------------------------------------------------------------------ cells

    cdef inline uint32_t _estimate(self, uint64_t h, int64_t q) noexcept nogil:
        """min over rows of the key's counters decayed to epoch q >= E (no write)."""
        cdef uint64_t extra
        cdef uint32_t emod = <uint32_t>(<uint64_t>self._E) & self._smask
        cdef uint32_t est = 0xFFFFFFFFu, v, g, c
        cdef uint32_t r
        cdef uint32_t idx[MAX_DEPTH]
        if not self._started:
            return 0
        extra = <uint64_t>q - <uint64_t>self._E
        if extra >= <uint64_t>self._cbits:
            return 0
        gs_indexes(self._ix, h, self._depth, self._magic, self._width, self._pmask, idx)
        for r in range(self._depth):
            c = self._cells[<Py_ssize_t>r * self._width + idx[r]]
            g = ((emod - (c >> self._cbits)) & self._smask) + <uint32_t>extra
            v = ((c & self._cmask) >> g) if g < <uint32_t>self._cbits else 0
            if v < est:
                est = v
        return est

    cdef inline uint32_t _bump(self, uint64_t h, uint64_t w) noexcept nogil:
        """Decay the key's cells to E, add w (saturating); return the new estimate."""
        cdef uint32_t emod = <uint32_t>(<uint64_t>self._E) & self._smask
        cdef uint32_t stamp = emod << self._cbits
        cdef uint32_t est = 0xFFFFFFFFu, v, r
        cdef uint32_t idx[MAX_DEPTH]
        cdef uint32_t* p
        if w > self._cmask:
            w = self._cmask
        gs_indexes(self._ix, h, self._depth, self._magic, self._width, self._pmask, idx)
        for r in range(self._depth):
            p = self._cells + <Py_ssize_t>r * self._width + idx[r]
            v = _decayed(p[0], emod, self._cbits, self._cmask, self._smask) + <uint32_t>w
            if v > self._cmask:
                v = self._cmask
            p[0] = stamp | v
            if v < est:
                est = v
        return est

    cdef inline Geometry _geometry(self) noexcept nogil:
        """The batch loops' constants, read once per batch (the epoch's fields too)."""
        cdef Geometry g
        g.cells = self._cells
        g.rows = self._depth
        g.width = self._width
        g.magic = self._magic
        g.pmask = self._pmask
        g.ix = self._ix
        g.cbits = self._cbits
        g.cmask = self._cmask
        g.smask = self._smask
        g.emod = <uint32_t>(<uint64_t>self._E) & self._smask
        g.stamp = g.emod << self._cbits
        return g

    cdef void _run_increment(self, const uint64_t* hs, Py_ssize_t n, const uint64_t* ws,
                             uint64_t w0, const int64_t* ts) noexcept nogil:
        """The general batch loop: events in order, with per-event weights (ws), times (ts)
        and the candidate set. Cells of event i + PF are prefetched while event i runs."""
        cdef Geometry G = self._geometry()
        cdef int64_t win_hi = self._win_hi
        cdef bint topk = self._topk._topn > 0
        cdef uint32_t tmin = self._topk._tmin
        cdef Py_ssize_t i, j
        cdef uint32_t r, v, est, c, w
        cdef uint32_t* p
        cdef uint32_t* row
        cdef uint32_t* idx
        cdef uint32_t ring[PF][MAX_DEPTH]
        cdef uint64_t h
        cdef int32_t adm
        if w0 > G.cmask:
            w0 = G.cmask
        w = <uint32_t>w0
        for j in range(n if n < PF else PF):
            _prefetch_rows(G, hs[j], &ring[j & (PF - 1)][0], True)
        for i in range(n):
            if ts != NULL and ts[i] >= win_hi:
                self._advance(self._epoch_of(ts[i]))
                G.emod = <uint32_t>(<uint64_t>self._E) & G.smask
                G.stamp = G.emod << G.cbits
                win_hi = self._win_hi
                tmin = self._topk._tmin
            if ws != NULL:
                w = G.cmask if ws[i] > G.cmask else <uint32_t>ws[i]
            h = hs[i]
            idx = &ring[i & (PF - 1)][0]
            row = G.cells
            est = 0xFFFFFFFFu
            for r in range(G.rows):
                p = row + idx[r]
                c = p[0]
                v = _decayed(c, G.emod, G.cbits, G.cmask, G.smask)
                v = v + w
                if v > G.cmask:
                    v = G.cmask
                p[0] = G.stamp | v
                if v < est:
                    est = v
                row += G.width
            if topk and est > tmin and self._topk._tfind(h) < 0:
                adm = self._topk_touch(h, est)
                if adm >= 0:
                    self._topk._mark_dirty(adm, i)
                tmin = self._topk._tmin
            if i + PF < n:
                _prefetch_rows(G, hs[i + PF], &ring[(i + PF) & (PF - 1)][0], True)

    cdef void _run_plain(self, const uint64_t* hs, Py_ssize_t n, uint32_t w) noexcept nogil:
        """The common batch: one weight, one epoch, no candidate set. Depth 4 under
        independent levels runs gs_cm_inc4_ix (gsketch.h: rows unrolled, no branch per
        cell); otherwise each event's indexes are computed once, when its cells are
        prefetched PF events ahead, and kept in a ring until it is applied."""
        cdef Geometry G = self._geometry()
        cdef Py_ssize_t i, j
        cdef uint32_t r, v, c
        cdef uint32_t* p
        cdef uint32_t* row
        cdef uint32_t* idx
        cdef uint32_t ring[PF][MAX_DEPTH]
        if G.rows == 4 and G.ix == GH_IX_INDEPENDENT:
            gs_cm_inc4_ix(G.cells, hs, n, w if w < G.cmask else G.cmask, G.emod, G.width, G.cbits, G.smask)
            return
        for j in range(n if n < PF else PF):
            _prefetch_rows(G, hs[j], &ring[j & (PF - 1)][0], True)
        for i in range(n):
            idx = &ring[i & (PF - 1)][0]
            row = G.cells
            for r in range(G.rows):
                p = row + idx[r]
                c = p[0]
                v = _decayed(c, G.emod, G.cbits, G.cmask, G.smask)
                v = v + w
                p[0] = G.stamp | (v if v < G.cmask else G.cmask)
                row += G.width
            if i + PF < n:
                _prefetch_rows(G, hs[i + PF], &ring[(i + PF) & (PF - 1)][0], True)

    cdef void _run_query_plain(self, const uint64_t* hs, Py_ssize_t n, int64_t* out) noexcept nogil:
        """The common read: every key at the sketch's current epoch. Depth 4 runs the
        read kernels of gsketch.h (rows unrolled, no branch per cell, constants for the
        default 65536 x 24-bit layout): gs_cm_query4_ix under independent levels (any
        width), gs_cm_query4 under KM (a power-of-two width)."""
        cdef Geometry G = self._geometry()
        cdef Py_ssize_t i, j
        cdef uint32_t r, v, est, c
        cdef uint32_t* row
        cdef uint32_t* idx
        cdef uint32_t ring[PF][MAX_DEPTH]
        if G.rows == 4 and G.ix == GH_IX_INDEPENDENT:
            gs_cm_query4_ix(G.cells, hs, n, out, G.emod, G.width, G.cbits, G.smask)
            return
        if G.rows == 4 and G.pmask != 0:
            gs_cm_query4(G.cells, hs, n, out, G.emod, G.width, G.pmask, G.cbits, G.smask)
            return
        for j in range(n if n < PF else PF):
            _prefetch_rows(G, hs[j], &ring[j & (PF - 1)][0], False)
        for i in range(n):
            idx = &ring[i & (PF - 1)][0]
            row = G.cells
            est = 0xFFFFFFFFu
            for r in range(G.rows):
                c = row[idx[r]]
                v = _decayed(c, G.emod, G.cbits, G.cmask, G.smask)
                est = v if v < est else est
                row += G.width
            out[i] = est
            if i + PF < n:
                _prefetch_rows(G, hs[i + PF], &ring[(i + PF) & (PF - 1)][0], False)

    cdef void _run_query(self, const uint64_t* hs, Py_ssize_t n, const int64_t* ts,
                         int64_t q0, int64_t* out) noexcept nogil:
        cdef Geometry G = self._geometry()
        cdef int64_t win_hi = self._win_hi
        cdef uint64_t extra0 = <uint64_t>q0 - <uint64_t>self._E
        cdef uint64_t extra
        cdef Py_ssize_t i, j
        cdef uint32_t r, v, est, c, g
        cdef uint32_t* row
        cdef uint32_t* idx
        cdef uint32_t ring[PF][MAX_DEPTH]
        if not self._started:
            for i in range(n):
                out[i] = 0
            return
        for j in range(n if n < PF else PF):
            _prefetch_rows(G, hs[j], &ring[j & (PF - 1)][0], False)
        for i in range(n):
            extra = extra0
            if ts != NULL:
                extra = 0
                if ts[i] >= win_hi:
                    extra = <uint64_t>self._epoch_of(ts[i]) - <uint64_t>self._E
            if extra >= <uint64_t>G.cbits:
                est = 0
            else:
                idx = &ring[i & (PF - 1)][0]
                row = G.cells
                est = 0xFFFFFFFFu
                for r in range(G.rows):
                    c = row[idx[r]]
                    g = ((G.emod - (c >> G.cbits)) & G.smask) + <uint32_t>extra
                    v = ((c & G.cmask) >> g) if g < <uint32_t>G.cbits else 0
                    if v < est:
                        est = v
                    row += G.width
            out[i] = est
            if i + PF < n:
                _prefetch_rows(G, hs[i + PF], &ring[(i + PF) & (PF - 1)][0], False)

    # ------------------------------------------------------------------ top-k admission

    cdef int32_t _topk_touch(self, uint64_t h, uint32_t est) noexcept nogil:
        """Offer a key's fresh estimate to the candidate set; return the slot when the
        key was newly admitted (the caller records its key), else -1.

        Stored values are refreshed lazily: a tracked key's touch writes nothing, and
        before an eviction the root is re-read from the matrix (its stored value is a
        lower bound that only grows) until the root's stored value is its current
        estimate; only then is it the candidate with the smallest estimate."""
        cdef int32_t s
        cdef uint32_t cur
        if est == 0:
            return -1
        if self._topk._hsize == self._topk._topn and est <= self._topk._tval[self._topk._heap[0]]:
            return -1                      # not above the minimum (tracked or not: nothing to do)
        if self._topk._tfind(h) >= 0:
            return -1
        if self._topk._hsize < self._topk._topn:
            return self._topk._append(h, est)
        while True:
            s = self._topk._heap[0]
            cur = self._estimate(self._topk._thash[s], self._E)
            if cur <= self._topk._tval[s]:
                break
            self._topk._tval[s] = cur
            self._topk._sift_down(0)
        if est <= self._topk._tval[s]:
            self._topk._update_tmin()
            return -1
        return self._topk._replace_root(h, est)

    # ------------------------------------------------------------------ single-key API

    def increment(self, key, count=1, now_ms=None):
        """Add ``count`` (a non-negative integer weight, saturating) to ``key`` at
        ``now_ms`` (event time; the clock when omitted). Returns None."""
        cdef uint64_t w
        cdef uint64_t h
        cdef uint32_t est
        cdef int32_t adm
        cdef long long c
        if count is 1:
            w = 1
        elif PyLong_CheckExact(count) and 0 <= count <= 0x7FFFFFFFFFFFFFFF:
            c = count
            w = <uint64_t>c
        else:
            w = min(_count_value(count), self._cmask)
        h = hash_key(&self._hasher, key)
        self._advance_to_time(now_ms)
        est = self._bump(h, w)
        if self._topk._topn:
            adm = self._topk_touch(h, est)
            if adm >= 0:
                self._topk._tkeys[adm] = bytes(key) if isinstance(key, bytearray) else key

    def query(self, key, now_ms=None):
        """The decayed estimate of ``key`` at ``now_ms`` (never before the sketch's
        epoch): min over rows, decay applied virtually; nothing is written."""
        cdef uint64_t h = hash_key(&self._hasher, key)
        cdef int64_t q = self._query_epoch(now_ms)
        return self._estimate(h, q)

    # ------------------------------------------------------------------ batch API

    cdef inline tuple _hashes(self, keys):
        return _batch_hashes(&self._hasher, self._scratch, keys)

    cdef object _batch_clock(self, object now_ms, Py_ssize_t n):
        """A batch's times on a sketch with a clock: ``(t0, None)``, one time (None: read the
        clock), or ``(None, int64 array)``, one per key. Manual epochs: ``now_ms`` validated,
        then ignored; None."""
        if self._epoch_ms == 0:
            if now_ms is not None:
                _batch_times(now_ms, n, False)
            return None
        return _batch_times(now_ms, n, False)

    def increment_many(self, keys, counts=None, now_ms=None):
        """Batch twin of :meth:`increment`: the same single increments, in order.

        ``keys``: a list/tuple of bytes/str, a 2-D uint8 array of fixed-width keys, or a
        1-D uint64 array of pre-hashed keys (``grudge_stream.hashing.hash64_many`` with
        this sketch's seed and hasher gives the same result as passing the keys).
        ``counts``: None (1 each), one weight, or one per key. ``now_ms``: None (one
        clock read for the batch), one time, or one per key. Returns the number of keys.
        """
        hashes, source, kind = self._hashes(keys)
        cdef Py_ssize_t n = hashes.shape[0]
        w0, warr = _batch_counts(counts, n)
        cdef const uint64_t[::1] hv = hashes
        cdef const uint64_t[::1] wv
        cdef const uint64_t* wp = NULL
        cdef const int64_t* tp = NULL
        cdef uint64_t w0c = w0 if w0 < self._cmask else self._cmask
        if warr is not None:
            wv = warr
            if n:
                wp = &wv[0]
        clock = self._batch_clock(now_ms, n)
        if clock is not None:
            t0, tarr = clock
            tp = _times_data(tarr)
            if tarr is None:
                self._advance_to_time(t0)
        if n == 0:
            return 0
        # The GIL stays held: every call is atomic to other threads (docs/count-min.md, "Threads").
        if wp == NULL and tp == NULL and self._topk._topn == 0:
            self._run_plain(&hv[0], n, <uint32_t>w0c)
        else:
            self._run_increment(&hv[0], n, wp, w0c, tp)
        if self._topk._ndirty:
            self._topk._resolve_dirty(source, kind)
        return n

    def query_many(self, keys, now_ms=None, out=None):
        """Batch twin of :meth:`query`: an int64 array of estimates, new or ``out`` (a
        writable C-contiguous int64 array of the batch's length, reused across batches
        to save an allocation per batch)."""
        hashes, _, _ = self._hashes(keys)
        cdef Py_ssize_t n = hashes.shape[0]
        cdef const uint64_t[::1] hv = hashes
        cdef const int64_t* tp = NULL
        cdef int64_t q0 = self._E
        if out is None:
            out = np.empty(n, dtype=np.int64)
        elif not (isinstance(out, np.ndarray) and out.dtype == np.int64 and out.ndim == 1
                  and out.shape[0] == n):
            raise InvalidInputError(f"out must be a 1-D int64 numpy array of length {n}")
        cdef int64_t[::1] ov = out
        clock = self._batch_clock(now_ms, n)
        if clock is not None:
            t0, tarr = clock
            tp = _times_data(tarr)
            if tarr is None:
                q0 = self._query_epoch(t0)
        if n == 0:
            return out
        # The GIL stays held: every call is atomic to other threads (docs/count-min.md, "Threads").
        if tp == NULL and q0 == self._E and self._started:
            self._run_query_plain(&hv[0], n, &ov[0])
        else:
            self._run_query(&hv[0], n, tp, q0, &ov[0])
        return out

    # ------------------------------------------------------------------ heavy hitters

    def top(self, k=None, now_ms=None):
        """The current heaviest keys, ``[(key, estimate), ...]`` heaviest first.

        Needs ``top_k=N`` at construction; ``k`` defaults to N and must be <= N.
        Estimates are re-read from the matrix at the sketch's current epoch (or at
        ``now_ms`` when given and later); keys whose estimate decayed to 0 are left
        out; ties are ordered by key hash. A key given as bytes comes back as bytes
        (str as str); a pre-hashed key comes back as its uint64 (a Python int).
        Reading does not change the sketch. See docs/count-min.md for the guarantee.
        """
        cdef int64_t q
        cdef int32_t s
        if self._topk._topn == 0:
            raise ConfigError("top() needs a candidate set: construct the sketch with top_k=N")
        if k is None:
            k = self._topk._topn
        if isinstance(k, bool) or not hasattr(k, "__index__"):
            raise InvalidInputError(f"k must be an integer, got {k!r}")
        k = k.__index__()
        if k < 0 or k > self._topk._topn:
            raise InvalidInputError(f"k must be in [0, top_k={self._topk._topn}], got {k}")
        if now_ms is None or self._epoch_ms == 0:
            q = self._E
            if now_ms is not None:
                self._now(now_ms)
        else:
            q = self._query_epoch(now_ms)
        rows = []
        for s in range(self._topk._hsize):
            est = self._estimate(self._topk._thash[s], q)
            if est:
                rows.append((-<int64_t>est, self._topk._thash[s], s))
        rows.sort()
        out = []
        for negest, h, s in rows[:k]:
            key = self._topk._tkeys[s]
            out.append((h if key is None else key, -negest))
        return out

    def _candidates(self):
        """Debug view of the candidate set: ``[(hash, stored_value, key), ...]`` in heap order."""
        cdef int32_t i, s
        return [(self._topk._thash[self._topk._heap[i]], self._topk._tval[self._topk._heap[i]], self._topk._tkeys[self._topk._heap[i]])
                for i in range(self._topk._hsize)]

    def _decayed_cells(self):
        """Debug view: every counter decayed to the current epoch, shape (depth, width)."""
        cdef Py_ssize_t i
        cdef uint32_t emod = <uint32_t>(<uint64_t>self._E) & self._smask
        out = np.zeros(self._ncells, dtype=np.int64)
        cdef int64_t[::1] ov = out
        if self._started:
            for i in range(self._ncells):
                ov[i] = _decayed(self._cells[i], emod, self._cbits, self._cmask, self._smask)
        return out.reshape(self._depth, self._width)

    def _raw_cells(self):
        """Debug view: a copy of the packed cells, shape (depth, width)."""
        return np.asarray(<uint32_t[:self._ncells]>self._cells).copy().reshape(self._depth, self._width)

    # ------------------------------------------------------------------ merge

    def merge(self, DecayingCountMin other not None):
        """Add ``other`` into this sketch (identical config and seed, else MismatchError).

        Cell by cell, both counters are decayed to the later of the two epochs, then
        added (saturating). Exact (equal to one sketch fed both streams) when no
        halving happened between the inputs' updates; otherwise see docs/count-min.md.
        Candidate sets are united, re-estimated from the merged matrix and cut to N.
        """
        cdef int64_t em
        cdef Py_ssize_t i
        cdef uint32_t emod_a, emod_b, emod_m, stamp, va, vb, v, ga, gb
        cdef uint64_t xa, xb
        cdef uint32_t* a
        cdef uint32_t* b
        if other._config != self._config:
            raise MismatchError(
                f"cannot merge count-min sketches with different configs: {self._config} vs {other._config}")
        if not other._started:
            return None
        # Collect candidates before cells change (keys of both, first seen wins).
        cands = {}
        for s in range(self._topk._hsize):
            cands[self._topk._thash[s]] = self._topk._tkeys[s]
        for s in range(other._topk._hsize):
            if other._topk._thash[s] not in cands:
                cands[other._topk._thash[s]] = other._topk._tkeys[s]
        if not self._started:
            em = other._E
        else:
            em = self._E if self._E > other._E else other._E
        xa = <uint64_t>em - <uint64_t>self._E if self._started else 64
        xb = <uint64_t>em - <uint64_t>other._E
        emod_a = <uint32_t>(<uint64_t>self._E) & self._smask
        emod_b = <uint32_t>(<uint64_t>other._E) & self._smask
        emod_m = <uint32_t>(<uint64_t>em) & self._smask
        stamp = emod_m << self._cbits
        a = self._cells
        b = other._cells
        # The GIL stays held: every call is atomic to other threads (docs/count-min.md, "Threads").
        for i in range(self._ncells):
            ga = (emod_a - (a[i] >> self._cbits)) & self._smask
            gb = (emod_b - (b[i] >> self._cbits)) & self._smask
            va = _shifted(a[i] & self._cmask, xa + ga)
            vb = _shifted(b[i] & self._cmask, xb + gb)
            v = va + vb
            if v > self._cmask:
                v = self._cmask
            a[i] = (stamp | v) if v else 0
        self._E = em
        self._S = em
        self._started = True
        self._set_window()
        self._rebuild_topk(cands)
        return None

    cdef _rebuild_topk(self, dict cands):
        """Refill the candidate set with the N heaviest of `cands` (hash -> key) by the
        current matrix; ties by hash."""
        if self._topk._topn == 0:
            return
        ranked = []
        for h, key in cands.items():
            est = self._estimate(h, self._E)
            if est:
                ranked.append((-<int64_t>est, h, key))
        ranked.sort(key=lambda r: (r[0], r[1]))
        self._topk._refill(ranked[:self._topk._topn])

    # ------------------------------------------------------------------ snapshots

    def to_bytes(self):
        """Serialize: the envelope (magic, version, kind, CRC-32C) around a JSON header
        (full config, epoch state) and the little-endian payload (docs/count-min.md)."""
        cdef int32_t i, s
        header = self._config.to_dict()
        header["epoch"] = self._E if self._started else None
        header["base_epoch"] = self._S if self._started else None
        cells = np.asarray(<uint32_t[:self._ncells]>self._cells).astype("<u4", copy=False).tobytes()
        parts = [cells]
        if self._topk._topn:
            parts.append(struct.pack("<I", self._topk._hsize))
            for i in range(self._topk._hsize):
                s = self._topk._heap[i]
                key = self._topk._tkeys[s]
                if key is None:
                    kind, raw = 0, b""
                elif isinstance(key, str):
                    kind, raw = 2, key.encode("utf-8")
                else:
                    kind, raw = 1, bytes(key)
                parts.append(struct.pack("<QIBI", self._topk._thash[s], self._topk._tval[s], kind, len(raw)))
                parts.append(raw)
        # The cells are copied (tobytes) with the GIL, the sketch's only lock; the parts then go
        # into the envelope once, without it (no join first).
        return pack_parts(KIND_COUNT_MIN, header, parts)

    @classmethod
    def from_bytes(cls, data, *, clock=None, hash_key=None):
        """Restore a sketch from :meth:`to_bytes`; anything truncated, corrupted, of
        another kind or version, or violating an invariant raises SnapshotError.
        ``hash_key``: the secret SipHash key the sketch was keyed with (``use_hash_key``),
        needed to check its top-k candidates."""
        header, payload = unpack(data, KIND_COUNT_MIN)
        cfgmod = _config_module()
        fields = {"depth", "width", "epoch_ms", "counter_bits", "seed", "hasher", "top_k",
                  "epoch", "base_epoch"}
        # index_scheme: absent in 0.2 snapshots and in KM ones, which keep that form.
        if set(header) - {"index_scheme"} != fields:
            raise SnapshotError(f"DecayingCountMin snapshot header has fields {sorted(header)}, "
                                f"expected {sorted(fields)} (and index_scheme)")
        try:
            cfg = cfgmod.CountMinConfig(**{k: header[k] for k in fields - {"epoch", "base_epoch"}},
                                        index_scheme=scheme_of_dict(header))
        except (ConfigError, TypeError) as exc:
            raise SnapshotError(f"DecayingCountMin snapshot holds an invalid config: {exc}") from None
        cdef DecayingCountMin self = DecayingCountMin.__new__(DecayingCountMin)
        self._setup(cfg, clock)
        if hash_key is not None:  # the candidates' keys are checked against their hashes
            set_siphash_key(&self._hasher, hash_key)
        self._load(header, payload)
        return self

    cdef _load(self, dict header, payload):
        cdef Py_ssize_t i, off, nbytes, ncand, klen
        cdef int32_t s
        cdef uint32_t emod, st, c
        cdef uint64_t span
        E, S = header["epoch"], header["base_epoch"]
        for name, v in (("epoch", E), ("base_epoch", S)):
            if v is not None and (type(v) is not int or not -(1 << 63) <= v < (1 << 63)):
                raise SnapshotError(f"DecayingCountMin snapshot field {name} is not a 64-bit integer: {v!r}")
        if (E is None) != (S is None):
            raise SnapshotError("DecayingCountMin snapshot has only one of epoch / base_epoch")
        if E is None and self._epoch_ms == 0:
            raise SnapshotError("DecayingCountMin snapshot with manual epochs lacks its epoch")
        if E is not None and not (S <= E and E - S <= self._smask):
            raise SnapshotError(f"DecayingCountMin snapshot epochs are inconsistent (epoch {E}, base {S})")
        nbytes = payload.nbytes
        if nbytes < self._ncells * 4:
            raise SnapshotError(f"DecayingCountMin payload is {nbytes} bytes, cells need {self._ncells * 4}")
        cells = np.frombuffer(payload, dtype="<u4", count=self._ncells)
        cdef cnp.ndarray[cnp.uint32_t, ndim=1] native = cells.astype(np.uint32)
        cdef uint32_t* src = <uint32_t*>cnp.PyArray_DATA(native)
        if E is None:
            for i in range(self._ncells):
                if src[i] != 0:
                    raise SnapshotError("DecayingCountMin snapshot has nonzero cells before its first epoch")
        else:
            emod = <uint32_t>(<uint64_t><int64_t>E) & self._smask
            span = <uint64_t>(E - S)
            for i in range(self._ncells):
                c = src[i]
                if (c & self._cmask) != 0:
                    st = c >> self._cbits
                    if ((emod - st) & self._smask) > span:
                        raise SnapshotError(
                            f"DecayingCountMin snapshot cell {i} is stamped outside [base_epoch, epoch]")
        for i in range(self._ncells):
            self._cells[i] = src[i]
        if E is not None:
            self._E = E
            self._S = S
            self._started = True
            self._set_window()
        off = self._ncells * 4
        if self._topk._topn == 0:
            if off != nbytes:
                raise SnapshotError("DecayingCountMin payload has trailing bytes")
            return
        view = bytes(payload[off:])
        if len(view) < 4:
            raise SnapshotError("DecayingCountMin payload lacks its candidate-set count")
        (ncand,) = struct.unpack_from("<I", view, 0)
        if ncand > self._topk._topn or (ncand and E is None):
            raise SnapshotError(f"DecayingCountMin snapshot holds {ncand} candidates, top_k is {self._topk._topn}")
        off = 4
        seen = set()
        for i in range(ncand):
            if off + 17 > len(view):
                raise SnapshotError("DecayingCountMin candidate set truncated")
            h, val, kind, klen = struct.unpack_from("<QIBI", view, off)
            off += 17
            if off + klen > len(view):
                raise SnapshotError("DecayingCountMin candidate key truncated")
            raw = view[off:off + klen]
            off += klen
            if kind == 0:
                if klen:
                    raise SnapshotError("DecayingCountMin pre-hashed candidate carries key bytes")
                key = None
            elif kind == 1:
                key = raw
            elif kind == 2:
                try:
                    key = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise SnapshotError("DecayingCountMin candidate str key is not UTF-8") from None
            else:
                raise SnapshotError(f"DecayingCountMin candidate key kind {kind} is unknown")
            if key is not None and hash_key(&self._hasher, key) != h:
                raise SnapshotError("DecayingCountMin candidate key does not match its hash")
            if h in seen:
                raise SnapshotError("DecayingCountMin candidate set lists a key twice")
            seen.add(h)
            if val > self._estimate(h, self._E):
                raise SnapshotError("DecayingCountMin candidate value exceeds the key's estimate")
            s = <int32_t>i
            self._topk._thash[s] = h
            self._topk._tval[s] = val
            self._topk._heap[s] = s
            self._topk._tpos[s] = s
            self._topk._tkeys[s] = key
        if off != len(view):
            raise SnapshotError("DecayingCountMin payload has trailing bytes")
        self._topk._hsize = <int32_t>ncand
        for i in range(1, ncand):
            if self._topk._tless(<int32_t>i, <int32_t>((i - 1) // 2)):
                raise SnapshotError("DecayingCountMin candidate set is not a valid heap")
        for i in range(ncand):
            self._topk._tinsert(self._topk._thash[i], <int32_t>i)
        self._topk._update_tmin()
