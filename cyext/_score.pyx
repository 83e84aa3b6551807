# The ScoreSketch and Rotator kernels: L levels x M cells of (float64 score,
# int64 last_ms). Semantics: spec section 1 and docs/score-sketch.md. The
# per-cell step lives in cell_decayed() and k_op(); the pure-Python reference
# in tests/property/score_reference.py mirrors them float operation for float
# operation, so the two agree bit for bit.
cimport cython
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t, INT64_MIN, INT64_MAX
from libc.math cimport exp, isfinite, ceil
from libc.string cimport memcpy
from libc.stdlib cimport free
from libc.float cimport DBL_MAX
cimport numpy as cnp
import numpy as np
import collections
import sys

from ghash cimport (set_siphash_key, Hasher, make_hasher, key_view, hash_key, gh_km_index,
                    gh_ix_indexes, GH_IX_KM, GH_IX_INDEPENDENT,
                    gh_hash, gh_splitmix64, GH_GOLDEN, GH_MURMUR3, GH_SIPHASH)

from grudge_stream import envelope as _envelope
from grudge_stream.sketches.score_config import RotatorConfig, ScoreSketchConfig, resolve_seed

include "_common.pxi"

cnp.import_array()

cdef extern from "score_kernel.h":
    ctypedef struct gs_cell:
        double score
        int64_t last_ms
    ctypedef struct gs_lock:
        int state
        int waiters
    void gs_lock_acquire_gil(gs_lock* l)
    void gs_lock_acquire_nogil(gs_lock* l) nogil
    void gs_lock_release(gs_lock* l) nogil
    void gs_lock_courtesy(gs_lock* l) nogil
    gs_cell* gs_table_alloc(size_t n) nogil
    void gs_table_reset(gs_cell* t, size_t n) nogil

cdef extern from "gsketch.h":
    void gs_prefetch_w(const void* p) nogil


cdef enum:
    MAXL = 64        # most levels a sketch may have (stack arrays are sized by it)
    MAXG = 16        # most generations a Rotator may have
    PF = 8           # batch prefetch distance in events (a power of two): ~8 events of
                     # work hide one L3/DRAM miss on the cells of event i+PF
    CHUNK = 1024     # events per lock hold in batch loops (bounds another thread's wait)

cdef enum:
    OP_QUERY = 0
    OP_UPDATE = 1
    OP_TRY = 2
    OP_BUCKET = 3    # try; on refusal add the penalty instead of the delta

cdef enum:
    D_NONE = 0
    D_EXPONENTIAL = 1
    D_LINEAR = 2

cdef enum:
    A_MIN = 0
    A_MAX = 1
    A_MEAN = 2

DECAY_NONE = D_NONE
DECAY_EXPONENTIAL = D_EXPONENTIAL
DECAY_LINEAR = D_LINEAR
MAX_LEVELS = MAXL
MAX_GENERATIONS = MAXG

_AGG_CODES = {"min": A_MIN, "max": A_MAX, "mean": A_MEAN}
_HASH_CODES = {"murmur3": GH_MURMUR3, "siphash": GH_SIPHASH}
_CELL_LE = np.dtype([("score", "<f8"), ("last_ms", "<i8")])
_CELL_NATIVE = np.dtype([("score", "=f8"), ("last_ms", "=i8")])
_LITTLE = sys.byteorder == "little"

QueryDetail = collections.namedtuple("QueryDetail", ["aggregate", "level_scores", "cell_indexes"])
QueryDetail.__doc__ = """One key's read: the aggregate, each level's decayed score and cell index."""


ctypedef struct Core:
    uint32_t L
    uint32_t M
    int ix            # index scheme: GH_IX_INDEPENDENT or GH_IX_KM (ghash.h)
    int decay         # DECAY_* code
    int agg           # A_* code
    double param      # lambda_per_s or rate_per_s
    double lo         # bounds, narrowed to the finite doubles: an add that overflows
    double hi         # saturates at +-DBL_MAX instead of storing an infinity

ctypedef struct DCache:
    uint64_t dt       # the last dt an exp() was computed for (0: none; dt > 0 when used)
    double f


# ---- the per-cell step -----------------------------------------------------------

cdef inline double cell_decayed(const Core* c, double s, int64_t last, int64_t now,
                                DCache* dc) noexcept nogil:
    """A cell's score decayed from `last` to `now`; dt = max(0, now - last)."""
    cdef uint64_t dti
    cdef double step, t
    # dt == 0 and s == 0 are exact no-ops of every decay: skip the arithmetic.
    if now <= last or s == 0.0:
        return s
    dti = <uint64_t>now - <uint64_t>last        # exact even across the int64 range
    if c.decay == D_EXPONENTIAL:
        if dti != dc.dt:                        # the L cells of a key often share a dt
            dc.dt = dti
            dc.f = exp(-c.param * (<double>dti / 1000.0))
        return s * dc.f
    if c.decay == D_LINEAR:
        step = (c.param * <double>dti) / 1000.0
        if s > 0.0:
            t = s - step
            return t if t > 0.0 else 0.0
        t = s + step
        return t if t < 0.0 else 0.0
    return s


cdef inline double clampc(const Core* c, double s) noexcept nogil:
    if s < c.lo:
        return c.lo
    if s > c.hi:
        return c.hi
    return s


cdef inline double agg_fold(int agg, double acc, double s, uint32_t i) noexcept nogil:
    if agg == A_MEAN:
        return acc + s
    if i == 0:
        return s
    if agg == A_MIN:
        return s if s < acc else acc
    return s if s > acc else acc


cdef inline double agg_finish(const Core* c, double acc) noexcept nogil:
    if c.agg == A_MEAN:
        return acc / <double>c.L
    return acc


cdef inline void k_levels(const Core* c, uint64_t h, uint32_t* idx) noexcept nogil:
    """The L cell indexes of hash h under the sketch's index scheme (one branch per key)."""
    cdef uint32_t i
    if c.ix == GH_IX_INDEPENDENT:
        gh_ix_indexes(h, c.L, c.M, idx)
    else:
        for i in range(c.L):
            idx[i] = gh_km_index(h, i, c.M)


cdef inline void k_index(const Core* c, gs_cell* t, uint64_t h, uint32_t* idx) noexcept nogil:
    """The cell indexes of hash h (k_levels), prefetching each cell."""
    cdef uint32_t i
    k_levels(c, h, idx)
    for i in range(c.L):
        gs_prefetch_w(t + <size_t>i * c.M + idx[i])


cdef inline double k_peek(const Core* c, const gs_cell* t, const uint32_t* idx, int64_t now,
                          double* levels) noexcept nogil:
    """What OP_QUERY returns for one key's L cells, with nothing written: each cell decayed
    to ``now`` (the same cell_decayed steps, so the values are bit-identical)."""
    cdef uint32_t i
    cdef const gs_cell* cell
    cdef double s, acc = 0.0
    cdef DCache dc
    dc.dt = 0
    dc.f = 1.0
    for i in range(c.L):
        cell = t + <size_t>i * c.M + idx[i]
        s = cell_decayed(c, cell.score, cell.last_ms, now, &dc)
        levels[i] = s
        acc = agg_fold(c.agg, acc, s, i)
    return agg_finish(c, acc)


cdef inline double k_op(const Core* c, gs_cell* t, const uint32_t* idx, int64_t now,
                        double delta, int op, double limit, double penalty, bint* admitted,
                        DCache* dc, double* levels) noexcept nogil:
    """One operation on one key's L cells (ascending level order); returns the
    aggregate after the operation. Per cell: decay to now -> (writes) add ->
    clamp -> stamp last_ms = max(last_ms, now)."""
    cdef uint32_t i, L = c.L, M = c.M
    cdef gs_cell* cell
    cdef double s, acc = 0.0, add = 0.0
    cdef double sc[MAXL]
    cdef bint adm = True, write
    if op == OP_QUERY or op == OP_UPDATE:
        for i in range(L):
            cell = t + <size_t>i * M + idx[i]
            s = cell_decayed(c, cell.score, cell.last_ms, now, dc)
            if op == OP_UPDATE:
                s = clampc(c, s + delta)
            cell.score = s
            if now > cell.last_ms:
                cell.last_ms = now
            if levels != NULL:
                levels[i] = s
            acc = agg_fold(c.agg, acc, s, i)
        return agg_finish(c, acc)
    # try_update: decide on the aggregate after decay, before any add or clamp.
    for i in range(L):
        cell = t + <size_t>i * M + idx[i]
        s = cell_decayed(c, cell.score, cell.last_ms, now, dc)
        sc[i] = s
        acc = agg_fold(c.agg, acc, s, i)
    adm = agg_finish(c, acc) + delta <= limit
    if adm:
        write, add = True, delta
    else:
        write, add = op == OP_BUCKET and penalty != 0.0, penalty
    acc = 0.0
    for i in range(L):
        cell = t + <size_t>i * M + idx[i]
        s = sc[i]
        if write:
            s = clampc(c, s + add)
        cell.score = s
        if now > cell.last_ms:
            cell.last_ms = now
        if levels != NULL:
            levels[i] = s
        acc = agg_fold(c.agg, acc, s, i)
    if admitted != NULL:
        admitted[0] = adm
    return agg_finish(c, acc)


cdef inline bint k_admits_at(const Core* c, gs_cell* t, const uint32_t* idx, int64_t at,
                             double cost, double limit) noexcept nogil:
    """Would try_update(cost, limit) admit at time `at`? Reads without writing."""
    cdef uint32_t i
    cdef gs_cell* cell
    cdef double acc = 0.0
    cdef DCache dc
    dc.dt = 0
    dc.f = 1.0
    for i in range(c.L):
        cell = t + <size_t>i * c.M + idx[i]
        acc = agg_fold(c.agg, acc, cell_decayed(c, cell.score, cell.last_ms, at, &dc), i)
    return agg_finish(c, acc) + cost <= limit


cdef int64_t k_retry_after(const Core* c, gs_cell* t, const uint32_t* idx, int64_t now,
                           double cost, double limit) noexcept nogil:
    """The smallest integer w >= 0 such that a try_update(cost, limit) at now + w
    admits, with no other traffic in between; -1 if none. Linear decay and lo = 0
    only (so every cell drains to exactly 0 and admission is monotone in w)."""
    cdef uint32_t i
    cdef gs_cell* cell
    cdef double x = limit - cost, rate_ms = c.param / 1000.0, need, w_min = -1.0, w_max = 0.0
    cdef int64_t horizon = INT64_MAX - now if now >= 0 else INT64_MAX
    cdef int64_t lo, hi, mid, cand
    if not (0.0 + cost <= limit) or c.param <= 0.0:
        return -1                              # even an empty bucket refuses
    if k_admits_at(c, t, idx, now, cost, limit):
        return 0
    # Closed form per cell: it drains to x after (s - x) / rate ms past its stamp.
    for i in range(c.L):
        cell = t + <size_t>i * c.M + idx[i]
        need = (<double>cell.last_ms - <double>now) + ceil((cell.score - x) / rate_ms)
        if i == 0 or need < w_min:
            w_min = need
        need = (<double>cell.last_ms - <double>now) + ceil(cell.score / rate_ms) + 2.0  # drained
        if need > w_max:
            w_max = need
    hi = horizon if w_max >= <double>horizon else <int64_t>w_max
    if not k_admits_at(c, t, idx, now + hi, cost, limit):
        return -1                              # not within representable time
    # min aggregator: the first cell to reach x decides; settle rounding on the predicate.
    if w_min < 1.0:
        w_min = 1.0
    if w_min <= <double>hi:
        cand = <int64_t>w_min
        if cand <= hi and k_admits_at(c, t, idx, now + cand, cost, limit) \
                and not k_admits_at(c, t, idx, now + cand - 1, cost, limit):
            return cand
    lo = 0                                     # refuses at lo, admits at hi
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        if k_admits_at(c, t, idx, now + mid, cost, limit):
            hi = mid
        else:
            lo = mid
    return hi


cdef double k_merge_cells(const Core* c, gs_cell* dst, const gs_cell* src, size_t n) noexcept nogil:
    """dst[i] <- both cells decayed to the later stamp, summed, clamped."""
    cdef size_t i
    cdef int64_t t
    cdef double a, b
    cdef DCache dc
    dc.dt = 0
    dc.f = 1.0
    for i in range(n):
        t = dst[i].last_ms if dst[i].last_ms >= src[i].last_ms else src[i].last_ms
        a = cell_decayed(c, dst[i].score, dst[i].last_ms, t, &dc)
        b = cell_decayed(c, src[i].score, src[i].last_ms, t, &dc)
        dst[i].score = clampc(c, a + b)
        dst[i].last_ms = t
    return 0.0


def decay_apply(int code, double param, double score, int64_t dt_ms):
    """One cell's decay over dt_ms (<= 0: unchanged), exactly as the kernel computes it."""
    cdef Core c
    cdef DCache dc
    if code not in (D_NONE, D_EXPONENTIAL, D_LINEAR):
        raise ValueError(f"unknown decay code {code}")
    c.decay = code
    c.param = param
    dc.dt = 0
    dc.f = 1.0
    return cell_decayed(&c, score, 0, dt_ms, &dc)


cdef extern from "pythread.h":
    ctypedef void* PyThread_type_lock
    PyThread_type_lock PyThread_allocate_lock()
    void PyThread_free_lock(PyThread_type_lock l)
    int PyThread_acquire_lock(PyThread_type_lock l, int waitflag) nogil
    void PyThread_release_lock(PyThread_type_lock l) nogil


def _lock_cost(Py_ssize_t n=1_000_000):
    """Uncontended acquire+release cost in ns (for benchmarks/bench_score.py): this
    kernel's lock with and without the GIL, and a PyThread lock for comparison."""
    import time
    cdef gs_lock lk
    cdef Py_ssize_t i
    cdef PyThread_type_lock pl = PyThread_allocate_lock()
    lk.state = 0
    lk.waiters = 0
    out = {}
    t = time.perf_counter_ns()
    for i in range(n):
        gs_lock_acquire_gil(&lk)
        gs_lock_release(&lk)
    out["gs_lock_with_gil_ns"] = (time.perf_counter_ns() - t) / n
    t = time.perf_counter_ns()
    with nogil:
        for i in range(n):
            gs_lock_acquire_nogil(&lk)
            gs_lock_release(&lk)
    out["gs_lock_nogil_ns"] = (time.perf_counter_ns() - t) / n
    t = time.perf_counter_ns()
    with nogil:
        for i in range(n):
            PyThread_acquire_lock(pl, 1)
            PyThread_release_lock(pl)
    out["pythread_lock_nogil_ns"] = (time.perf_counter_ns() - t) / n
    PyThread_free_lock(pl)
    return out


# ---- argument handling (all before any cell is touched) ----------------------------

cdef inline int _check_delta(double d, str what) except -1:
    if not isfinite(d):
        raise InvalidInputError(f"{what} must be finite, got {d!r}")
    return 0


cdef tuple _f64_arg(object x, Py_ssize_t n, str what):
    """``(None, v)`` for one value (a Python or numpy real scalar), or ``(float64 array,
    0.0)`` for one value per event (any real dtype, the batch's length). All finite."""
    cdef double v
    cdef const double* p
    cdef Py_ssize_t i, m
    if type(x) is float or type(x) is int:
        try:
            v = x
        except OverflowError:
            raise InvalidInputError(f"{what} must be finite, got {x!r}") from None
        if not isfinite(v):
            raise InvalidInputError(f"{what} must be finite, got {x!r}")
        return None, v
    arr = np.asarray(x)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{what} must be real numbers, not {arr.dtype}")
    if arr.ndim == 0:
        return _f64_arg(float(arr), n, what)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise _length_error(what, n, arr.shape)
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    cdef Py_ssize_t bad = -1
    p = <const double*>cnp.PyArray_DATA(arr)
    m = arr.shape[0]
    with nogil:
        for i in range(m):
            if not isfinite(p[i]):
                bad = i
                break
    if bad >= 0:
        raise InvalidInputError(f"{what} must be finite; element {bad} is {p[bad]!r}")
    return arr, 0.0


cdef int _setup_core(Core* c, object cfg) except -1:
    c.L = <uint32_t>cfg.levels
    c.M = <uint32_t>cfg.cells_per_level
    c.ix = GH_IX_INDEPENDENT if cfg.index_scheme == "independent" else GH_IX_KM
    c.decay = cfg.decay._code
    c.param = cfg.decay._param
    c.agg = _AGG_CODES[cfg.aggregator]
    c.lo = cfg.lo if cfg.lo > -DBL_MAX else -DBL_MAX
    c.hi = cfg.hi if cfg.hi < DBL_MAX else DBL_MAX
    return 0


cdef gs_cell* _alloc(size_t n) except NULL:
    cdef gs_cell* t = gs_table_alloc(n)
    if t == NULL:
        raise MemoryError(f"cannot allocate {n} cells ({16 * n} bytes)")
    gs_table_reset(t, n)
    return t


def _validate_cells(payload, cfg, watermark, Py_ssize_t ncells, str what):
    """Check a snapshot's cell array; return it as native-endian cells or raise."""
    if payload.nbytes != 16 * ncells:
        raise SnapshotError(f"{what} payload is {payload.nbytes} bytes; its config needs {16 * ncells}")
    arr = np.frombuffer(payload, dtype=_CELL_LE)
    scores = arr["score"]
    stamps = arr["last_ms"]
    lo = max(cfg.lo, -DBL_MAX)
    hi = min(cfg.hi, DBL_MAX)
    if not np.isfinite(scores).all():
        raise SnapshotError(f"{what} holds a non-finite score")
    if (scores < lo).any() or (scores > hi).any():
        raise SnapshotError(f"{what} holds a score outside [lo, hi] = [{cfg.lo!r}, {cfg.hi!r}]")
    fresh = stamps == INT64_MIN
    if (scores[fresh] != 0.0).any():
        raise SnapshotError(f"{what} holds a never-stamped cell with a non-zero score")
    if not fresh.all():
        if watermark is None or int(stamps[~fresh].max()) > watermark:
            raise SnapshotError(f"{what} holds a cell stamped after the sketch's watermark")
    return arr if _LITTLE else arr.astype(_CELL_NATIVE)


cdef object _watermark_from(object header, str what):
    wm = header.get("watermark_ms")
    if wm is None:
        return None
    if type(wm) is not int or not (INT64_MIN < wm <= INT64_MAX):
        raise SnapshotError(f"{what} watermark_ms must be null or an int64, got {wm!r}")
    return wm




cdef class BatchArgs:
    """A batch call's validated arguments (keys hashed, deltas and limits finite, times
    int64) and its result array, with raw pointers for the nogil loops: a value given
    once is held here and read with step 0, one per event from its array with step 1.
    All arguments are checked before any cell is touched."""
    cdef object hashes, darr, larr, tarr, res
    cdef Py_ssize_t n, ds, ls, ts
    cdef double d0, l0
    cdef int64_t t0
    cdef const uint64_t* hs
    cdef const double* dv
    cdef const double* lv
    cdef const int64_t* tv
    cdef double* outf
    cdef uint8_t* outb

    def __cinit__(self):
        self.outf = NULL
        self.outb = NULL

    def __init__(self, *args):
        raise TypeError("BatchArgs is built by the kernels only")


cdef BatchArgs _batch_args(Hasher* hasher, keys, deltas, limits, now_ms, int out):
    """``out``: 0 no result, 1 float64 scores, 2 bool admissions. ``now_ms`` is never
    None here (the driver reads the clock first)."""
    cdef BatchArgs a = BatchArgs.__new__(BatchArgs)
    # New hashes, not a reused buffer: the loop runs without the GIL, so another thread's
    # call could rewrite a shared one under it.
    a.hashes = _batch_hashes(hasher, None, keys)[0]
    a.n = a.hashes.shape[0]
    a.hs = <const uint64_t*>cnp.PyArray_DATA(a.hashes)
    a.darr, a.d0 = _f64_arg(deltas, a.n, "deltas")
    a.larr, a.l0 = _f64_arg(limits, a.n, "limit")
    t0, a.tarr = _batch_times(now_ms, a.n, True)
    if a.darr is None:
        a.dv, a.ds = &a.d0, 0
    else:
        a.dv, a.ds = <const double*>cnp.PyArray_DATA(a.darr), 1
    if a.larr is None:
        a.lv, a.ls = &a.l0, 0
    else:
        a.lv, a.ls = <const double*>cnp.PyArray_DATA(a.larr), 1
    if a.tarr is None:
        a.t0 = t0
        a.tv, a.ts = &a.t0, 0
    else:
        a.tv, a.ts = <const int64_t*>cnp.PyArray_DATA(a.tarr), 1
    a.res = None
    if out == 1:
        a.res = np.empty(a.n, dtype=np.float64)
        a.outf = <double*>cnp.PyArray_DATA(a.res)
    elif out == 2:
        a.res = np.empty(a.n, dtype=np.bool_)
        a.outb = <uint8_t*>cnp.PyArray_DATA(a.res)
    return a


cdef inline void _put_result(double* outf, uint8_t* outb, Py_ssize_t i, double r, bint adm) noexcept nogil:
    """One batch element's result into the array the caller asked for (``BatchArgs.res``)."""
    if outf != NULL:
        outf[i] = r
    if outb != NULL:
        outb[i] = adm


# ---- what ScoreSketch and Rotator share ----------------------------------------------

cdef class _ScoreKernel(_Sketch):
    """The half ScoreSketch and Rotator share: the cells' shape and decay (``_core``),
    the hasher, the lock, the watermark, the clock, and the batch driver
    (``_score_batch``): it checks a call's arguments, then runs the subclass's
    ``_run`` over its events without the GIL."""
    cdef Core _core
    cdef size_t _ncells              # per table (a Rotator has one per generation)
    cdef gs_lock _lock
    cdef int64_t _watermark

    def __cinit__(self):
        self._watermark = INT64_MIN

    def __init__(self, *args, **kwargs):
        raise TypeError("_ScoreKernel is the base of ScoreSketch and Rotator only")

    cdef int _bind(self, object cfg, object sketch, object clock) except -1:
        """Shape, decay and hasher from ``sketch`` (a ScoreSketchConfig), the full
        ``cfg`` and an already checked ``clock``; the watermark starts unset."""
        _setup_core(&self._core, sketch)
        self._ncells = <size_t>sketch.levels * <size_t>sketch.cells_per_level
        self._hasher = make_hasher(_HASH_CODES[sketch.hasher], <uint64_t>sketch.seed)
        self._watermark = INT64_MIN
        self._config = cfg
        self._bind_clock(clock)
        return 0

    # -- properties -------------------------------------------------------------------

    @property
    def shape(self):
        """``(rows, cells_per_row)`` of one cell table: ``(levels, cells_per_level)``
        (a Rotator has one such table per generation)."""
        return (self._core.L, self._core.M)

    @property
    def watermark_ms(self):
        """The latest now_ms any operation carried (None before the first)."""
        return None if self._watermark == INT64_MIN else self._watermark

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    # -- hashing ----------------------------------------------------------------------

    def key_hash(self, key):
        """The 64-bit hash this sketch uses for ``key`` (what its batch API takes
        pre-hashed; a Rotator remixes it per generation)."""
        return hash_key(&self._hasher, key)

    def key_hashes(self, keys):
        """``key_hash`` of every key, as a uint64 array."""
        return _batch_hashes(&self._hasher, None, keys)[0]

    # -- the batch driver -------------------------------------------------------------

    cdef inline int64_t _now(self, object now_ms) except? -1:
        return _clock_now(now_ms, self._clock, self._wall, True)

    def update_many(self, keys, deltas, now_ms=None):
        """``update`` for each event in order. ``keys``: a list/tuple of bytes/str keys or
        a uint64 array of ``key_hashes``; ``deltas`` and ``now_ms``: scalars or arrays
        of the batch's length. Runs without the GIL."""
        _score_batch(self, keys, deltas, 0.0, now_ms, OP_UPDATE, 0)

    def query_many(self, keys, now_ms=None):
        """``query`` for each event in order; returns a float64 array."""
        return _score_batch(self, keys, 0.0, 0.0, now_ms, OP_QUERY, 1)

    def update_and_query_many(self, keys, deltas, now_ms=None):
        """``update_and_query`` for each event in order; returns a float64 array."""
        return _score_batch(self, keys, deltas, 0.0, now_ms, OP_UPDATE, 1)

    def try_update_many(self, keys, deltas, limit, now_ms=None):
        """``try_update`` for each event in order; returns a bool array. ``limit`` is a
        scalar or an array of the batch's length."""
        return _score_batch(self, keys, deltas, limit, now_ms, OP_TRY, 2)

    # -- single-key operations (a Rotator: decided and read on its oldest generation, added
    # to every generation) ----------------------------------------------------------------

    cdef double _single(self, uint64_t h, int64_t now, double delta, int op, double limit,
                        double penalty, bint* adm, double* levels, uint32_t* idx) noexcept:
        return 0.0  # each kernel has its own

    def update(self, key, double delta, now_ms=None):
        """Add ``delta`` to the key's score at ``now_ms`` (each cell: decay, add, clamp, stamp)."""
        cdef uint32_t idx[MAXL]
        cdef uint64_t h = hash_key(&self._hasher, key)
        cdef int64_t now = self._now(now_ms)
        _check_delta(delta, "delta")
        self._single(h, now, delta, OP_UPDATE, 0.0, 0.0, NULL, NULL, idx)

    def query(self, key, now_ms=None):
        """The key's score at ``now_ms`` (0.0 for a fresh key). Writes the decay back."""
        cdef uint32_t idx[MAXL]
        cdef uint64_t h = hash_key(&self._hasher, key)
        cdef int64_t now = self._now(now_ms)
        return self._single(h, now, 0.0, OP_QUERY, 0.0, 0.0, NULL, NULL, idx)

    def update_and_query(self, key, double delta, now_ms=None):
        """``update`` then the score after it (post-clamp), atomically."""
        cdef uint32_t idx[MAXL]
        cdef uint64_t h = hash_key(&self._hasher, key)
        cdef int64_t now = self._now(now_ms)
        _check_delta(delta, "delta")
        return self._single(h, now, delta, OP_UPDATE, 0.0, 0.0, NULL, NULL, idx)

    def try_update(self, key, double delta, double limit, now_ms=None):
        """Add ``delta`` iff (score after decay) + delta <= limit; return whether it did.

        The test runs before clamping; the cells are decayed and stamped either way.
        """
        cdef uint32_t idx[MAXL]
        cdef bint adm = False
        cdef uint64_t h = hash_key(&self._hasher, key)
        cdef int64_t now = self._now(now_ms)
        _check_delta(delta, "delta")
        _check_delta(limit, "limit")
        self._single(h, now, delta, OP_TRY, limit, 0.0, &adm, NULL, idx)
        return adm

    def query_detailed(self, key, now_ms=None):
        """``QueryDetail(aggregate, level_scores, cell_indexes)`` for one key (a read)."""
        cdef uint32_t idx[MAXL]
        cdef double lv[MAXL]
        cdef uint64_t h = hash_key(&self._hasher, key)
        cdef int64_t now = self._now(now_ms)
        cdef double r = self._single(h, now, 0.0, OP_QUERY, 0.0, 0.0, NULL, lv, idx)
        cdef uint32_t i
        return QueryDetail(r, tuple([lv[i] for i in range(self._core.L)]),
                           tuple([idx[i] for i in range(self._core.L)]))


cdef inline object _score_batch(_ScoreKernel k, keys, deltas, limits, now_ms, int op, int out):
    """The batch driver of both score kernels: check the arguments (``_batch_args``),
    then run the events without the GIL through the kernel's own loop. Inlined into
    each ``*_many`` with its op, and calling ``_run`` directly (not through the
    vtable), so the C compiler specialises each loop for its op as before."""
    cdef BatchArgs a = _batch_args(&k._hasher, keys, deltas, limits,
                                   k._now(None) if now_ms is None else now_ms, out)
    cdef ScoreSketch s
    cdef Rotator r
    if a.n:
        if type(k) is ScoreSketch:
            s = <ScoreSketch>k
            with nogil:
                s._run(a.hs, a.n, a.dv, a.ds, a.tv, a.ts, a.lv, a.ls, op, a.outf, a.outb)
        else:
            r = <Rotator>k
            with nogil:
                r._run(a.hs, a.n, a.dv, a.ds, a.tv, a.ts, a.lv, a.ls, op, a.outf, a.outb)
    return a.res


# ---- ScoreSketch ------------------------------------------------------------------

@cython.final

cdef class ScoreSketch(_ScoreKernel):
    """Decaying feedback scores over unbounded keys in fixed memory.

    ``ScoreSketch(levels, cells_per_level, decay, lo=0.0, hi=inf,
    aggregator="min", hasher="murmur3", seed=None, clock=None)`` (keywords).

    ``levels`` x ``cells_per_level`` cells of ``(float64 score, int64 last_ms)``.
    A key maps to one cell per level (one 64-bit hash; each level's index from its
    own bits of it, ``index_scheme``); every operation decays those cells lazily to ``now_ms``, then
    (writes) adds the delta and clamps to ``[lo, hi]``, and stamps them; reads
    write the decay back too. The key's score is the ``aggregator`` (``min``,
    ``max`` or ``mean``) of its cells.

    Parameters:
        levels: 1..64. More levels cut collisions (see ``suggest_levels``).
        cells_per_level: 1..2**32-1.
        decay: ``Exponential(lambda_per_s)``, ``Linear(rate_per_s)`` or ``NoDecay()``.
        lo, hi: clamp bounds, ``lo < hi``, ``lo <= 0 <= hi``; an infinite bound
            needs a decay other than NoDecay (and saturates at +-1.8e308).
        aggregator: ``"min"`` (default; never underestimates with non-negative
            deltas), ``"max"`` or ``"mean"``.
        hasher: ``"murmur3"`` (default) or ``"siphash"`` (use it when attackers
            choose the keys).
        seed: 0..2**64-1; ``None`` means 0 (no randomness without a seed; pass a
            secret seed, or ``use_hash_key``, when attackers choose the keys).
        index_scheme: ``"independent"`` (default: two keys share all their cells by
            chance about ``cells_per_level**-levels``) or ``"km"`` (Kirsch-Mitzenmacher,
            grudge-stream 0.2's and grudge's: all cells decided by ~2 log2(M) hash bits;
            for their snapshots and test vectors). docs/hashing.md.
        clock: where ``now_ms`` comes from when omitted (default: system clock).

    Memory: ``memory_bytes() == 16 * levels * cells_per_level +
    ScoreSketch.__basicsize__``, all allocated at construction.
    Error: with non-negative deltas and ``min``, ``query(k) >= k``'s exact score,
    exact when one of k's cells is not shared. Thread-safe (each event is atomic).
    """
    cdef gs_cell* _table

    def __cinit__(self):
        self._table = NULL

    def __dealloc__(self):
        if self._table != NULL:
            free(self._table)
            self._table = NULL

    def __init__(self, *, levels, cells_per_level, decay, lo=0.0, hi=float("inf"),
                 aggregator="min", hasher="murmur3", seed=None, index_scheme="independent",
                 clock=None):
        cfg = ScoreSketchConfig(levels=levels, cells_per_level=cells_per_level, decay=decay,
                                lo=lo, hi=hi, aggregator=aggregator, hasher=hasher,
                                seed=resolve_seed(seed), index_scheme=index_scheme)
        self._setup(cfg, clock)

    cdef int _setup(self, object cfg, object clock) except -1:
        cdef gs_cell* t
        clock = _clock_of(clock)
        t = _alloc(<size_t>cfg.levels * <size_t>cfg.cells_per_level)
        if self._table != NULL:
            free(self._table)
        self._table = t
        self._bind(cfg, cfg, clock)
        return 0

    # -- properties ---------------------------------------------------------------

    levels = _from_config("levels")
    cells_per_level = _from_config("cells_per_level")

    def memory_bytes(self):
        """``16 * levels * cells_per_level + ScoreSketch.__basicsize__`` (fixed at construction)."""
        return 16 * self._ncells + ScoreSketch.__basicsize__

    def __repr__(self):
        c = self._config
        return (f"ScoreSketch(levels={c.levels}, cells_per_level={c.cells_per_level}, "
                f"decay={c.decay!r}, lo={c.lo!r}, hi={c.hi!r}, aggregator={c.aggregator!r}, "
                f"hasher={c.hasher!r}, seed={c.seed}, index_scheme={c.index_scheme!r})")

    # -- single-key operations --------------------------------------------------------

    cdef double _single(self, uint64_t h, int64_t now, double delta, int op, double limit,
                        double penalty, bint* adm, double* levels, uint32_t* idx) noexcept:
        cdef DCache dc
        cdef double r
        dc.dt = 0
        dc.f = 1.0
        k_index(&self._core, self._table, h, idx)
        gs_lock_acquire_gil(&self._lock)
        r = k_op(&self._core, self._table, idx, now, delta, op, limit, penalty, adm, &dc, levels)
        if now > self._watermark:
            self._watermark = now
        gs_lock_release(&self._lock)
        return r

    def peek_detailed(self, key, now_ms):
        """``query_detailed(key, now_ms)`` without writing anything: the cells keep their
        stored values and stamps, and the watermark does not move. For reads that must
        not change the state (a live query beside a worker whose snapshots must equal a
        replay's); ``now_ms`` is required (the watermark, typically)."""
        cdef uint32_t idx[MAXL]
        cdef double lv[MAXL]
        cdef uint64_t h = hash_key(&self._hasher, key)
        cdef int64_t now = _time_ms(now_ms, True)
        cdef double r
        cdef uint32_t i
        k_index(&self._core, self._table, h, idx)
        gs_lock_acquire_gil(&self._lock)
        r = k_peek(&self._core, self._table, idx, now, lv)
        gs_lock_release(&self._lock)
        return QueryDetail(r, tuple([lv[i] for i in range(self._core.L)]),
                           tuple([idx[i] for i in range(self._core.L)]))

    def _bucket_allow(self, key, double cost, double limit, double penalty, now_ms=None):
        """Token-bucket step (see grudge_stream.recipes): try_update(cost, limit); on
        refusal add ``penalty``; return (allowed, retry_after_ms or -1, debt after)."""
        cdef uint32_t idx[MAXL]
        cdef bint adm = False
        cdef DCache dc
        cdef double r
        cdef int64_t retry = 0
        cdef uint64_t h = hash_key(&self._hasher, key)
        cdef int64_t now = self._now(now_ms)
        _check_delta(cost, "cost")
        _check_delta(limit, "limit")
        _check_delta(penalty, "penalty")
        if self._core.decay != D_LINEAR or self._core.lo != 0.0:
            raise ConfigError("a token bucket needs Linear decay and lo=0")
        dc.dt = 0
        dc.f = 1.0
        k_index(&self._core, self._table, h, idx)
        gs_lock_acquire_gil(&self._lock)
        r = k_op(&self._core, self._table, idx, now, cost, OP_BUCKET, limit, penalty, &adm, &dc, NULL)
        if now > self._watermark:
            self._watermark = now
        if not adm:
            retry = k_retry_after(&self._core, self._table, idx, now, cost, limit)
        gs_lock_release(&self._lock)
        return adm, retry, r

    # -- batch operations -----------------------------------------------------------

    cdef void _run(self, const uint64_t* hs, Py_ssize_t n, const double* dv, Py_ssize_t ds,
                   const int64_t* tv, Py_ssize_t ts, const double* lv, Py_ssize_t ls, int op,
                   double* outf, uint8_t* outb) noexcept nogil:
        cdef uint32_t ring[PF][MAXL]
        cdef Py_ssize_t i, j, start = 0, end
        cdef DCache dc
        cdef bint adm = False
        cdef double r
        cdef int64_t now
        dc.dt = 0
        dc.f = 1.0
        while start < n:
            end = start + CHUNK if start + CHUNK < n else n
            for j in range(start, start + PF if start + PF < end else end):
                k_index(&self._core, self._table, hs[j], &ring[j & (PF - 1)][0])
            gs_lock_acquire_nogil(&self._lock)
            for i in range(start, end):
                now = tv[i * ts]
                r = k_op(&self._core, self._table, &ring[i & (PF - 1)][0], now, dv[i * ds], op,
                         lv[i * ls], 0.0, &adm, &dc, NULL)
                if i + PF < end:
                    k_index(&self._core, self._table, hs[i + PF], &ring[(i + PF) & (PF - 1)][0])
                if now > self._watermark:
                    self._watermark = now
                _put_result(outf, outb, i, r, adm)
            gs_lock_release(&self._lock)
            gs_lock_courtesy(&self._lock)
            start = end

    # -- whole-sketch operations ----------------------------------------------------

    cdef object _cells_copy(self):
        # The copy (megabytes) runs without the GIL, under the sketch's own lock: a writer
        # elsewhere waits for the lock (gs_lock_acquire_gil gives the GIL up meanwhile), other
        # Python threads go on. Nothing here needs the GIL while the lock is held.
        cdef cnp.ndarray arr = np.empty(self._ncells, dtype=_CELL_NATIVE)
        cdef void* dst = cnp.PyArray_DATA(arr)
        cdef int64_t wm
        with nogil:
            gs_lock_acquire_nogil(&self._lock)
            memcpy(dst, self._table, 16 * self._ncells)
            wm = self._watermark
            gs_lock_release(&self._lock)
        return arr, wm

    def _cells(self):
        """A copy of the cell table as a (levels, cells_per_level) structured array."""
        arr, _ = self._cells_copy()
        return arr.reshape(self._core.L, self._core.M)

    def saturation_counts(self, now_ms, double lam_per_ms, double hot_at, double in_use_at,
                          double refill_per_s=0.0, bint above=False):
        """Per level, the cells whose score decayed to ``now_ms`` (``score * exp(-lam_per_ms *
        age)``, age 0 for a cell never written or without ``now_ms``) is at least ``hot_at``,
        and at least ``in_use_at``: two int64 arrays of ``levels``. What
        ``grudge_stream.operators.saturation`` measures, in one pass over the cells in place
        (no copy), without the GIL, under the sketch's lock.

        A token bucket's debt refills linearly instead: with ``refill_per_s`` > 0 each cell's
        value is ``max(0, score - refill_per_s * age / 1000)`` (no exponential decay then).
        ``above``: count the values strictly above the thresholds, not at or above them."""
        cdef cnp.ndarray hot = np.zeros(self._core.L, dtype=np.int64)
        cdef cnp.ndarray use = np.zeros(self._core.L, dtype=np.int64)
        cdef int64_t* ph = <int64_t*>cnp.PyArray_DATA(hot)
        cdef int64_t* pu = <int64_t*>cnp.PyArray_DATA(use)
        cdef int64_t now = INT64_MIN if now_ms is None else <int64_t>now_ms
        cdef size_t m = self._core.M, i
        cdef int lvl
        cdef double v
        cdef int64_t age, nh, nu
        cdef const gs_cell* c
        cdef bint refill = refill_per_s > 0.0
        if refill:
            lam_per_ms = 0.0
        # A cell at 0 (most of a sparse table) stays 0: judged once, not per cell.
        cdef bint zero_hot = (0.0 > hot_at) if above else (0.0 >= hot_at)
        cdef bint zero_use = (0.0 > in_use_at) if above else (0.0 >= in_use_at)
        with nogil:
            gs_lock_acquire_nogil(&self._lock)
            for lvl in range(self._core.L):
                c = self._table + <size_t>lvl * m
                nh = 0
                nu = 0
                for i in range(m):
                    v = c[i].score
                    if v == 0.0:
                        nh += zero_hot
                        nu += zero_use
                        continue
                    age = 0
                    if now != INT64_MIN and c[i].last_ms != INT64_MIN and now > c[i].last_ms:
                        age = now - c[i].last_ms
                    if refill:
                        v = v - refill_per_s * <double>age / 1000.0
                        if v < 0.0:
                            v = 0.0
                    elif lam_per_ms != 0.0 and age != 0:
                        v = v * exp(-lam_per_ms * <double>age)
                    if above:
                        nh += v > hot_at
                        nu += v > in_use_at
                    else:
                        nh += v >= hot_at
                        nu += v >= in_use_at
                ph[lvl] = nh
                pu[lvl] = nu
            gs_lock_release(&self._lock)
        return hot, use

    def copy(self):
        """An independent sketch with the same config, clock and state."""
        cdef ScoreSketch other = ScoreSketch.__new__(ScoreSketch)
        arr, wm = self._cells_copy()
        other._setup(self._config, self._clock)
        other._hasher = self._hasher  # a secret key set with use_hash_key comes along
        memcpy(other._table, cnp.PyArray_DATA(arr), 16 * self._ncells)
        other._watermark = wm
        return other

    def merge(self, ScoreSketch other not None):
        """Fold ``other`` into this sketch in place: each cell pair decayed to the later
        stamp, summed, clamped. Needs an identical config and seed (else MismatchError)."""
        cdef cnp.ndarray arr
        if other._config != self._config:
            raise MismatchError(
                f"cannot merge ScoreSketches with different configs or seeds: "
                f"{self._config!r} vs {other._config!r}")
        arr, wm = other._cells_copy()      # other's lock is released before ours is taken
        gs_lock_acquire_gil(&self._lock)
        k_merge_cells(&self._core, self._table, <const gs_cell*>cnp.PyArray_DATA(arr), self._ncells)
        if wm > self._watermark:
            self._watermark = wm
        gs_lock_release(&self._lock)

    def to_bytes(self):
        """A versioned, checksummed snapshot (format: docs/score-sketch.md)."""
        return self.to_bytes_later()()

    def to_bytes_later(self):
        """``to_bytes`` in two steps: the cells copied now (one memcpy), the snapshot made
        by calling the result, later and on any thread (the sketch may change meanwhile)."""
        later = self.envelope_later()

        def make():
            return _envelope.build(later())
        return make

    def envelope_later(self):
        """``to_bytes_later`` whose result makes the envelope not built yet
        (``grudge_stream.envelope.later``): a snapshot that holds the sketch writes it in
        place."""
        arr, wm = self._cells_copy()
        header = {"config": self._config.to_dict(),
                  "watermark_ms": None if wm == INT64_MIN else wm}

        def make():
            return _envelope.later(_envelope.KIND_SCORE_SKETCH, header,
                                   ((arr if _LITTLE else arr.astype(_CELL_LE)).view(np.uint8),))
        return make

    @classmethod
    def from_bytes(cls, data, *, clock=None):
        """Load a ``to_bytes`` snapshot; anything truncated, corrupt, of another kind or
        version, or with an invalid config or cells raises SnapshotError."""
        cdef ScoreSketch sk
        header, payload = _envelope.unpack(data, _envelope.KIND_SCORE_SKETCH)
        if set(header) != {"config", "watermark_ms"}:
            raise SnapshotError(f"ScoreSketch snapshot header fields must be config, watermark_ms; "
                                f"got {sorted(header)}")
        try:
            cfg = ScoreSketchConfig.from_dict(header["config"])
        except ConfigError as exc:
            raise SnapshotError(f"ScoreSketch snapshot has an invalid config: {exc}") from None
        wm = _watermark_from(header, "ScoreSketch snapshot")
        arr = _validate_cells(payload, cfg, wm, cfg.levels * cfg.cells_per_level, "ScoreSketch snapshot")
        sk = ScoreSketch.__new__(ScoreSketch)
        sk._setup(cfg, clock)
        memcpy(sk._table, cnp.PyArray_DATA(np.ascontiguousarray(arr)), 16 * sk._ncells)
        sk._watermark = INT64_MIN if wm is None else wm
        return sk


# ---- split-sign scores ----------------------------------------------------------------

cdef inline double _clamp2(double s, double lo, double hi) noexcept nogil:
    return lo if s < lo else (hi if s > hi else s)


cdef inline void _split_index(const Core* c, gs_cell* tp, gs_cell* tn, uint64_t h,
                              uint32_t* idx) noexcept nogil:
    """k_index for a split pair: one set of indexes, both tables' cells prefetched."""
    cdef uint32_t i
    k_levels(c, h, idx)
    for i in range(c.L):
        gs_prefetch_w(tp + <size_t>i * c.M + idx[i])
        gs_prefetch_w(tn + <size_t>i * c.M + idx[i])


cdef inline double _split_event(const Core* c, gs_cell* tp, gs_cell* tn, const uint32_t* idx,
                                int64_t now, double d, double lo, double hi,
                                DCache* dp, DCache* dn) noexcept nogil:
    """One signed event on a split pair; the score after it. Each cell is decayed once and
    written once."""
    cdef uint32_t i, L = c.L, M = c.M
    cdef gs_cell* cp
    cdef gs_cell* cn
    cdef double sp[MAXL]
    cdef double sf[MAXL]
    cdef double p = 0.0, f = 0.0, s, inc, addp = 0.0, addf = 0.0, v, w
    for i in range(L):
        cp = tp + <size_t>i * M + idx[i]
        cn = tn + <size_t>i * M + idx[i]
        sp[i] = cell_decayed(c, cp.score, cp.last_ms, now, dp)
        sf[i] = cell_decayed(c, cn.score, cn.last_ms, now, dn)
        p = sp[i] if (i == 0 or sp[i] < p) else p
        f = sf[i] if (i == 0 or sf[i] < f) else f
    s = _clamp2(p - f, lo, hi)
    # Only what the clamped score can still take: no punishment above hi, no
    # forgiveness banked below lo (the exact clamped model discards both).
    if d > 0.0:
        inc = hi - s
        addp = d if d < inc else inc
        if addp < 0.0:
            addp = 0.0
    elif d < 0.0:
        inc = s - lo
        addf = -d if -d < inc else inc
        if addf < 0.0:
            addf = 0.0
    for i in range(L):
        cp = tp + <size_t>i * M + idx[i]
        cn = tn + <size_t>i * M + idx[i]
        # Conservative update: a cell is raised only to the key's estimate plus the amount,
        # never by the amount on top of what colliding keys put there. Every cell stays at
        # or above the sum of each of its keys' own amounts (decay scales all alike), so the
        # halves keep their one-sided error with far less collision mass in them.
        v = sp[i]
        if addp > 0.0 and p + addp > v:
            v = clampc(c, p + addp)
        w = sf[i]
        if addf > 0.0 and f + addf > w:
            w = clampc(c, f + addf)
        cp.score = v
        cn.score = w
        if now > cp.last_ms:
            cp.last_ms = now
        if now > cn.last_ms:
            cn.last_ms = now
    # Every cell is now at least the old minimum plus the amount, and the minimum cell
    # is exactly that: the new estimates are known without a third pass.
    return _clamp2((p + addp) - (f + addf), lo, hi)


cdef void _split_run(ScoreSketch pos, ScoreSketch neg, const uint64_t* hs, Py_ssize_t n,
                     const double* dv, Py_ssize_t ds, const int64_t* tv, Py_ssize_t ts,
                     double lo, double hi, double* out) noexcept nogil:
    cdef uint32_t ring[PF][MAXL]
    cdef Py_ssize_t i, j, start = 0, end
    cdef DCache dp, dn
    cdef double r
    cdef int64_t now
    cdef const Core* c = &pos._core
    cdef gs_cell* tp = pos._table
    cdef gs_cell* tn = neg._table
    dp.dt = 0
    dp.f = 1.0
    dn.dt = 0
    dn.f = 1.0
    while start < n:
        end = start + CHUNK if start + CHUNK < n else n
        for j in range(start, start + PF if start + PF < end else end):
            _split_index(c, tp, tn, hs[j], &ring[j & (PF - 1)][0])
        gs_lock_acquire_nogil(&pos._lock)
        gs_lock_acquire_nogil(&neg._lock)
        for i in range(start, end):
            now = tv[i * ts]
            r = _split_event(c, tp, tn, &ring[i & (PF - 1)][0], now, dv[i * ds], lo, hi, &dp, &dn)
            if i + PF < end:
                _split_index(c, tp, tn, hs[i + PF], &ring[(i + PF) & (PF - 1)][0])
            if now > pos._watermark:
                pos._watermark = now
            if now > neg._watermark:
                neg._watermark = now
            if out != NULL:
                out[i] = r
        gs_lock_release(&neg._lock)
        gs_lock_release(&pos._lock)
        gs_lock_courtesy(&pos._lock)
        start = end


def split_apply(ScoreSketch pos not None, ScoreSketch neg not None, keys, deltas, now_ms,
                double lo, double hi, bint want_scores=True):
    """Signed deltas on a split-sign pair: ``pos`` keeps punishment, ``neg`` forgiveness.

    Per event, in order: the key's score is ``clamp(pos - neg, lo, hi)`` (both read at
    ``now_ms``); a positive delta adds ``min(delta, hi - score)`` to ``pos``, a negative one
    ``min(-delta, score - lo)`` to ``neg``; returns the scores after each event (float64),
    or None with ``want_scores=False``. ``keys``: keys or ``pos.key_hashes``. Both sketches
    must share levels, cells per level, decay and seed (``SplitScoreSketch`` builds them so).
    """
    cdef BatchArgs a
    if pos is neg:
        raise ValueError("split_apply needs two distinct sketches")
    if (pos._core.L != neg._core.L or pos._core.M != neg._core.M or pos._core.decay != neg._core.decay
            or pos._core.param != neg._core.param):
        raise ConfigError("the punishment and forgiveness sketches must have the same shape and decay")
    if not lo < hi:
        raise ConfigError(f"split scores need lo < hi, got [{lo!r}, {hi!r}]")
    a = _batch_args(&pos._hasher, keys, deltas, 0.0, pos._now(None) if now_ms is None else now_ms,
                    1 if want_scores else 0)
    if a.n:
        with nogil:
            _split_run(pos, neg, a.hs, a.n, a.dv, a.ds, a.tv, a.ts, lo, hi, a.outf)
    return a.res


def split_apply_one(ScoreSketch pos not None, ScoreSketch neg not None, key, double delta, now_ms,
                    double lo, double hi):
    """``split_apply`` of one event, without its arrays (a per-event caller's: embedded
    state's ``update``): the key's score after it. The pair must be a ``SplitScoreSketch``'s
    (``split_apply`` checks that; this is its hot path)."""
    cdef uint64_t h = hash_key(&pos._hasher, key)
    cdef int64_t now = pos._now(now_ms)
    cdef double out = 0.0
    if pos is neg:
        raise ValueError("split_apply_one needs two distinct sketches")
    with nogil:
        _split_run(pos, neg, &h, 1, &delta, 0, &now, 0, lo, hi, &out)
    return out


def split_peek(ScoreSketch pos not None, ScoreSketch neg not None, key, now_ms, double lo, double hi):
    """One key's read on a split-sign pair, nothing written: ``(score, p, f)`` with ``p`` and
    ``f`` each half's ``QueryDetail`` at ``now_ms`` and ``score = clamp(p - f, lo, hi)``.

    Both halves are read under both locks, taken in ``split_apply``'s order, so the read sees
    every event of a concurrent batch applied to both halves or to neither (never a
    punishment without its forgiveness)."""
    cdef uint32_t idx[MAXL]
    cdef double lp[MAXL]
    cdef double ln[MAXL]
    cdef double rp, rn
    cdef uint32_t i, L = pos._core.L
    cdef uint64_t h = hash_key(&pos._hasher, key)
    cdef int64_t now = _time_ms(now_ms, True)
    if pos is neg:
        raise ValueError("split_peek needs two distinct sketches")
    if pos._core.L != neg._core.L or pos._core.M != neg._core.M:
        raise ConfigError("the punishment and forgiveness sketches must have the same shape")
    _split_index(&pos._core, pos._table, neg._table, h, idx)
    with nogil:
        gs_lock_acquire_nogil(&pos._lock)
        gs_lock_acquire_nogil(&neg._lock)
        rp = k_peek(&pos._core, pos._table, idx, now, lp)
        rn = k_peek(&neg._core, neg._table, idx, now, ln)
        gs_lock_release(&neg._lock)
        gs_lock_release(&pos._lock)
    cells = tuple([idx[i] for i in range(L)])
    return (_clamp2(rp - rn, lo, hi), QueryDetail(rp, tuple([lp[i] for i in range(L)]), cells),
            QueryDetail(rn, tuple([ln[i] for i in range(L)]), cells))


def _exact_reference(key_ids, deltas, now_ms, Py_ssize_t n_keys, double lambda_per_s,
                     double lo, double hi):
    """The exact per-key model the sketches estimate (tests and benchmarks): one float64
    score per key id (0..n_keys-1), decayed exponentially to each event's time, the delta
    added and clamped to [lo, hi]; returns the score after each event (float64)."""
    cdef const int64_t[::1] ids = np.ascontiguousarray(key_ids, dtype=np.int64)
    cdef const double[::1] dv = np.ascontiguousarray(deltas, dtype=np.float64)
    cdef const int64_t[::1] tv = np.ascontiguousarray(now_ms, dtype=np.int64)
    cdef Py_ssize_t n = ids.shape[0], i, bad = -1
    if dv.shape[0] != n or tv.shape[0] != n:
        raise InvalidInputError("key_ids, deltas and now_ms must have one length")
    score_arr = np.zeros(n_keys, dtype=np.float64)
    last_arr = np.zeros(n_keys, dtype=np.int64)
    out_arr = np.empty(n, dtype=np.float64)
    cdef double[::1] sc = score_arr
    cdef int64_t[::1] last = last_arr
    cdef double[::1] out = out_arr
    cdef double lam = lambda_per_s / 1000.0, s
    cdef int64_t k, t
    with nogil:
        for i in range(n):
            k = ids[i]
            if k < 0 or k >= n_keys:
                bad = i
                break
            t = tv[i]
            s = sc[k]
            if s != 0.0 and t > last[k]:
                s = s * exp(-lam * <double>(t - last[k]))
            if t > last[k]:
                last[k] = t
            s = _clamp2(s + dv[i], lo, hi)
            sc[k] = s
            out[i] = s
    if bad >= 0:
        raise InvalidInputError(f"key ids must be in [0, n_keys); element {bad} is {ids[bad]}")
    return out_arr


# ---- Rotator ------------------------------------------------------------------------

cdef inline uint64_t generation_seed(uint64_t seed, uint64_t number) noexcept nogil:
    """Output number+2 of splitmix64 started at `seed` (outputs 0 and 1 key SipHash)."""
    return gh_splitmix64(seed + (number + 2) * GH_GOLDEN)


@cython.final
cdef class Rotator(_ScoreKernel):
    """N generations of ScoreSketch cells that rotate on event time.

    ``Rotator(generations=2, period_ms=..., seed=None, clock=None, **score_sketch_kwargs)``.

    Writes go to every generation; reads and ``try_update`` decisions come from
    the oldest; ``try_update`` writes to the younger generations only when the
    oldest admits. When event time crosses a multiple of ``period_ms`` (origin
    0; checked in every operation) or on ``rotate()``, the oldest generation is
    dropped, the next one becomes the oldest and an empty one joins as the
    youngest, so state older than ``(generations - 1) * period_ms`` is forgotten
    at promotion and any stale value or collision lives at most
    ``generations * period_ms``.

    Generation number g (counted from 0 since construction; the live ones are
    ``rotations .. rotations + generations - 1``, oldest first) indexes a key by
    ``splitmix64(hash ^ gseed(g))`` with ``gseed(g)`` the (g+2)-th splitmix64
    output from ``seed``, so each generation has its own independent cells while
    a key is hashed once (pre-hashed uint64 input is ``key_hash(key)``).

    ``seed=None`` means seed 0, as for ScoreSketch: nothing is drawn at random (pass a
    secret seed, or ``use_hash_key``, when attackers choose the keys).

    Memory: ``generations * 16 * levels * cells_per_level + Rotator.__basicsize__``.
    """
    cdef gs_cell* _tables[MAXG]      # ring: generation i (0 = oldest) is slot (head + i) % n
    cdef uint64_t _gseed[MAXG]       # by generation position, oldest first
    cdef int _n
    cdef int _head
    cdef int64_t _period             # 0: manual rotation only
    cdef int64_t _epoch
    cdef uint64_t _rotations
    cdef uint64_t _seed

    def __cinit__(self):
        cdef int g
        for g in range(MAXG):
            self._tables[g] = NULL
        self._n = 0

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        cdef int g
        for g in range(MAXG):
            if self._tables[g] != NULL:
                free(self._tables[g])
                self._tables[g] = NULL

    def __init__(self, *, generations=2, period_ms, seed=None, clock=None, **score_sketch_kwargs):
        try:
            sk = ScoreSketchConfig(seed=resolve_seed(seed), **score_sketch_kwargs)
        except TypeError as exc:
            raise ConfigError(f"Rotator: {exc}") from None
        self._setup(RotatorConfig(generations=generations, period_ms=period_ms, sketch=sk), clock)

    cdef int _setup(self, object cfg, object clock) except -1:
        cdef int g
        cdef size_t ncells = <size_t>cfg.sketch.levels * <size_t>cfg.sketch.cells_per_level
        clock = _clock_of(clock)
        self._free()
        for g in range(cfg.generations):
            self._tables[g] = _alloc(ncells)
        self._n = cfg.generations
        self._head = 0
        self._bind(cfg, cfg.sketch, clock)
        self._seed = <uint64_t>cfg.sketch.seed
        self._period = 0 if cfg.period_ms is None else cfg.period_ms
        self._epoch = 0
        self._rotations = 0
        self._derive_seeds()
        return 0

    cdef void _derive_seeds(self) noexcept nogil:
        cdef int g
        for g in range(self._n):
            self._gseed[g] = generation_seed(self._seed, self._rotations + <uint64_t>g)

    cdef void _rotate(self, uint64_t k) noexcept nogil:
        cdef uint64_t j
        cdef int g
        if k >= <uint64_t>self._n:
            for g in range(self._n):
                gs_table_reset(self._tables[g], self._ncells)
        else:
            for j in range(k):
                gs_table_reset(self._tables[self._head], self._ncells)
                self._head = (self._head + 1) % self._n
        self._rotations += k
        self._derive_seeds()

    @cython.cdivision(True)
    cdef inline void _advance(self, int64_t now) noexcept nogil:
        cdef int64_t e
        if self._period <= 0:
            return
        e = now // self._period                      # C truncation (cdivision)
        if now < 0 and e * self._period != now:
            e -= 1                                   # floor, not truncation
        if e > self._epoch:
            self._rotate(<uint64_t>(e - self._epoch))
            self._epoch = e

    cdef inline gs_cell* _gen(self, int g) noexcept nogil:
        return self._tables[(self._head + g) % self._n]

    cdef double _op(self, uint64_t h, int64_t now, double delta, int op, double limit,
                    bint* adm, DCache* dc, double* levels, uint32_t* idx_out) noexcept nogil:
        cdef uint32_t idx[MAXG][MAXL]
        cdef int g, ng
        cdef uint32_t i
        cdef bint a = True
        cdef double r
        self._advance(now)
        if now > self._watermark:
            self._watermark = now
        ng = 1 if op == OP_QUERY else self._n
        for g in range(ng):
            k_index(&self._core, self._gen(g), gh_splitmix64(h ^ self._gseed[g]), &idx[g][0])
        if idx_out != NULL:
            for i in range(self._core.L):
                idx_out[i] = idx[0][i]
        if op == OP_TRY:
            r = k_op(&self._core, self._gen(0), &idx[0][0], now, delta, OP_TRY, limit, 0.0,
                     &a, dc, levels)
        else:
            r = k_op(&self._core, self._gen(0), &idx[0][0], now, delta, op, 0.0, 0.0,
                     NULL, dc, levels)
        if op != OP_QUERY and a:
            for g in range(1, self._n):
                k_op(&self._core, self._gen(g), &idx[g][0], now, delta, OP_UPDATE, 0.0, 0.0,
                     NULL, dc, NULL)
        if adm != NULL:
            adm[0] = a
        return r

    # -- properties -----------------------------------------------------------------

    @property
    def seed(self):
        return self._config.sketch.seed

    generations = _from_config("generations")
    period_ms = _from_config("period_ms")

    @property
    def rotations(self):
        """Rotations so far: event-time boundaries crossed since time 0 plus ``rotate()`` calls."""
        return self._rotations

    @property
    def epoch(self):
        """``floor(latest now_ms / period_ms)`` seen so far (0 before any, or without a period)."""
        return self._epoch

    @property
    def generation_seeds(self):
        """The live generations' seeds, oldest first."""
        return tuple([self._gseed[g] for g in range(self._n)])

    def memory_bytes(self):
        """``generations * 16 * levels * cells_per_level + Rotator.__basicsize__``."""
        return self._n * 16 * self._ncells + Rotator.__basicsize__

    def __repr__(self):
        c = self._config
        s = c.sketch
        return (f"Rotator(generations={c.generations}, period_ms={c.period_ms}, levels={s.levels}, "
                f"cells_per_level={s.cells_per_level}, decay={s.decay!r}, lo={s.lo!r}, hi={s.hi!r}, "
                f"aggregator={s.aggregator!r}, hasher={s.hasher!r}, seed={s.seed}, "
                f"index_scheme={s.index_scheme!r}, rotations={self._rotations})")

    # -- operations -------------------------------------------------------------------

    cdef double _single(self, uint64_t h, int64_t now, double delta, int op, double limit,
                        double penalty, bint* adm, double* levels, uint32_t* idx) noexcept:
        # (penalty: token buckets only, which a Rotator does not offer)
        cdef DCache dc
        cdef double r
        dc.dt = 0
        dc.f = 1.0
        gs_lock_acquire_gil(&self._lock)
        r = self._op(h, now, delta, op, limit, adm, &dc, levels, idx)
        gs_lock_release(&self._lock)
        return r

    def rotate(self):
        """Force one rotation now: drop the oldest generation, add an empty youngest."""
        gs_lock_acquire_gil(&self._lock)
        self._rotate(1)
        gs_lock_release(&self._lock)

    def advance(self, now_ms=None):
        """Apply any event-time rotation due at ``now_ms`` without touching cells."""
        cdef int64_t now = self._now(now_ms)
        gs_lock_acquire_gil(&self._lock)
        self._advance(now)
        if now > self._watermark:
            self._watermark = now
        gs_lock_release(&self._lock)

    cdef void _run(self, const uint64_t* hs, Py_ssize_t n, const double* dv, Py_ssize_t ds,
                   const int64_t* tv, Py_ssize_t ts, const double* lv, Py_ssize_t ls, int op,
                   double* outf, uint8_t* outb) noexcept nogil:
        cdef Py_ssize_t i, start = 0, end
        cdef DCache dc
        cdef bint adm = False
        cdef double r
        dc.dt = 0
        dc.f = 1.0
        while start < n:
            end = start + CHUNK if start + CHUNK < n else n
            gs_lock_acquire_nogil(&self._lock)
            for i in range(start, end):
                r = self._op(hs[i], tv[i * ts], dv[i * ds], op, lv[i * ls], &adm, &dc, NULL, NULL)
                _put_result(outf, outb, i, r, adm)
            gs_lock_release(&self._lock)
            gs_lock_courtesy(&self._lock)
            start = end

    # -- whole-rotator operations ------------------------------------------------------

    cdef tuple _state_copy(self):
        cdef cnp.ndarray arr = np.empty(self._n * self._ncells, dtype=_CELL_NATIVE)
        cdef char* p = <char*>cnp.PyArray_DATA(arr)
        cdef int g
        cdef int64_t epoch, wm
        cdef uint64_t rotations
        with nogil:  # as ScoreSketch._cells_copy: under the rotator's lock, without the GIL
            gs_lock_acquire_nogil(&self._lock)
            for g in range(self._n):
                memcpy(p + <size_t>g * 16 * self._ncells, self._gen(g), 16 * self._ncells)
            rotations, epoch, wm = self._rotations, self._epoch, self._watermark
            gs_lock_release(&self._lock)
        return arr, (rotations, epoch, wm)

    cdef int _load(self, const char* p, tuple state) except -1:
        cdef int g
        self._head = 0
        for g in range(self._n):
            memcpy(self._tables[g], p + <size_t>g * 16 * self._ncells, 16 * self._ncells)
        self._rotations, self._epoch, self._watermark = state
        self._derive_seeds()
        return 0

    def _cells(self):
        """A copy of all generations' cells, shape (generations, levels, cells_per_level), oldest first."""
        arr, _ = self._state_copy()
        return arr.reshape(self._n, self._core.L, self._core.M)

    def copy(self):
        cdef Rotator other = Rotator.__new__(Rotator)
        arr, state = self._state_copy()
        other._setup(self._config, self._clock)
        other._hasher = self._hasher  # a secret key set with use_hash_key comes along
        other._load(<const char*>cnp.PyArray_DATA(arr), state)
        return other

    def merge(self, Rotator other not None):
        """Merge generation by generation; needs identical config, seed, rotation count
        and epoch (else MismatchError)."""
        cdef cnp.ndarray arr
        cdef const char* p
        cdef int g
        if other._config != self._config:
            raise MismatchError(f"cannot merge Rotators with different configs or seeds: "
                                f"{self._config!r} vs {other._config!r}")
        arr, state = other._state_copy()
        p = <const char*>cnp.PyArray_DATA(arr)
        gs_lock_acquire_gil(&self._lock)
        if state[0] != self._rotations or state[1] != self._epoch:
            gs_lock_release(&self._lock)
            raise MismatchError(
                f"cannot merge Rotators at different rotation states: rotations/epoch "
                f"{self._rotations}/{self._epoch} vs {state[0]}/{state[1]}")
        for g in range(self._n):
            k_merge_cells(&self._core, self._gen(g), <const gs_cell*>(p + <size_t>g * 16 * self._ncells),
                          self._ncells)
        if state[2] > self._watermark:
            self._watermark = state[2]
        gs_lock_release(&self._lock)

    def to_bytes(self):
        """A versioned, checksummed snapshot (format: docs/score-sketch.md)."""
        cdef uint64_t rot
        arr, state = self._state_copy()
        if not _LITTLE:
            arr = arr.astype(_CELL_LE)
        rotations, epoch, wm = state
        rot = rotations
        header = {
            "config": self._config.to_dict(),
            "rotations": rotations,
            "epoch": epoch,
            "generation_seeds": [generation_seed(self._seed, rot + <uint64_t>g) for g in range(self._n)],
            "watermark_ms": None if wm == INT64_MIN else wm,
        }
        return _envelope.pack(_envelope.KIND_ROTATOR, header, arr.view(np.uint8))

    @classmethod
    def from_bytes(cls, data, *, clock=None):
        """Load a ``to_bytes`` snapshot or raise SnapshotError."""
        cdef Rotator r
        cdef uint64_t rot
        header, payload = _envelope.unpack(data, _envelope.KIND_ROTATOR)
        fields = {"config", "rotations", "epoch", "generation_seeds", "watermark_ms"}
        if set(header) != fields:
            raise SnapshotError(f"Rotator snapshot header fields must be {sorted(fields)}; got {sorted(header)}")
        try:
            cfg = RotatorConfig.from_dict(header["config"])
        except ConfigError as exc:
            raise SnapshotError(f"Rotator snapshot has an invalid config: {exc}") from None
        rotations, epoch = header["rotations"], header["epoch"]
        if type(rotations) is not int or not 0 <= rotations < 2**64:
            raise SnapshotError(f"Rotator snapshot rotations must be a uint64, got {rotations!r}")
        if type(epoch) is not int or not 0 <= epoch <= INT64_MAX or (cfg.period_ms is None and epoch != 0):
            raise SnapshotError(f"Rotator snapshot epoch {epoch!r} is invalid")
        rot = rotations
        seeds = [generation_seed(<uint64_t>cfg.sketch.seed, rot + <uint64_t>g) for g in range(cfg.generations)]
        if header["generation_seeds"] != seeds:
            raise SnapshotError("Rotator snapshot generation seeds do not follow from its seed and rotations")
        wm = _watermark_from(header, "Rotator snapshot")
        if cfg.period_ms is not None and wm is not None and wm // cfg.period_ms > epoch:
            raise SnapshotError("Rotator snapshot watermark is past its epoch")
        ncells = cfg.sketch.levels * cfg.sketch.cells_per_level
        if payload.nbytes != 16 * ncells * cfg.generations:
            raise SnapshotError(f"Rotator snapshot payload is {payload.nbytes} bytes; its config needs "
                                f"{16 * ncells * cfg.generations}")
        parts = [
            _validate_cells(payload[16 * ncells * g:16 * ncells * (g + 1)], cfg.sketch, wm, ncells,
                            f"Rotator snapshot generation {g}")
            for g in range(cfg.generations)
        ]
        arr = np.ascontiguousarray(np.concatenate(parts))
        r = Rotator.__new__(Rotator)
        r._setup(cfg, clock)
        r._load(<const char*>cnp.PyArray_DATA(arr),
                (rotations, epoch, INT64_MIN if wm is None else wm))
        return r
