# The snapshot byte kernels: the envelope (grudge_stream.envelope) and the chunk records of the
# snapshot topic (grudge_stream.checkpoint.format), built without the interpreter lock.
#
# Each call allocates its output once (with the lock), then copies the parts into it and
# computes the CRC-32C without the lock, block by block while the block is still in cache. A
# snapshot round of megabytes so never stops another Python thread (the consume loop) for
# longer than an allocation; the bytes are those of the pure-Python reference (envelope.pack_py,
# format.encode_chunk_py), which the unit tests compare them with.
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.mem cimport PyMem_Malloc, PyMem_Free

from ghash cimport gh_crc32c_init, gh_crc32c

gh_crc32c_init()

# Copy and checksum this much at a time: the CRC reads the block back from cache.
cdef enum:
    BLOCK = 128 * 1024

ENVELOPE_MAGIC = b"GRDS"
CHUNK_MAGIC = b"GRDC"
CHUNK_HEADER_SIZE = 32
cdef const char* _ENVELOPE_MAGIC = "GRDS"
cdef const char* _CHUNK_MAGIC = "GRDC"


cdef inline void _put16(uint8_t* p, uint16_t v) noexcept nogil:
    p[0] = <uint8_t>v
    p[1] = <uint8_t>(v >> 8)


cdef inline void _put32(uint8_t* p, uint32_t v) noexcept nogil:
    cdef int i
    for i in range(4):
        p[i] = <uint8_t>(v >> (8 * i))


cdef inline void _put64(uint8_t* p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = <uint8_t>(v >> (8 * i))


cdef inline uint32_t _copy_crc(uint8_t* dst, const uint8_t* src, size_t n, uint32_t crc) noexcept nogil:
    """Copy ``n`` bytes to ``dst`` and continue ``crc`` over them, a block at a time."""
    cdef size_t off = 0, step
    while off < n:
        step = n - off if n - off < BLOCK else BLOCK
        memcpy(dst + off, src + off, step)
        crc = gh_crc32c(crc, dst + off, step)
        off += step
    return crc


def pack(int kind, header, parts, int version=1):
    """The envelope around ``header`` (its canonical JSON, bytes) and a payload that is the
    concatenation of ``parts`` (bytes-like objects, C-contiguous): magic, ``version``, ``kind``,
    header length, header, payload length, payload, CRC-32C of all before it. The parts are
    copied once, straight into the result, and checksummed on the way, without the GIL; they
    must not change meanwhile (bytes, or a private copy)."""
    cdef Py_buffer hbuf
    cdef Py_buffer* bufs
    cdef Py_ssize_t n, i, got = 0
    cdef size_t plen = 0, hlen, pos, total
    cdef uint32_t crc
    cdef uint8_t* out
    if kind < 0 or kind > 0xFFFF or version < 0 or version > 0xFFFF:
        raise ValueError(f"kind and version must fit 16 bits, got {kind} and {version}")
    parts = tuple(parts)
    n = len(parts)
    PyObject_GetBuffer(header, &hbuf, PyBUF_SIMPLE)
    bufs = <Py_buffer*>PyMem_Malloc(sizeof(Py_buffer) * (n if n else 1))
    if bufs == NULL:
        PyBuffer_Release(&hbuf)
        raise MemoryError()
    try:
        for i in range(n):
            PyObject_GetBuffer(parts[i], &bufs[i], PyBUF_SIMPLE)
            got += 1
            plen += <size_t>bufs[i].len
        hlen = <size_t>hbuf.len
        if hlen > 0xFFFFFFFF:
            raise ValueError(f"envelope header of {hlen} bytes is longer than 2**32 - 1")
        total = 12 + hlen + 8 + plen + 4
        result = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>total)
        out = <uint8_t*>PyBytes_AS_STRING(result)
        with nogil:
            memcpy(out, _ENVELOPE_MAGIC, 4)
            _put16(out + 4, <uint16_t>version)
            _put16(out + 6, <uint16_t>kind)
            _put32(out + 8, <uint32_t>hlen)
            crc = _copy_crc(out + 12, <const uint8_t*>hbuf.buf, hlen, gh_crc32c(0, out, 12))
            pos = 12 + hlen
            _put64(out + pos, <uint64_t>plen)
            crc = gh_crc32c(crc, out + pos, 8)
            pos += 8
            for i in range(n):
                crc = _copy_crc(out + pos, <const uint8_t*>bufs[i].buf, <size_t>bufs[i].len, crc)
                pos += <size_t>bufs[i].len
            _put32(out + pos, crc)
        return result
    finally:
        for i in range(got):
            PyBuffer_Release(&bufs[i])
        PyMem_Free(bufs)
        PyBuffer_Release(&hbuf)


def encode_chunk(uint64_t generation, uint32_t index, uint32_t count, data):
    """Chunk record ``index`` of ``count`` of a snapshot generation: the 32-byte header (magic
    ``GRDC``, generation, index, count, CRC-32C of the data, data length, reserved 0), then
    ``data`` (bytes-like; a memoryview slice of the blob is copied once, without the GIL)."""
    cdef Py_buffer buf
    cdef size_t n
    cdef uint32_t crc
    cdef uint8_t* out
    PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
    try:
        n = <size_t>buf.len
        if n > 0xFFFFFFFF:
            raise ValueError(f"a chunk of {n} bytes is longer than 2**32 - 1")
        result = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>(32 + n))
        out = <uint8_t*>PyBytes_AS_STRING(result)
        with nogil:
            crc = _copy_crc(out + 32, <const uint8_t*>buf.buf, n, 0)
            memcpy(out, _CHUNK_MAGIC, 4)
            _put64(out + 4, generation)
            _put32(out + 12, index)
            _put32(out + 16, count)
            _put32(out + 20, crc)
            _put32(out + 24, <uint32_t>n)
            _put32(out + 28, 0)
        return result
    finally:
        PyBuffer_Release(&buf)
