# The hashing kernel behind grudge_stream.hashing: one 64-bit hash per key,
# then the cell index derivation (independent levels or Kirsch-Mitzenmacher; docs/hashing.md).
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from cpython.bytes cimport PyBytes_FromStringAndSize
cimport numpy as cnp
import numpy as np

from ghash cimport (Hasher, make_hasher, key_view, hash_key,
                    gh_murmur3_64, gh_siphash24, gh_splitmix64, gh_km_index, gh_ix_indexes,
                    gh_hash, gh_crc32c_init, gh_crc32c, gh_crc32c_portable,
                    gh_crc32c_hardware, GH_MURMUR3, GH_SIPHASH)

include "_keys.pxi"

cnp.import_array()
gh_crc32c_init()

ALGORITHMS = ("murmur3", "siphash")


cpdef int algorithm_code(object algorithm) except -1:
    """Map an algorithm name to the kernel's code, or raise ValueError."""
    if algorithm == "murmur3":
        return GH_MURMUR3
    if algorithm == "siphash":
        return GH_SIPHASH
    raise ValueError(f"unknown hash algorithm {algorithm!r}; expected 'murmur3' or 'siphash'")


def hash64(key, uint64_t seed=0, algorithm="murmur3"):
    """Hash one key (bytes, or str as UTF-8) to an unsigned 64-bit int.

    murmur3: the first word of MurmurHash3_x64_128 with both seed words set to
    ``seed & 0xFFFFFFFF``; siphash: SipHash-2-4 keyed with the first two
    splitmix64 outputs started at ``seed``.
    """
    cdef Hasher h = make_hasher(algorithm_code(algorithm), seed)
    return hash_key(&h, key)


def hash64_many(keys, uint64_t seed=0, algorithm="murmur3"):
    """Hash many keys into a new ``numpy.uint64`` array.

    ``keys`` is a list or tuple (or any iterable, or an object array) of bytes/str, or
    a 2-D uint8 array whose rows are fixed-width keys: the key forms of the sketches'
    batch API (``_key_form``, docs/hashing.md "Batch arguments"), minus pre-hashed keys.
    """
    cdef Hasher h = make_hasher(algorithm_code(algorithm), seed)
    kind, source = _key_form(keys)
    if kind == KEYS_HASHED:
        raise TypeError("hash64_many takes keys, and this uint64 array already holds hashes")
    cdef Py_ssize_t n = _form_size(kind, source)
    out = np.empty(n, dtype=np.uint64)
    _hash_form(&h, kind, source, <uint64_t*>cnp.PyArray_DATA(out), n)
    return out


def siphash24(key, uint64_t k0, uint64_t k1):
    """SipHash-2-4 of ``key`` under the 128-bit key ``(k0, k1)`` (little-endian words)."""
    cdef const unsigned char* p
    cdef Py_ssize_t n
    key_view(key, &p, &n)
    return gh_siphash24(p, <size_t>n, k0, k1)


def murmur3_64(key, uint32_t seed=0):
    """First 64-bit word of MurmurHash3_x64_128 with both seed words = ``seed``."""
    cdef const unsigned char* p
    cdef Py_ssize_t n
    key_view(key, &p, &n)
    return gh_murmur3_64(p, <size_t>n, seed)


def splitmix64(uint64_t state):
    """One splitmix64 output from ``state`` (the generator's state then advances by
    0x9E3779B97F4A7C15). ``splitmix64(0) == 0xE220A8397B1DCDAF``."""
    return gh_splitmix64(state)


def siphash_key(uint64_t seed):
    """The SipHash key ``(k0, k1)`` a sketch derives from its ``seed``."""
    cdef Hasher h = make_hasher(GH_SIPHASH, seed)
    return (h.k0, h.k1)


INDEX_SCHEMES = ("independent", "km")


cdef bint _scheme_is_km(object scheme) except -1:
    if scheme == "independent":
        return False
    if scheme == "km":
        return True
    raise ValueError(f"unknown index scheme {scheme!r}; expected 'independent' or 'km'")


cdef int _check_shape(Py_ssize_t levels, Py_ssize_t cells_per_level) except -1:
    if levels < 1 or levels > 64:
        raise ValueError("levels must be in [1, 64]")
    if cells_per_level < 1 or cells_per_level > 0xFFFFFFFF:
        raise ValueError("cells_per_level must be in [1, 2**32 - 1]")
    return 0


def level_indexes(uint64_t hash, Py_ssize_t levels, Py_ssize_t cells_per_level, scheme="independent"):
    """The cell index of one hash at each level (row, Bloom position) ``i = 0..levels-1``,
    as every sketch derives them (docs/hashing.md):

    - ``"independent"``: word 0 is ``hash``; word j >= 1 is ``lo ^ hi`` of the 128-bit
      product ``((hash + j * 0x9E3779B97F4A7C15) mod 2**64) * 0xBF58476D1CE4E5B9``; level
      2j takes the low 32 bits x of word j, level 2j+1 its high 32 bits, each as
      ``(x * M) >> 32``;
    - ``"km"`` (Kirsch-Mitzenmacher, grudge-stream 0.2 and grudge):
      ``((h1 + i*h2) mod 2**32) mod M`` with h1, h2 the low and high 32 bits.
    """
    cdef uint32_t idx[64]
    cdef Py_ssize_t i
    _check_shape(levels, cells_per_level)
    if _scheme_is_km(scheme):
        return [gh_km_index(hash, <uint32_t>i, <uint32_t>cells_per_level) for i in range(levels)]
    gh_ix_indexes(hash, <uint32_t>levels, <uint32_t>cells_per_level, idx)
    return [idx[i] for i in range(levels)]


def level_indexes_many(const uint64_t[::1] hashes, Py_ssize_t levels, Py_ssize_t cells_per_level,
                       scheme="independent"):
    """``level_indexes`` of every hash: a ``(len(hashes), levels)`` uint32 array."""
    cdef Py_ssize_t n = hashes.shape[0], i, j
    cdef bint km
    _check_shape(levels, cells_per_level)
    km = _scheme_is_km(scheme)
    out = np.empty((n, levels), dtype=np.uint32)
    cdef uint32_t[:, ::1] o = out
    cdef uint32_t m = <uint32_t>cells_per_level, L = <uint32_t>levels
    if n == 0:
        return out
    with nogil:
        if km:
            for i in range(n):
                for j in range(levels):
                    o[i, j] = gh_km_index(hashes[i], <uint32_t>j, m)
        else:
            for i in range(n):
                gh_ix_indexes(hashes[i], L, m, &o[i, 0])
    return out


def kafka_murmur2(data):
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``, the default
    partitioner of Java clients and ``partitioner=murmur2_random``) of a bytes-like
    object, as an unsigned 32-bit int."""
    cdef const uint8_t[::1] view = data
    cdef Py_ssize_t length = view.shape[0], i, n4 = length // 4, tail
    cdef uint32_t m = 0x5BD1E995, k
    cdef uint32_t h = 0x9747B28C ^ <uint32_t>length
    for i in range(n4):
        k = (<uint32_t>view[4 * i] | (<uint32_t>view[4 * i + 1] << 8) | (<uint32_t>view[4 * i + 2] << 16)
             | (<uint32_t>view[4 * i + 3] << 24))
        k = k * m
        k ^= k >> 24
        k = k * m
        h = (h * m) ^ k
    tail = 4 * n4
    i = length & 3
    if i == 3:
        h ^= <uint32_t>view[tail + 2] << 16
    if i >= 2:
        h ^= <uint32_t>view[tail + 1] << 8
    if i >= 1:
        h ^= <uint32_t>view[tail]
        h = h * m
    h ^= h >> 13
    h = h * m
    h ^= h >> 15
    return h


def crc32c(data, uint32_t crc=0):
    """CRC-32C (Castagnoli) of a bytes-like object, continuing from ``crc``."""
    cdef const uint8_t[::1] view = data
    cdef uint32_t out
    if view.shape[0] == 0:
        return crc
    with nogil:
        out = gh_crc32c(crc, &view[0], <size_t>view.shape[0])
    return out


def crc32c_portable(data, uint32_t crc=0):
    """``crc32c`` by the portable tables whatever the CPU has (the reference tests compare
    the CPU's instruction with)."""
    cdef const uint8_t[::1] view = data
    cdef uint32_t out
    if view.shape[0] == 0:
        return crc
    with nogil:
        out = gh_crc32c_portable(crc, &view[0], <size_t>view.shape[0])
    return out


def crc32c_implementation():
    """Which CRC-32C this machine computes with: ``"sse4.2"`` (the CPU's instruction) or
    ``"portable"`` (slicing-by-8 tables)."""
    return "sse4.2" if gh_crc32c_hardware() else "portable"
