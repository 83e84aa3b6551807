# The layer every sketch kernel shares, in one copy: `include "_common.pxi"` (it is
# text included into _score.pyx, _countmin.pyx and _bloom.pyx, not a module of its
# own). It holds the clock (the default, the check, reading now_ms), the parsing of
# one time argument, the reusable hash buffer and key-hashing prelude of a batch,
# and the sketches' base class (config, hasher, clock, pickle guard). Layout: /work/shared/spec/LAYOUT.md ("_common").
cimport cython
from libc.stdint cimport int64_t, uint64_t, INT64_MIN
from cpython.long cimport PyLong_AsLongLongAndOverflow

from ghash cimport Hasher, set_siphash_key
from gkeys cimport hash_items, hash_rows

from grudge_stream.clock import SystemClock as _SystemClock, as_ms as _as_ms, default_clock as _default_clock
from grudge_stream.exceptions import ConfigError, InvalidInputError, MismatchError, SnapshotError
from grudge_stream.sketches._inputs import ROWS as _ROWS, prepare_keys as _prepare_keys

cdef extern from "gsketch.h" nogil:
    int64_t gs_wall_ms()

cdef enum:
    SCRATCH_MAX = 1 << 20   # entries (8 MiB) of the reusable per-batch hash buffer


# ---- clock and time arguments ----------------------------------------------------------

cdef object _clock_of(object clock):
    """The clock a sketch reads when an operation omits ``now_ms``: ``clock``, or the
    default (system) clock for None. Anything without a ``now_ms()`` method is refused."""
    if clock is None:
        return _default_clock()
    if not callable(getattr(clock, "now_ms", None)):
        raise ConfigError(f"clock must have a now_ms() method (see grudge_stream.clock), got {clock!r}")
    return clock


cdef inline bint _is_wall(object clock):
    """True for the system clock, which the kernels read in C (gs_wall_ms, same value)."""
    return type(clock) is _SystemClock


cdef inline int64_t _time_ms(object v, bint stamped) except? -1:
    """One timestamp as int64 milliseconds (see _time_ms_checked); an int in range
    takes this inlined fast path."""
    cdef int overflow = 0
    cdef long long out
    if type(v) is int:
        out = PyLong_AsLongLongAndOverflow(v, &overflow)
        if overflow == 0 and not (stamped and out == INT64_MIN):
            return out
    return _time_ms_checked(v, stamped)


cdef int64_t _time_ms_checked(object v, bint stamped) except? -1:
    """One timestamp as int64 milliseconds: an int, or what ``grudge_stream.clock.as_ms``
    takes (a float is truncated; bool, NaN and Inf are refused), within the int64 range.

    A bad value raises InvalidInputError. With ``stamped`` (the score kernels, whose cells
    use -2**63 as their never-stamped mark) -2**63 is refused too, and a value of the
    wrong type keeps the TypeError ``as_ms`` raises."""
    cdef int64_t out
    if type(v) is not int:
        try:
            v = _as_ms(v)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        except TypeError as exc:
            if stamped:
                raise
            raise InvalidInputError(str(exc)) from None
    try:
        out = v
    except OverflowError:
        raise InvalidInputError(f"now_ms must fit in a signed 64-bit integer, got {v}") from None
    if stamped and out == INT64_MIN:
        raise InvalidInputError("now_ms must be > -2**63 (that value marks a never-stamped cell)")
    return out


cdef inline int64_t _clock_now(object now_ms, object clock, bint wall, bint stamped) except? -1:
    """An operation's time: ``now_ms`` parsed by ``_time_ms``, or when it is None the
    clock's ``now_ms()`` (the system clock read in C when ``wall``)."""
    if now_ms is None:
        if wall:
            return gs_wall_ms()
        now_ms = clock.now_ms()
    return _time_ms(now_ms, stamped)


# ---- a batch's keys ------------------------------------------------------------------------

@cython.final
cdef class _Scratch:
    """A uint64 buffer for one batch's hashes: a reused one up to SCRATCH_MAX entries
    (a fresh large array per batch costs page faults, more than the hashing itself), a
    temporary one beyond. Calls hold the GIL from hashing to their end, so no two calls
    share it at once."""
    cdef object buf

    cdef object take(self, Py_ssize_t n):
        if n > SCRATCH_MAX:
            return np.empty(n, dtype=np.uint64)
        if self.buf is None or self.buf.shape[0] < n:
            self.buf = np.empty(max(n, 1024), dtype=np.uint64)
        return self.buf[:n]


cdef tuple _batch_hashes(const Hasher* hasher, object cfg, _Scratch scratch, object keys):
    """``(hashes, source, kind)`` of a batch's keys (``sketches._inputs.prepare_keys``
    decides the form); a list or tuple of keys, or the rows of a 2-D uint8 array, are hashed
    here into ``scratch`` with the sketch's hasher (its secret key included)."""
    cdef uint64_t[::1] hv
    hashes, source, kind = _prepare_keys(keys)
    if hashes is None:
        hashes = scratch.take(len(source))
        hv = hashes
        if hv.shape[0]:
            if kind == _ROWS:
                hash_rows(hasher, source, &hv[0])
            else:
                hash_items(hasher, source, &hv[0], hv.shape[0])
    return hashes, source, kind


# ---- what every sketch holds -----------------------------------------------------------------

cdef class _Sketch:
    """The base of every sketch kernel: its frozen config, its hasher and its clock
    (``_wall``: the system clock, read in C), and the pickle guard."""
    cdef Hasher _hasher
    cdef object _config
    cdef object _clock
    cdef bint _wall

    cdef int _bind_clock(self, object clock) except -1:
        """Use ``clock`` (already checked by ``_clock_of``)."""
        self._clock = clock
        self._wall = _is_wall(clock)
        return 0

    @property
    def seed(self):
        return self._config.seed

    @property
    def clock(self):
        return self._clock

    def __reduce__(self):
        name = type(self).__name__
        raise TypeError(f"{name} is never pickled; use to_bytes() and {name}.from_bytes()")

    def use_hash_key(self, key):
        """Key SipHash with a secret 128-bit ``key`` (16 bytes) instead of the key derived
        from ``seed``. The key is neither part of ``config`` nor serialized: call this on a
        new sketch before its first update, and again after ``from_bytes``. Needs
        ``hasher="siphash"``."""
        set_siphash_key(&self._hasher, key)
