# The layer every sketch kernel shares, in one copy: `include "_common.pxi"` (it is
# text included into _score.pyx, _countmin.pyx and _bloom.pyx, not a module of its
# own). It holds the batch-argument contract (the key forms in _keys.pxi, the time
# arguments here), the clock (the default, the check, reading now_ms), the reusable
# hash buffer and key-hashing prelude of a batch, and the sketches' base class
# (config, hasher, clock, pickle guard). docs/hashing.md, "The kernel family".
cimport cython
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t, INT64_MIN, INT64_MAX
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.ref cimport Py_REFCNT

from ghash cimport Hasher, set_siphash_key

from grudge_stream.clock import SystemClock as _SystemClock, as_ms as _as_ms, default_clock as _default_clock
from grudge_stream.exceptions import ConfigError, InvalidInputError, MismatchError, SnapshotError

include "_keys.pxi"

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
    takes (a float is truncated; NaN and Inf raise InvalidInputError; bool and other
    types raise TypeError), within the int64 range (else InvalidInputError). With
    ``stamped`` (the score kernels, whose cells use -2**63 as their never-stamped mark)
    -2**63 is refused too."""
    cdef int64_t out
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v.item()
    if type(v) is not int:
        try:
            v = _as_ms(v)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
    try:
        out = v
    except OverflowError:
        raise InvalidInputError(f"now_ms must fit in a signed 64-bit integer, got {v}") from None
    if stamped and out == INT64_MIN:
        raise InvalidInputError("now_ms must be > -2**63 (that value marks a never-stamped cell)")
    return out


cdef object _length_error(str what, Py_ssize_t n, object shape):
    return InvalidInputError(f"{what} must be a scalar or a 1-D array of the batch's length {n}, "
                             f"got shape {shape}")


cdef tuple _batch_times(object now_ms, Py_ssize_t n, bint stamped):
    """A batch's ``now_ms``: ``(None, None)`` for None (the caller reads its clock),
    ``(t, None)`` for one time (read as ``_time_ms``), or ``(None, int64 array)`` for
    one time per event, each element read as one time would be: integers within int64,
    floats truncated (NaN and Inf refused), Python objects one by one; bool refused."""
    if now_ms is None:
        return None, None
    if type(now_ms) is int:
        return _time_ms(now_ms, stamped), None
    if isinstance(now_ms, np.ndarray):
        if now_ms.ndim == 0:
            return _time_ms(now_ms, stamped), None
        arr = now_ms
    elif not isinstance(now_ms, (list, tuple)) and np.ndim(now_ms) == 0:
        return _time_ms(now_ms, stamped), None
    else:
        arr = np.asarray(now_ms)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise _length_error("now_ms", n, arr.shape)
    cdef str kind = arr.dtype.kind
    cdef Py_ssize_t i
    cdef int64_t[::1] tv
    cdef const uint64_t* up
    cdef const int64_t* ip
    cdef bint bad = False
    if kind == "i":
        arr = np.ascontiguousarray(arr, dtype=np.int64)
    elif kind == "u":
        arr = np.ascontiguousarray(arr, dtype=np.uint64)
        up = <const uint64_t*>cnp.PyArray_DATA(arr)
        with nogil:
            for i in range(n):
                if up[i] > <uint64_t>INT64_MAX:
                    bad = True
                    break
        if bad:
            raise InvalidInputError("now_ms values must fit in a signed 64-bit integer")
        arr = arr.view(np.int64)
    elif kind == "f":
        if n and not np.isfinite(arr).all():
            raise InvalidInputError("now_ms must be finite (found NaN or Inf)")
        if n and (arr.min() < -2.0**63 or arr.max() >= 2.0**63):
            raise InvalidInputError("now_ms values must fit in a signed 64-bit integer")
        arr = np.trunc(arr).astype(np.int64)
    elif kind == "O":
        out = np.empty(n, dtype=np.int64)
        tv = out
        for i in range(n):
            tv[i] = _time_ms(arr[i], stamped)
        return None, out
    elif kind == "b":
        raise TypeError("now_ms must be integer milliseconds, not bool")
    else:
        raise TypeError(f"now_ms must be integer milliseconds, not {arr.dtype}")
    if stamped:
        ip = <const int64_t*>cnp.PyArray_DATA(arr)
        with nogil:
            for i in range(n):
                if ip[i] == INT64_MIN:
                    bad = True
                    break
        if bad:
            raise InvalidInputError("now_ms must be > -2**63 (that value marks a never-stamped cell)")
    return None, arr


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
    temporary one beyond. A call may let another thread in between its hashing and its
    end (an allocation can run the garbage collector, and with it Python code), so the
    reused buffer goes to one call at a time: while the view an earlier call took is
    alive (it holds a reference to the buffer), a call takes an array of its own.
    Sharing it had two threads' batches swap their keys."""
    cdef object buf

    cdef object take(self, Py_ssize_t n):
        if n > SCRATCH_MAX:
            return np.empty(n, dtype=np.uint64)
        cdef object buf = self.buf
        # Free: referenced by self.buf and this local only. Check and slice run with the GIL
        # held and no Python code between them, so no other take can come in between.
        if buf is not None and Py_REFCNT(buf) > 2:
            return np.empty(n, dtype=np.uint64)
        if buf is None or buf.shape[0] < n:
            buf = self.buf = np.empty(max(n, 1024), dtype=np.uint64)
        return buf[:n]


cdef tuple _batch_hashes(const Hasher* hasher, _Scratch scratch, object keys):
    """``(hashes, source, kind)`` of a batch's keys (``_key_form`` in _keys.pxi decides the
    form): pre-hashed keys are used as they are; a list of keys, or the rows of a 2-D uint8
    array, are hashed here with the sketch's hasher (its secret key included) into
    ``scratch``, or into a new array when ``scratch`` is None."""
    kind, source = _key_form(keys)
    if kind == KEYS_HASHED:
        return source, None, kind
    cdef Py_ssize_t n = _form_size(kind, source)
    hashes = np.empty(n, dtype=np.uint64) if scratch is None else scratch.take(n)
    _hash_form(hasher, kind, source, <uint64_t*>cnp.PyArray_DATA(hashes), n)
    return hashes, source, kind


# ---- what every sketch holds -----------------------------------------------------------------

def _from_config(name, doc=None):
    """A read-only property: the sketch's frozen config's field ``name``."""
    return property(lambda self: getattr(self.config, name), doc=doc)


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
    def config(self):
        """The frozen config, seed included (``BloomConfig``, ``CountMinConfig``,
        ``ScoreSketchConfig``, ``RotatorConfig``: ``grudge_stream.sketches``)."""
        return self._config

    @property
    def seed(self):
        return self._config.seed

    @property
    def index_scheme(self):
        """How a key's cells derive from its hash: ``"independent"`` or ``"km"``
        (docs/hashing.md); part of the config and of every snapshot."""
        c = self._config
        return c.sketch.index_scheme if hasattr(c, "sketch") else c.index_scheme

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
