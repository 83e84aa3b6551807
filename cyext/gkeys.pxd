# Batch key hashing shared by the sketch kernels: one 64-bit hash per key of a list
# or tuple, with the key objects prefetched ahead (a stream's keys are scattered
# objects, and a cache miss per key would cost more than the hash itself).
# Found through include_path=["cyext"]; cimport as `from gkeys cimport hash_items`.
from cpython.ref cimport PyObject
from libc.stdint cimport uint8_t, uint64_t
from ghash cimport Hasher, key_view, gh_hash

cdef extern from "Python.h":
    PyObject** PySequence_Fast_ITEMS(object o)
    bint gk_bytes_exact "PyBytes_CheckExact"(PyObject* o)
    char* gk_bytes_data "PyBytes_AS_STRING"(PyObject* o)
    Py_ssize_t gk_bytes_size "PyBytes_GET_SIZE"(PyObject* o)

cdef extern from "gsketch.h" nogil:
    void gs_prefetch_r(const void* p)

cdef enum:
    GK_AHEAD = 16   # keys prefetched ahead: ~16 misses in flight covers DRAM latency


cdef inline int hash_items(const Hasher* h, object seq, uint64_t* out, Py_ssize_t n) except -1:
    """Hash the n keys of a list or tuple (bytes, str as UTF-8, bytearray) into out.
    Raises TypeError on the first other key; `out` is then partly written, nothing else."""
    cdef PyObject** items = PySequence_Fast_ITEMS(seq)
    cdef Py_ssize_t i
    cdef const unsigned char* p
    cdef Py_ssize_t size
    cdef PyObject* o
    if len(seq) != n:
        raise ValueError("key sequence changed length")
    for i in range(n):
        if i + GK_AHEAD < n:
            o = items[i + GK_AHEAD]
            gs_prefetch_r(o)
            gs_prefetch_r(<const char*>o + 48)   # a bytes object's data starts at offset 32
        o = items[i]
        if gk_bytes_exact(o):
            out[i] = gh_hash(h.algo, <const unsigned char*>gk_bytes_data(o), <size_t>gk_bytes_size(o),
                             h.seed32, h.k0, h.k1)
        else:
            key_view(<object>o, &p, &size)
            out[i] = gh_hash(h.algo, p, <size_t>size, h.seed32, h.k0, h.k1)
    return 0


cdef inline int hash_rows(const Hasher* h, const uint8_t[:, ::1] rows, uint64_t* out) except -1:
    """Hash each row of a C-contiguous 2-D uint8 array (fixed-width keys) into out, with the
    sketch's own hasher: its algorithm, seed and secret key (``use_hash_key``), so a row
    and the same key as bytes land in the same cells."""
    cdef Py_ssize_t i, n = rows.shape[0], width = rows.shape[1]
    cdef const uint8_t* empty = <const uint8_t*>""
    with nogil:
        for i in range(n):
            out[i] = gh_hash(h.algo, &rows[i, 0] if width > 0 else empty, <size_t>width,
                             h.seed32, h.k0, h.k1)
    return 0
