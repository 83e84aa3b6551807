# The bounded top-k candidate set of DecayingCountMin, its own class: N slots of
# (key hash, stored value, key object), a binary min-heap over the slots ordered by
# (value, hash), and an open-addressing (linear probing) table hash -> slot. It holds
# no count-min cells: the sketch decides admission from its matrix
# (DecayingCountMin._topk_touch) and uses these operations. Included by _countmin.pyx
# (after _common.pxi); the design and the guarantee: docs/count-min.md.
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free

cdef extern from "gsketch.h" nogil:
    void* gs_alloc_zeroed(size_t n)

cdef enum:
    NOT_DIRTY = -2      # slot key source: untouched in this batch
    SRC_NONE = -1       # slot key source: pre-hashed key (no key object)


cdef object _key_at(object source, int kind, Py_ssize_t i):
    """The key object to keep for batch position ``i`` (bytes for a row or a bytearray;
    None for a pre-hashed key; the kinds: _keys.pxi)."""
    if kind == KEYS_LIST:
        k = source[i]
        return bytes(k) if isinstance(k, bytearray) else k
    if kind == KEYS_ROWS:
        return source[i].tobytes()
    return None


@cython.final
cdef class CandidateSet:
    """The top-k candidate set of a DecayingCountMin (``top_k=N``; N = 0: empty, no memory)."""
    cdef int32_t _topn, _hsize
    cdef uint32_t _tmin             # the heap root's stored value once the set is full, else 0
    cdef uint64_t* _thash
    cdef uint32_t* _tval            # estimate at admission or last refresh, decayed to epoch E:
                                    # a lower bound of the key's current estimate
    cdef int32_t* _heap
    cdef int32_t* _tpos
    cdef int32_t* _table
    cdef uint64_t* _tabh
    cdef uint32_t _tmask
    cdef int _tshift
    cdef int64_t* _tsrc
    cdef int32_t* _dirty
    cdef int32_t _ndirty
    cdef list _tkeys

    def __cinit__(self, int32_t n):
        cdef Py_ssize_t i, tsize
        self._thash = NULL
        self._tval = NULL
        self._heap = NULL
        self._tpos = NULL
        self._table = NULL
        self._tabh = NULL
        self._tsrc = NULL
        self._dirty = NULL
        self._topn = n
        self._hsize = 0
        self._ndirty = 0
        self._tkeys = [None] * self._topn
        if self._topn:
            tsize = 8
            self._tshift = 61
            while tsize < 2 * self._topn:
                tsize <<= 1
                self._tshift -= 1
            self._tmask = <uint32_t>(tsize - 1)
            self._thash = <uint64_t*>gs_alloc_zeroed(8 * <size_t>self._topn)
            self._tval = <uint32_t*>gs_alloc_zeroed(4 * <size_t>self._topn)
            self._heap = <int32_t*>gs_alloc_zeroed(4 * <size_t>self._topn)
            self._tpos = <int32_t*>gs_alloc_zeroed(4 * <size_t>self._topn)
            self._tsrc = <int64_t*>gs_alloc_zeroed(8 * <size_t>self._topn)
            self._dirty = <int32_t*>gs_alloc_zeroed(4 * <size_t>self._topn)
            self._table = <int32_t*>gs_alloc_zeroed(4 * <size_t>tsize)
            self._tabh = <uint64_t*>gs_alloc_zeroed(8 * <size_t>tsize)
            if (self._thash == NULL or self._tval == NULL or self._heap == NULL or self._tpos == NULL
                    or self._tsrc == NULL or self._dirty == NULL or self._table == NULL
                    or self._tabh == NULL):
                raise MemoryError("cannot allocate the top-k candidate set")
            for i in range(tsize):
                self._table[i] = -1
            for i in range(self._topn):
                self._tsrc[i] = NOT_DIRTY

    def __dealloc__(self):
        free(self._thash)
        free(self._tval)
        free(self._heap)
        free(self._tpos)
        free(self._table)
        free(self._tabh)
        free(self._tsrc)
        free(self._dirty)

    cdef inline bint _tless(self, int32_t a, int32_t b) noexcept nogil:
        """Heap order: (value, hash) ascending, a total order so the evicted minimum
        does not depend on the heap's layout."""
        if self._tval[a] != self._tval[b]:
            return self._tval[a] < self._tval[b]
        return self._thash[a] < self._thash[b]

    cdef void _sift_up(self, int32_t pos) noexcept nogil:
        cdef int32_t s = self._heap[pos], parent
        while pos > 0:
            parent = (pos - 1) >> 1
            if not self._tless(s, self._heap[parent]):
                break
            self._heap[pos] = self._heap[parent]
            self._tpos[self._heap[pos]] = pos
            pos = parent
        self._heap[pos] = s
        self._tpos[s] = pos

    cdef void _sift_down(self, int32_t pos) noexcept nogil:
        cdef int32_t s = self._heap[pos], child
        cdef int32_t n = self._hsize
        while True:
            child = 2 * pos + 1
            if child >= n:
                break
            if child + 1 < n and self._tless(self._heap[child + 1], self._heap[child]):
                child += 1
            if not self._tless(self._heap[child], s):
                break
            self._heap[pos] = self._heap[child]
            self._tpos[self._heap[pos]] = pos
            pos = child
        self._heap[pos] = s
        self._tpos[s] = pos

    cdef void _heapify(self) noexcept nogil:
        cdef int32_t i
        for i in range(self._hsize):
            self._tpos[self._heap[i]] = i
        i = self._hsize // 2 - 1
        while i >= 0:
            self._sift_down(i)
            i -= 1
        if self._hsize:
            self._update_tmin()

    cdef void _topk_decay(self, uint64_t d) noexcept nogil:
        """Every candidate's stored estimate decays by d epochs; (value, hash) ties that
        the halving creates can reorder the heap, so rebuild it (O(N), once per epoch)."""
        cdef int32_t i
        for i in range(self._hsize):
            self._tval[i] = _shifted(self._tval[i], d)
        self._heapify()

    cdef inline uint32_t _tbucket(self, uint64_t h) noexcept nogil:
        # Fibonacci hashing of the already-mixed key hash into the table.
        return <uint32_t>((h * 0x9E3779B97F4A7C15ULL) >> self._tshift) & self._tmask

    cdef inline int32_t _tfind(self, uint64_t h) noexcept nogil:
        """The slot tracking h, or -1. Table entries keep the hash beside the slot so a
        hit costs one probe without touching the slot arrays."""
        cdef uint32_t b = self._tbucket(h)
        cdef int32_t s
        while True:
            s = self._table[b]
            if s < 0 or self._tabh[b] == h:
                return s
            b = (b + 1) & self._tmask

    cdef inline void _tinsert(self, uint64_t h, int32_t slot) noexcept nogil:
        cdef uint32_t b = self._tbucket(h)
        while self._table[b] >= 0:
            b = (b + 1) & self._tmask
        self._table[b] = slot
        self._tabh[b] = h

    cdef void _tdelete(self, uint64_t h) noexcept nogil:
        """Remove h with backward-shift deletion (no tombstones)."""
        cdef uint32_t i = self._tbucket(h), j, k
        while self._table[i] < 0 or self._tabh[i] != h:
            i = (i + 1) & self._tmask
        j = i
        while True:
            j = (j + 1) & self._tmask
            if self._table[j] < 0:
                break
            k = self._tbucket(self._tabh[j])
            # Leave the entry at j if its home bucket k lies cyclically in (i, j].
            if (i <= j and i < k and k <= j) or (i > j and (i < k or k <= j)):
                continue
            self._table[i] = self._table[j]
            self._tabh[i] = self._tabh[j]
            i = j
        self._table[i] = -1

    cdef inline void _update_tmin(self) noexcept nogil:
        self._tmin = self._tval[self._heap[0]] if (self._topn and self._hsize == self._topn) else 0

    cdef inline void _mark_dirty(self, int32_t slot, int64_t src) noexcept nogil:
        if self._tsrc[slot] == NOT_DIRTY:
            self._dirty[self._ndirty] = slot
            self._ndirty += 1
        self._tsrc[slot] = src

    cdef _resolve_dirty(self, object source, int kind):
        """After a batch: attach the key objects of newly admitted candidates."""
        cdef int32_t i, s
        cdef int64_t src
        for i in range(self._ndirty):
            s = self._dirty[i]
            src = self._tsrc[s]
            self._tkeys[s] = None if src < 0 else _key_at(source, kind, src)
            self._tsrc[s] = NOT_DIRTY
        self._ndirty = 0

    cdef int32_t _append(self, uint64_t h, uint32_t est) noexcept nogil:
        """Admit h into a free slot (the set is not full); return the slot."""
        cdef int32_t s = self._hsize
        self._hsize += 1
        self._thash[s] = h
        self._tval[s] = est
        self._heap[s] = s
        self._tinsert(h, s)
        self._sift_up(s)
        self._update_tmin()
        return s

    cdef int32_t _replace_root(self, uint64_t h, uint32_t est) noexcept nogil:
        """Evict the heap root for h; return the slot (it keeps its index)."""
        cdef int32_t s = self._heap[0]
        self._tdelete(self._thash[s])
        self._thash[s] = h
        self._tval[s] = est
        self._tinsert(h, s)
        self._sift_down(0)
        self._update_tmin()
        return s

    cdef _refill(self, list ranked):
        """Empty the set, then hold ``ranked`` (``(-value, hash, key)`` rows, at most N)."""
        cdef int32_t i, s
        cdef Py_ssize_t tsize = <Py_ssize_t>self._tmask + 1
        for i in range(tsize):
            self._table[i] = -1
        self._hsize = 0
        for i in range(self._topn):
            self._tkeys[i] = None
        for negest, h, key in ranked:
            s = self._hsize
            self._hsize += 1
            self._thash[s] = h
            self._tval[s] = <uint32_t>(-negest)
            self._heap[s] = s
            self._tkeys[s] = key
            self._tinsert(h, s)
        self._heapify()
        self._update_tmin()
