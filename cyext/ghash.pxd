# Shared C declarations and inline helpers for every grudge-stream kernel.
# Found through include_path=["cyext"]; cimport as `from ghash cimport ...`.
from libc.stdint cimport uint32_t, uint64_t
from cpython.bytes cimport PyBytes_Check, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_Check, PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.unicode cimport PyUnicode_Check

from cpython.ref cimport PyObject

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

cdef extern from "ghash.h" nogil:
    uint64_t gh_murmur3_64(const unsigned char* data, size_t length, uint32_t seed32)
    uint64_t gh_siphash24(const unsigned char* data, size_t length, uint64_t k0, uint64_t k1)
    uint64_t gh_splitmix64(uint64_t state)
    uint32_t gh_km_index(uint64_t h, uint32_t i, uint32_t m)
    uint32_t gh_ix_index(uint64_t h, uint32_t i, uint32_t m)
    uint64_t gh_ix_word(uint64_t h, uint32_t j)
    uint32_t gh_ix_reduce(uint32_t x, uint32_t m)
    void gh_ix_indexes(uint64_t h, uint32_t n, uint32_t m, uint32_t* out)
    int GH_IX_KM
    int GH_IX_INDEPENDENT
    uint64_t gh_hash(int algo, const unsigned char* data, size_t length,
                     uint32_t seed32, uint64_t k0, uint64_t k1)
    void gh_crc32c_init()
    uint32_t gh_crc32c(uint32_t crc, const unsigned char* p, size_t length)
    uint32_t gh_crc32c_portable(uint32_t crc, const unsigned char* p, size_t length)
    int gh_crc32c_hardware()
    uint64_t GH_GOLDEN
    int GH_MURMUR3
    int GH_SIPHASH


ctypedef struct Hasher:
    int algo
    uint32_t seed32
    uint64_t k0
    uint64_t k1


cdef inline Hasher make_hasher(int algo, uint64_t seed) noexcept:
    cdef Hasher h
    h.algo = algo
    h.seed32 = <uint32_t>(seed & 0xFFFFFFFFu)
    # SipHash key: the first two outputs of splitmix64 started at `seed`.
    h.k0 = gh_splitmix64(seed)
    h.k1 = gh_splitmix64(seed + GH_GOLDEN)
    return h


cdef inline int key_view(object key, const unsigned char** data, Py_ssize_t* size) except -1:
    """Borrow a key's bytes: bytes and bytearray as they are, str as UTF-8."""
    if PyBytes_Check(key):
        data[0] = <const unsigned char*>PyBytes_AS_STRING(key)
        size[0] = PyBytes_GET_SIZE(key)
    elif PyUnicode_Check(key):
        data[0] = <const unsigned char*>PyUnicode_AsUTF8AndSize(key, size)
    elif PyByteArray_Check(key):
        data[0] = <const unsigned char*>PyByteArray_AS_STRING(key)
        size[0] = PyByteArray_GET_SIZE(key)
    else:
        raise TypeError(f"keys must be bytes or str, not {type(key).__name__}")
    return 0


cdef inline uint64_t hash_key(const Hasher* h, object key) except? 0:
    cdef const unsigned char* p
    cdef Py_ssize_t n
    key_view(key, &p, &n)
    return gh_hash(h.algo, p, <size_t>n, h.seed32, h.k0, h.k1)


cdef inline int set_siphash_key(Hasher* h, object key) except -1:
    """Key a SipHash hasher with a secret 128-bit key (16 bytes: k0, k1 little-endian),
    replacing the key derived from the sketch's seed. Never serialized: the owner keeps it."""
    if h.algo != GH_SIPHASH:
        raise ValueError("use_hash_key needs hasher='siphash'")
    if not isinstance(key, (bytes, bytearray)) or len(key) != 16:
        raise ValueError("the SipHash key must be exactly 16 bytes")
    h.k0 = int.from_bytes(key[:8], "little")
    h.k1 = int.from_bytes(key[8:], "little")
    return 0
