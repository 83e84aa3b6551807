"""The column path of the operator pipeline: a batch decoded, checked and applied as columns.

``columnar(op, batch, limits)`` is ``Operator._pipeline``'s column path: the records
below ``next_offset`` skipped, the rest decoded as a column (numeric payload codecs: one
Cython pass over cached payloads, ``grudge_stream._cyext._ingest``) and checked, bad ones
dead-lettered, event times bounded and the watermark run in one Cython loop, timers fired
at the events that make them due, and the segments between them applied by
``Operator.apply_columns``; outputs in offset order. The record-by-record path stays on
the operator (``grudge_stream.operators.base``); the results are identical either way.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Any

import numpy as np

from grudge_stream._cyext import _ingest
from grudge_stream.operators.codec import CACHE_MAX_ENTRIES, CACHE_MAX_VALUE_BYTES, BadRecord, Event, EventCodec
from grudge_stream.operators.columns import Columns, Run
from grudge_stream.operators.records import TICK_KEY, OutputRecord

__all__ = ["columnar"]


def columnar(op: Any, batch: Columns, limits: tuple[int | None, int | None],
             decoded: tuple[np.ndarray, np.ndarray] | None = None) -> list[OutputRecord] | None:
    """The column path of ``Operator._pipeline`` for ``op``; None (nothing changed) for a batch
    with a tick. ``decoded``: the values and times of events already decoded
    (``Operator.process_values``)."""
    offsets, timestamps, keys, values = batch.columns()
    n_all = len(offsets)
    start = 0 if op.next_offset is None else bisect_left(offsets, op.next_offset)
    if start == n_all:
        op.skipped += start
        return []
    codec = op.codec
    numeric = codec.numeric_values
    ev_keys: list | None
    vals: Any
    if decoded is not None:
        idx = np.arange(start, n_all, dtype=np.int64)
        vals, ts = decoded[0][start:], decoded[1][start:]
        ev_keys, bad = None, []
    elif numeric and codec.value_only:
        idx, vals, ts, bad = _ingest.decode_column(
            keys, values, timestamps, start, codec._cache, codec.decode_value_or_reason,
            codec.max_key_bytes, CACHE_MAX_ENTRIES, CACHE_MAX_VALUE_BYTES, codec.allow_empty_keys)
        ev_keys = None  # the record keys
        if bad and any(keys[i] == TICK_KEY and values[i] is None for i, _ in bad):
            return None  # a tick (a quiet partition's time moving on): in its place, record by record
    else:
        decoded = _decode_each(codec, keys, values, timestamps, start)
        if decoded is None:
            return None  # a tick: record by record
        idx, ev_keys, vals, ts, bad = decoded
        if numeric:
            vals = np.asarray(vals, dtype=np.float64)
    op.skipped += start
    tagged: list[tuple[int, int, OutputRecord]] = [
        (offsets[i], 0, op.dead_letter(batch.record(i), reason)) for i, reason in bad]
    keep: np.ndarray | None = None
    if op._traits[1] and len(idx):
        keep = np.ones(len(idx), dtype=bool)
        validate = op.validate_event
        py_vals = vals.tolist() if numeric else vals
        for j, i in enumerate(idx.tolist()):
            try:
                validate(Event(keys[i] if ev_keys is None else ev_keys[j], int(ts[j]), py_vals[j]))
            except BadRecord as exc:
                keep[j] = False
                tagged.append((offsets[i], 0, op.dead_letter(batch.record(i), str(exc))))
        idx, ts, vals, ev_keys = _kept(keep, idx, ts, vals, ev_keys)
    n = len(idx)
    if n:
        fut_limit, late_limit = limits
        clamp = op.future_policy == "clamp"
        now, weighted, late, clamped, dropped = _ingest.watermark_and_weights(
            ts, vals if numeric else np.zeros(n), op.watermark, op.late_decay_per_ms if numeric else 0.0,
            fut_limit, clamp, late_limit)
        op.counters["future_clamped"] += clamped
        if dropped:
            keep = np.ones(n, dtype=bool)
            for j, code, t, wm in dropped:
                keep[j] = False
                if code == 2:
                    op.counters["late_dropped"] += 1
                    if op.late_policy == "count":
                        continue
                i = int(idx[j])
                tagged.append((offsets[i], 0, op.dead_letter(batch.record(i),
                                                               op.time_reason(code, t, wm, fut_limit))))
            idx, ts, vals, ev_keys = _kept(keep, idx, ts, vals, ev_keys)
            n = len(idx)
    if n:
        if clamped:  # applied at the watermark: their time is the watermark's
            ts = np.where(ts > fut_limit, now, ts)
        op.watermark = int(now[-1])
        op.counters["events"] += n
        op.counters["late"] += late
        if ev_keys is None:
            ev_keys = keys[start:] if n == n_all - start else [keys[i] for i in idx.tolist()]
        run = Run(batch, idx, ev_keys, vals, ts, now, weighted if numeric else None, tagged)
        pos = 0
        while pos < n:
            end = n
            if op._timer_intervals:
                # The timers fire as ``_admit`` fires them, at the first event of a segment;
                # the segment then runs up to the next due time (``now`` never decreases).
                i = int(idx[pos])
                timer_out: list[OutputRecord] = []
                op.fire_timers(int(now[pos]), batch.record(i), timer_out)
                run.emit(offsets[i], timer_out)
                due = op.next_timer()
                if due is not None:
                    end = int(np.searchsorted(now, due, side="left"))
            op.apply_columns(run, pos, end)
            pos = end
    op.next_offset = offsets[-1] + 1
    tagged.sort(key=lambda x: (x[0], x[1]))
    return [o for _, _, o in tagged]


def _decode_each(codec: EventCodec, keys: list, values: list, timestamps: list,
                 start: int) -> tuple[np.ndarray, list, list, np.ndarray, list[tuple[int, str]]] | None:
    """``codec.decode`` over the records from ``start``: (positions, event keys, values,
    event times) of the good ones, and ``(position, reason)`` of the bad ones; None when
    a tick record is among them."""
    idx: list[int] = []
    ev_keys: list = []
    vals: list = []
    ts: list[int] = []
    bad: list[tuple[int, str]] = []
    decode = codec.decode
    for i in range(start, len(keys)):
        if values[i] is None and keys[i] == TICK_KEY:
            return None
        try:
            ev = decode(keys[i], values[i], timestamps[i])
        except BadRecord as exc:
            bad.append((i, str(exc)))
            continue
        idx.append(i)
        ev_keys.append(ev.key)
        vals.append(ev.value)
        ts.append(ev.ts_ms)
    return np.array(idx, dtype=np.int64), ev_keys, vals, np.array(ts, dtype=np.int64), bad


def _kept(keep: np.ndarray, idx: np.ndarray, ts: np.ndarray, vals: Any,
          ev_keys: list | None) -> tuple[np.ndarray, np.ndarray, Any, list | None]:
    """The events ``keep`` marks, of each column."""
    if isinstance(vals, np.ndarray):
        vals = vals[keep]
    else:
        vals = [v for v, k in zip(vals, keep.tolist()) if k]
    if ev_keys is not None:
        ev_keys = [key for key, k in zip(ev_keys, keep.tolist()) if k]
    return idx[keep], ts[keep], vals, ev_keys
