# The native ingest kernel: a confluent-kafka consumer's assigned partitions read through
# librdkafka's C API (resolved at run time, cyext/grdk.h) straight into the column shape of the
# batch pipeline, (offsets, timestamps, keys, values) per partition, without a Message object
# per record. Group membership, callbacks, commits and seeks stay with the confluent-kafka
# Consumer; see grudge_stream/runtime/native.py.
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.long cimport PyLong_FromLongLong
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF, Py_XDECREF
from libc.string cimport memcmp
from cpython cimport array
import array
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport strlen

cdef extern from "grdk.h" nogil:
    ctypedef struct grdk_kafka_t:
        pass
    ctypedef struct grdk_queue_t:
        pass
    ctypedef struct grdk_headers_t:
        pass
    ctypedef struct grdk_message_t:
        int err
        int32_t partition
        void *payload
        size_t len
        void *key
        size_t key_len
        int64_t offset
    ctypedef struct grdk_api_t:
        void *lib
        int (*version)() noexcept nogil
        const char *(*name)(const grdk_kafka_t *) noexcept nogil
        int (*type)(const grdk_kafka_t *) noexcept nogil
        grdk_queue_t *(*queue_new)(grdk_kafka_t *) noexcept nogil
        grdk_queue_t *(*queue_get_partition)(grdk_kafka_t *, const char *, int32_t) noexcept nogil
        void (*queue_forward)(grdk_queue_t *, grdk_queue_t *) noexcept nogil
        void (*queue_destroy)(grdk_queue_t *) noexcept nogil
        ssize_t (*consume_batch_queue)(grdk_queue_t *, int, grdk_message_t **, size_t) noexcept nogil
        void (*message_destroy)(grdk_message_t *) noexcept nogil
        int64_t (*message_timestamp)(const grdk_message_t *, int *) noexcept nogil
        const char *(*err2str)(int) noexcept nogil
        int (*message_headers)(const grdk_message_t *, grdk_headers_t **) noexcept nogil
        int (*header_get_all)(const grdk_headers_t *, size_t, const char **, const void **, size_t *) noexcept nogil
    grdk_api_t grdk
    int GRDK_CONSUMER
    int GRDK_ERR_PARTITION_EOF
    int grdk_load(const char *path, char *why, size_t whylen)
    grdk_kafka_t *grdk_client_handle(PyObject *client)

PARTITION_EOF = GRDK_ERR_PARTITION_EOF
cdef enum:
    MEMO = 4              # payloads remembered by a fetcher
    MEMO_MAX_BYTES = 256  # the largest payload remembered


def load(str path):
    """Resolve the librdkafka API from the library at ``path``, which must already be loaded
    (by confluent-kafka). Returns None, or the reason it cannot be used."""
    cdef char why[512]
    cdef bytes p = path.encode()
    if grdk_load(p, why, sizeof(why)) != 0:
        return why.decode(errors="replace")
    return None


def loaded():
    return grdk.lib != NULL


def version():
    """librdkafka's version integer (as confluent_kafka.libversion()[1])."""
    if grdk.lib == NULL:
        raise RuntimeError("librdkafka API not loaded")
    return grdk.version()


cdef grdk_kafka_t *_handle(object consumer) except? NULL:
    if grdk.lib == NULL:
        raise RuntimeError("librdkafka API not loaded")
    from confluent_kafka import cimpl
    if not isinstance(consumer, cimpl.Consumer):
        raise TypeError(f"not a confluent_kafka Consumer: {type(consumer)!r}")
    cdef grdk_kafka_t *rk = grdk_client_handle(<PyObject *>consumer)
    if rk == NULL:
        raise RuntimeError("the consumer is closed")
    return rk


def client_identity(object consumer):
    """(librdkafka's instance name, its client type) of a confluent-kafka Consumer, read through
    the handle this module takes from it: what pins confluent-kafka's object layout."""
    cdef grdk_kafka_t *rk = _handle(consumer)
    return grdk.name(rk).decode(errors="replace"), grdk.type(rk)


cdef object _headers_of(grdk_message_t *m):
    """A record's headers as confluent-kafka's ``Message.headers()`` gives them: None without
    any, else ``[(name, value bytes or None)]`` in record order."""
    cdef grdk_headers_t *hs = NULL
    cdef size_t i = 0, size = 0
    cdef const char *name = NULL
    cdef const void *val = NULL
    cdef list out
    if grdk.message_headers(m, &hs) != 0 or hs == NULL:
        return None
    out = []
    while grdk.header_get_all(hs, i, &name, &val, &size) == 0:
        out.append((PyUnicode_DecodeUTF8(name, strlen(name), "replace"),
                    PyBytes_FromStringAndSize(<const char *>val, size) if val != NULL else None))
        i += 1
    return out


cdef inline object _bytes_or_none(const void *p, size_t n):
    return PyBytes_FromStringAndSize(<const char *>p, n) if p != NULL else None


cdef tuple _error_of(grdk_message_t *m):
    """(partition, code, text) of an error message."""
    if m.payload != NULL and m.len > 0:
        text = (<char *>m.payload)[:m.len].decode(errors="replace")
    else:
        text = grdk.err2str(m.err).decode(errors="replace")
    return (m.partition, m.err, text)


cdef class PartitionFetch:
    """One consumer's assigned partitions of ``topic``, forwarded to a queue of their own.

    ``split(partitions)`` must run before they are assigned (librdkafka then leaves the
    application's forwarding in place instead of routing their records to the consumer queue),
    ``release`` once they are unassigned, ``close`` before the consumer closes. ``fetch`` takes
    up to ``n`` records (waiting at most ``timeout_ms`` for the first ones, the GIL released)
    and returns ``(groups, errors, count)``: ``{partition: (offsets, timestamps, keys,
    values)}`` in fetch order, ``[(partition, code, text)]`` for per-partition errors (the end of
    a partition included), and the records in ``groups``. ``fetch(n, timeout_ms, headers=True)``
    adds two columns per partition, ``(..., headers, timestamp_types)``: each record's headers
    (None for a record without any, else ``[(name, value bytes or None)]`` as confluent-kafka's
    ``Message.headers()``) and its timestamp type (0 none, 1 create time, 2 log append time)."""

    cdef grdk_kafka_t *rk
    cdef grdk_queue_t *queue
    cdef object consumer
    cdef bytes topic
    cdef dict parts            # partition -> its queue handle (as an address)
    cdef grdk_message_t **msgs
    cdef Py_ssize_t capacity
    # The last few small payloads, each as the one bytes object handed out for every record
    # that carries those bytes (most topics repeat a few payloads: one object instead of one
    # per record, and its hash, cached in the object, computed once for the codec's cache).
    cdef PyObject *memo[MEMO]
    cdef Py_ssize_t memo_len[MEMO]
    cdef int memo_next, memo_last

    cdef object _payload(self, const char *p, size_t n):
        cdef int j, k
        cdef PyObject *o
        cdef object b
        if p == NULL:
            return None
        if n > MEMO_MAX_BYTES:
            return PyBytes_FromStringAndSize(p, n)
        k = self.memo_last
        for j in range(MEMO):
            o = self.memo[k]
            if o != NULL and self.memo_len[k] == <Py_ssize_t>n and memcmp(PyBytes_AS_STRING(<object>o), p, n) == 0:
                self.memo_last = k
                return <object>o
            k = k + 1 if k + 1 < MEMO else 0
        b = PyBytes_FromStringAndSize(p, n)
        k = self.memo_next
        self.memo_next = k + 1 if k + 1 < MEMO else 0
        Py_XDECREF(self.memo[k])
        Py_INCREF(b)
        self.memo[k] = <PyObject *>b
        self.memo_len[k] = <Py_ssize_t>n
        self.memo_last = k
        return b

    def __cinit__(self, object consumer, str topic, Py_ssize_t capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.rk = _handle(consumer)
        if grdk.type(self.rk) != GRDK_CONSUMER:
            raise TypeError("not a librdkafka consumer handle")
        self.consumer = consumer
        self.topic = topic.encode()
        self.parts = {}
        self.msgs = <grdk_message_t **>malloc(capacity * sizeof(grdk_message_t *))
        if self.msgs == NULL:
            raise MemoryError()
        self.capacity = capacity
        self.queue = grdk.queue_new(self.rk)
        if self.queue == NULL:
            raise RuntimeError("rd_kafka_queue_new failed")

    cdef bint _live(self):
        # The consumer's own handle still the one we took (closed: NULL).
        return self.queue != NULL and grdk_client_handle(<PyObject *>self.consumer) == self.rk

    @property
    def partitions(self):
        return sorted(self.parts)

    @property
    def closed(self):
        return self.queue == NULL

    def split(self, partitions):
        """Forward these partitions' fetch queues to this fetcher's queue (before assign)."""
        cdef grdk_queue_t *pq
        cdef int32_t p
        if not self._live():
            raise RuntimeError("the fetcher or its consumer is closed")
        for part in partitions:
            if part in self.parts:
                continue
            p = part
            pq = grdk.queue_get_partition(self.rk, self.topic, p)
            if pq == NULL:
                raise RuntimeError(f"no partition queue for {self.topic.decode()}[{p}]")
            grdk.queue_forward(pq, self.queue)
            self.parts[part] = <size_t>pq

    def release(self, partitions=None):
        """Drop these partitions' queue handles (all with None), their forwarding removed."""
        cdef grdk_queue_t *pq
        if self.queue == NULL:
            self.parts.clear()
            return
        live = self._live()
        for part in (list(self.parts) if partitions is None else list(partitions)):
            addr = self.parts.pop(part, None)
            if addr is None or not live:
                continue
            pq = <grdk_queue_t *><size_t>addr
            grdk.queue_forward(pq, NULL)
            grdk.queue_destroy(pq)

    def close(self):
        """Every handle dropped; call before the consumer closes (later, nothing is touched)."""
        if self.queue == NULL:
            return
        live = self._live()
        self.release(None)
        if live:
            grdk.queue_destroy(self.queue)
        self.queue = NULL

    def __dealloc__(self):
        cdef int j
        if self.queue != NULL and self.consumer is not None and self._live():
            for addr in self.parts.values():
                grdk.queue_forward(<grdk_queue_t *><size_t>addr, NULL)
                grdk.queue_destroy(<grdk_queue_t *><size_t>addr)
            grdk.queue_destroy(self.queue)
        self.queue = NULL
        for j in range(MEMO):
            Py_XDECREF(self.memo[j])
            self.memo[j] = NULL
        if self.msgs != NULL:
            free(self.msgs)
            self.msgs = NULL

    def fetch(self, Py_ssize_t n, int timeout_ms, bint headers=False, bint arrays=False):
        """See the class. ``arrays`` (without ``headers``): each partition's offsets and
        timestamps as ``array.array('q')`` instead of lists of ints (no int object per record;
        indexing, slicing, ``len`` and ``bisect`` work as on the lists)."""
        cdef dict groups = {}
        cdef list errors = []
        cdef ssize_t got, i
        cdef grdk_message_t *m
        cdef grdk_message_t **msgs = self.msgs
        cdef grdk_queue_t *q = self.queue
        cdef int32_t last_p = -1
        cdef int tstype
        cdef Py_ssize_t count = 0
        cdef list offs = None, tss = None, keys = None, vals = None, hdrs = None, tstypes = None
        cdef object cols, key, val
        if q == NULL or not self._live():
            raise RuntimeError("the fetcher or its consumer is closed")
        if n > self.capacity:
            n = self.capacity
        if n < 1:
            return groups, errors, 0
        with nogil:
            got = grdk.consume_batch_queue(q, timeout_ms, msgs, <size_t>n)
        if got < 0:
            raise RuntimeError("rd_kafka_consume_batch_queue failed")
        if arrays and not headers:
            return self._arrays(got)
        i = 0
        try:
            while i < got:
                m = msgs[i]
                if m.err != 0:
                    errors.append(_error_of(m))
                else:
                    if m.partition != last_p or offs is None:
                        cols = groups.get(m.partition)
                        if cols is None:
                            offs, tss, keys, vals = [], [], [], []
                            if headers:
                                hdrs, tstypes = [], []
                                groups[m.partition] = (offs, tss, keys, vals, hdrs, tstypes)
                            else:
                                groups[m.partition] = (offs, tss, keys, vals)
                        elif headers:
                            offs, tss, keys, vals, hdrs, tstypes = cols
                        else:
                            offs, tss, keys, vals = cols
                        last_p = m.partition
                    offs.append(PyLong_FromLongLong(m.offset))
                    tss.append(PyLong_FromLongLong(grdk.message_timestamp(m, &tstype)))
                    keys.append(_bytes_or_none(m.key, m.key_len))
                    vals.append(self._payload(<const char *>m.payload, m.len))
                    if headers:
                        hdrs.append(_headers_of(m))
                        tstypes.append(tstype)
                    count += 1
                grdk.message_destroy(m)
                i += 1
        finally:
            while i < got:  # an error above: the rest is released all the same
                grdk.message_destroy(msgs[i])
                i += 1
        return groups, errors, count

    cdef tuple _arrays(self, ssize_t got):
        """``fetch(arrays=True)`` over the ``got`` records taken: two passes, the first
        counting each partition's records (so each array is made at its size), the second
        filling them; every record is released whatever happens."""
        cdef dict groups = {}, sizes = {}
        cdef list errors = []
        cdef grdk_message_t **msgs = self.msgs
        cdef grdk_message_t *m
        cdef ssize_t i = 0, j = 0, run = 0
        cdef int32_t last_p = -1
        cdef int tstype
        cdef Py_ssize_t count = 0, at = 0
        cdef array.array offs, tss
        cdef long long *po = NULL
        cdef long long *pt = NULL
        cdef list keys = None, vals = None, cols
        cdef array.array template = array.array('q')
        try:
            while j < got:  # the first pass: records per partition (``i`` stays at the first
                m = msgs[j]  # record not released yet, for the ``finally``)
                if m.err == 0:
                    if m.partition != last_p:
                        if run:
                            sizes[last_p] = sizes.get(last_p, 0) + run
                        last_p, run = m.partition, 0
                    run += 1
                j += 1
            if run:
                sizes[last_p] = sizes.get(last_p, 0) + run
            for p, size in sizes.items():
                groups[p] = [array.clone(template, size, False), array.clone(template, size, False), [], [], 0]
            last_p = -1
            cols = None
            while i < got:
                m = msgs[i]
                if m.err != 0:
                    errors.append(_error_of(m))
                else:
                    if m.partition != last_p or cols is None:
                        if cols is not None:
                            cols[4] = at
                        cols = groups[m.partition]
                        offs, tss, keys, vals = cols[0], cols[1], cols[2], cols[3]
                        po, pt = offs.data.as_longlongs, tss.data.as_longlongs
                        at = cols[4]
                        last_p = m.partition
                    po[at] = m.offset
                    pt[at] = grdk.message_timestamp(m, &tstype)
                    at += 1
                    keys.append(_bytes_or_none(m.key, m.key_len))
                    vals.append(self._payload(<const char *>m.payload, m.len))
                    count += 1
                grdk.message_destroy(m)
                i += 1
        finally:
            while i < got:  # an error above: the rest is released all the same
                grdk.message_destroy(msgs[i])
                i += 1
        return {p: (c[0], c[1], c[2], c[3]) for p, c in groups.items()}, errors, count

