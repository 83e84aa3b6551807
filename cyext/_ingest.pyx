# Per-record loops of the batch paths: grouping consumed messages into columns and
# decoding a column of payloads through a cache. Everything else in a batch is numpy or
# a sketch's nogil batch call.
from libc.math cimport exp
from libc.stdint cimport int64_t
cimport numpy as cnp
import numpy as np

from grudge_stream import record_checks as _checks

cnp.import_array()

# Timestamps outside [0, 2**53) ms are refused (grudge_stream.record_checks, as the codec).
cdef int64_t MAX_TS = _checks.MAX_TIMESTAMP_MS


def group_messages(list msgs):
    """confluent-kafka messages -> ({partition: (offsets, timestamps, keys, values)}, errors)."""
    cdef dict out = {}
    cdef list errors = []
    cdef object m, cols, err
    if not msgs:
        return out, errors
    # Unbound method descriptors: calling them skips creating a bound method per call.
    cls = type(msgs[0])
    m_error, m_partition, m_offset = cls.error, cls.partition, cls.offset
    m_timestamp, m_key, m_value = cls.timestamp, cls.key, cls.value
    cdef object last_p = None
    cdef list offs = None, tss = None, keys = None, vals = None
    for m in msgs:
        err = m_error(m)
        if err is not None:
            errors.append(m)
            continue
        p = m_partition(m)
        if p != last_p:
            cols = out.get(p)
            if cols is None:
                cols = out[p] = ([], [], [], [])
            offs, tss, keys, vals = cols
            last_p = p
        offs.append(m_offset(m))
        tss.append(m_timestamp(m)[1])
        keys.append(m_key(m))
        vals.append(m_value(m))
    return out, errors


def group_records(dict by_tp_records):
    """aiokafka records ({partition: [ConsumerRecord]}) -> {partition: (offsets, timestamps, keys, values)}."""
    cdef dict out = {}
    cdef list offs, tss, keys, vals
    cdef object r
    for p, recs in by_tp_records.items():
        offs, tss, keys, vals = [], [], [], []
        for r in recs:
            offs.append(r.offset)
            tss.append(r.timestamp)
            keys.append(r.key)
            vals.append(r.value)
        out[p] = (offs, tss, keys, vals)
    return out


def decode_column(list keys, list values, object timestamps, Py_ssize_t start, dict cache,
                  object decode_value, Py_ssize_t max_key_bytes, Py_ssize_t cache_max_entries,
                  Py_ssize_t cache_max_value_bytes, bint allow_empty_keys=False):
    """Decode records ``start..n`` whose meaning depends on the value bytes alone.

    Returns ``(index, deltas, ts, bad)``: the indexes of valid records (int64), their
    decoded values (float64) and timestamps (int64), and ``[(index, reason), ...]`` for the
    rest, in record order. ``decode_value(bytes)`` returns a float or a reason string.
    ``timestamps``: a list of ints, or int64 values in a buffer (the native fetcher's
    ``array.array('q')``).
    """
    cdef Py_ssize_t n = len(values), i, j = 0
    cdef cnp.ndarray[cnp.int64_t, ndim=1] idx = np.empty(n - start if n > start else 0, dtype=np.int64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1] deltas = np.empty(n - start if n > start else 0, dtype=np.float64)
    cdef cnp.ndarray[cnp.int64_t, ndim=1] ts = np.empty(n - start if n > start else 0, dtype=np.int64)
    cdef list bad = []
    cdef object v, k, d, t
    cdef int64_t tsv
    cdef bint ts_list = type(timestamps) is list
    cdef const long long[::1] tsa
    if not ts_list:
        tsa = timestamps
        if tsa.shape[0] != n:
            raise ValueError("timestamps and values differ in length")
    for i in range(start, n):
        v = values[i]
        if v is None:
            bad.append((i, _checks.NO_VALUE))
            continue
        d = cache.get(v)
        if d is None:
            d = decode_value(v)
            if len(cache) < cache_max_entries and len(<bytes>v) <= cache_max_value_bytes:
                cache[v] = d
        if type(d) is str:
            bad.append((i, d))
            continue
        k = keys[i]
        if k is None:
            bad.append((i, _checks.NO_KEY))
            continue
        if not allow_empty_keys and len(<bytes>k) == 0:
            bad.append((i, _checks.EMPTY_KEY))
            continue
        if max_key_bytes and len(<bytes>k) > max_key_bytes:
            bad.append((i, _checks.key_too_long(len(<bytes>k), max_key_bytes)))
            continue
        if ts_list:
            t = timestamps[i]
            tsv = t
        else:
            tsv = tsa[i]
        if tsv < 0 or tsv > MAX_TS:
            bad.append((i, _checks.timestamp_out_of_range("record timestamp", tsv)))
            continue
        idx[j] = i
        deltas[j] = d
        ts[j] = tsv
        j += 1
    return idx[:j], deltas[:j], ts[:j], bad


def watermark_and_weights(cnp.int64_t[::1] ts, double[::1] deltas, object watermark, double lam_per_ms,
                          object future_limit=None, bint clamp_future=True, object max_late=None):
    """Running watermark per event, lateness count, and late deltas weighted by exp(-lam * late).

    Event times above ``future_limit`` are applied at the watermark (``clamp_future``; at
    ``future_limit`` before the first event) or dropped;
    events more than ``max_late`` ms behind the watermark are dropped. Returns
    ``(now, weighted, late, clamped, dropped)``: ``now`` and ``weighted`` hold the kept
    events only, ``dropped`` is ``[(j, reason_code, ts, watermark), ...]`` with ``j`` the
    event's position in ``ts`` and reason_code 1 (future) or 2 (late), in event order.
    Uses libm's exp, as the per-record path does (math.exp), so results are bit-identical.
    """
    cdef Py_ssize_t n = ts.shape[0], i, j = 0
    cdef cnp.ndarray[cnp.int64_t, ndim=1] now = np.empty(n, dtype=np.int64)
    cdef cnp.ndarray[cnp.float64_t, ndim=1] w = np.empty(n, dtype=np.float64)
    cdef bint have = watermark is not None
    cdef int64_t wm = watermark if have else 0
    cdef bint has_fut = future_limit is not None
    cdef int64_t fut = future_limit if has_fut else 0
    cdef bint has_late = max_late is not None
    cdef int64_t maxlate = max_late if has_late else 0
    cdef Py_ssize_t late = 0, clamped = 0
    cdef int64_t t
    cdef list dropped = []
    for i in range(n):
        t = ts[i]
        if has_fut and t > fut:
            if not clamp_future:
                dropped.append((i, 1, t, wm if have else None))
                continue
            clamped += 1
            t = wm if have else fut  # applied at the watermark: it never moves the clock
        if have and has_late and wm - t > maxlate:
            dropped.append((i, 2, t, wm))
            continue
        if not have or t > wm:
            wm = t
            have = True
            w[j] = deltas[i]
        else:
            if t < wm:
                late += 1
                if lam_per_ms != 0.0:
                    w[j] = deltas[i] * exp(-lam_per_ms * <double>(wm - t))
                else:
                    w[j] = deltas[i]
            else:
                w[j] = deltas[i]
        now[j] = wm
        j += 1
    return now[:j], w[:j], late, clamped, dropped
