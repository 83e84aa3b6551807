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


cdef class Envelope:
    """An envelope not built yet (``grudge_stream.envelope.later``): ``build``, or a ``pack``
    whose parts hold it, writes it in place, straight into the enclosing blob, so it is never
    a blob of its own (copied into the next, then freed with the GIL). ``len()`` is its size
    once built. Its buffer parts must not change until it is built."""

    cdef readonly int kind
    cdef readonly int version
    cdef readonly object header
    cdef readonly tuple parts
    cdef readonly Py_ssize_t nbytes

    def __init__(self, int kind, header, parts, int version=1):
        cdef Py_ssize_t total
        if kind < 0 or kind > 0xFFFF or version < 0 or version > 0xFFFF:
            raise ValueError(f"kind and version must fit 16 bits, got {kind} and {version}")
        self.kind, self.version, self.header, self.parts = kind, version, header, tuple(parts)
        n = memoryview(header).nbytes
        if n > 0xFFFFFFFF:
            raise ValueError(f"envelope header of {n} bytes is longer than 2**32 - 1")
        total = 12 + n + 8 + 4
        for p in self.parts:
            total += (<Envelope>p).nbytes if isinstance(p, Envelope) else memoryview(p).nbytes
        self.nbytes = total

    def __len__(self):
        return self.nbytes


# The steps of a build: open an envelope (its head, header and payload length), copy a part,
# close the innermost envelope (its CRC-32C).
cdef enum:
    OP_OPEN = 1
    OP_DATA = 2
    OP_CLOSE = 3
    MAX_DEPTH = 16

ctypedef struct Step:
    int what
    const uint8_t* p
    size_t n
    uint16_t kind
    uint16_t version
    uint64_t plen


cdef int _plan(Envelope env, list order, int depth) except -1:
    if depth >= MAX_DEPTH:
        raise ValueError(f"envelopes nested more than {MAX_DEPTH} deep")
    order.append((OP_OPEN, env))
    for p in env.parts:
        if isinstance(p, Envelope):
            _plan(<Envelope>p, order, depth + 1)
        else:
            order.append((OP_DATA, p))
    order.append((OP_CLOSE, None))
    return 0


cdef inline void _feed(uint32_t* crcs, int depth, const uint8_t* p, size_t n) noexcept nogil:
    cdef int d
    for d in range(depth):
        crcs[d] = gh_crc32c(crcs[d], p, n)


cdef inline void _copy_feed(uint8_t* dst, const uint8_t* src, size_t n, uint32_t* crcs,
                            int depth) noexcept nogil:
    """Copy ``n`` bytes and feed them to every open envelope's CRC, a block at a time."""
    cdef size_t off = 0, step
    while off < n:
        step = n - off if n - off < BLOCK else BLOCK
        memcpy(dst + off, src + off, step)
        _feed(crcs, depth, dst + off, step)
        off += step


def build(Envelope env not None):
    """The bytes of ``env`` and of every envelope it holds, in one allocation: each part is
    copied once, and every CRC-32C (each envelope's over its own bytes) computed on the way,
    without the GIL."""
    cdef list order = []
    cdef Py_ssize_t nsteps, i
    cdef Step* steps
    cdef Py_buffer* bufs
    cdef Py_ssize_t got = 0
    cdef uint32_t crcs[MAX_DEPTH]
    cdef int depth = 0
    cdef size_t pos = 0
    cdef uint8_t* out
    cdef Envelope e
    cdef Py_ssize_t opened[MAX_DEPTH]
    cdef size_t acc[MAX_DEPTH]
    cdef size_t size = 0
    _plan(env, order, 0)
    nsteps = len(order)
    steps = <Step*>PyMem_Malloc(sizeof(Step) * nsteps)
    bufs = <Py_buffer*>PyMem_Malloc(sizeof(Py_buffer) * nsteps)
    if steps == NULL or bufs == NULL:
        PyMem_Free(steps)
        PyMem_Free(bufs)
        raise MemoryError()
    try:
        for i in range(nsteps):
            what, obj = order[i]
            steps[i].what = what
            if what == OP_CLOSE:
                continue
            if what == OP_OPEN:
                e = <Envelope>obj
                PyObject_GetBuffer(e.header, &bufs[got], PyBUF_SIMPLE)
                steps[i].kind = <uint16_t>e.kind
                steps[i].version = <uint16_t>e.version
            else:
                PyObject_GetBuffer(obj, &bufs[got], PyBUF_SIMPLE)
            steps[i].p = <const uint8_t*>bufs[got].buf
            steps[i].n = <size_t>bufs[got].len
            got += 1
        # Each envelope's payload length from the buffers as they are now (held until the end).
        for i in range(nsteps):
            if steps[i].what == OP_OPEN:
                opened[depth] = i
                acc[depth] = 0
                depth += 1
            elif steps[i].what == OP_DATA:
                acc[depth - 1] += steps[i].n
            else:
                depth -= 1
                steps[opened[depth]].plen = acc[depth]
                size = 24 + steps[opened[depth]].n + acc[depth]
                if depth:
                    acc[depth - 1] += size
        if <Py_ssize_t>size != env.nbytes:
            raise ValueError(f"a part of the envelope changed size ({size} bytes, {env.nbytes} when made)")
        result = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>size)
        out = <uint8_t*>PyBytes_AS_STRING(result)
        with nogil:
            for i in range(nsteps):
                if steps[i].what == OP_OPEN:
                    crcs[depth] = 0
                    depth += 1
                    memcpy(out + pos, _ENVELOPE_MAGIC, 4)
                    _put16(out + pos + 4, steps[i].version)
                    _put16(out + pos + 6, steps[i].kind)
                    _put32(out + pos + 8, <uint32_t>steps[i].n)
                    _feed(crcs, depth, out + pos, 12)
                    pos += 12
                    _copy_feed(out + pos, steps[i].p, steps[i].n, crcs, depth)
                    pos += steps[i].n
                    _put64(out + pos, steps[i].plen)
                    _feed(crcs, depth, out + pos, 8)
                    pos += 8
                elif steps[i].what == OP_DATA:
                    _copy_feed(out + pos, steps[i].p, steps[i].n, crcs, depth)
                    pos += steps[i].n
                else:
                    depth -= 1
                    _put32(out + pos, crcs[depth])
                    _feed(crcs, depth, out + pos, 4)
                    pos += 4
        return result
    finally:
        for i in range(got):
            PyBuffer_Release(&bufs[i])
        PyMem_Free(bufs)
        PyMem_Free(steps)


def pack(int kind, header, parts, int version=1):
    """The envelope around ``header`` (its canonical JSON, bytes) and a payload that is the
    concatenation of ``parts`` (bytes-like objects, C-contiguous, or ``Envelope``s, built in
    place): magic, ``version``, ``kind``, header length, header, payload length, payload,
    CRC-32C of all before it. The parts are copied once, straight into the result, and
    checksummed on the way, without the GIL; they must not change meanwhile (bytes, or a
    private copy)."""
    return build(Envelope(kind, header, parts, version))


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
