"""The column pipeline's data: one partition's records as columns, and one run of the
pipeline over them (``Operator.process_columns``, docs/runtime.md "The column path")."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from grudge_stream.operators.records import OutputRecord, SourceRecord


class Columns:
    """One partition's records as columns (what batch runtimes read: ``offsets``,
    ``timestamps``, ``keys``, ``values``), or the records themselves when a caller has
    them (their headers travel on to the outputs that cite them). Either form gives the
    other on demand."""

    __slots__ = ("topic", "partition", "_cols", "records")

    def __init__(self, topic: str, partition: int, cols: tuple[list, list, list, list] | None,
                 records: Sequence[SourceRecord] | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self._cols = cols
        self.records = records

    @classmethod
    def of_records(cls, topic: str, partition: int, records: Sequence[SourceRecord]) -> "Columns":
        return cls(topic, partition, None, records)

    def __len__(self) -> int:
        return len(self.records) if self.records is not None else len(self._cols[0])  # type: ignore[index]

    def columns(self) -> tuple[list, list, list, list]:
        if self._cols is None:
            recs = self.records
            assert recs is not None
            self._cols = ([r.offset for r in recs], [r.timestamp_ms for r in recs], [r.key for r in recs],
                          [r.value for r in recs])
        return self._cols

    def record(self, i: int) -> SourceRecord:
        if self.records is not None:
            return self.records[i]
        offsets, timestamps, keys, values = self._cols  # type: ignore[misc]
        return SourceRecord(self.topic, self.partition, offsets[i], timestamps[i], keys[i], values[i])

    def iter_records(self):
        if self.records is not None:
            return iter(self.records)
        topic, partition = self.topic, self.partition
        return (SourceRecord(topic, partition, o, t, k, v) for o, t, k, v in zip(*self._cols))  # type: ignore[misc]


class Run:
    """The admitted events of one batch, in offset order, as the pipeline hands them to an
    operator's ``apply_columns``: event ``e`` is record ``idx[e]`` of ``batch``, with key
    ``keys[e]``, decoded value ``values[e]`` (a float array for numeric codecs, else a
    list), effective event time ``ts[e]`` (a clamped future time is the watermark), the
    watermark it is applied at ``now[e]``, its lateness ``late[e]`` (``now - ts``) and its
    value weighted by ``exp(-late_decay_per_ms * late)`` (``weighted``, numeric codecs).

    Outputs go through ``emit``: tagged with the source offset, so the pipeline returns
    them in offset order whatever path made them."""

    __slots__ = ("batch", "idx", "keys", "values", "ts", "now", "weighted", "_tagged", "_seq")

    def __init__(self, batch: Columns, idx: np.ndarray, keys: list, values: Any, ts: np.ndarray,
                 now: np.ndarray, weighted: np.ndarray | None,
                 tagged: list[tuple[int, int, OutputRecord]]) -> None:
        self.batch, self.idx, self.keys, self.values = batch, idx, keys, values
        self.ts, self.now, self.weighted = ts, now, weighted
        self._tagged = tagged
        self._seq = 0

    @property
    def late(self) -> np.ndarray:
        return self.now - self.ts

    def keys_of(self, a: int, b: int) -> list:
        """The keys of events ``a`` to ``b`` (the list itself when that is all of them)."""
        keys = self.keys
        return keys if a == 0 and b == len(keys) else keys[a:b]

    def __len__(self) -> int:
        return len(self.idx)

    def record(self, e: int) -> SourceRecord:
        return self.batch.record(int(self.idx[e]))

    def emit(self, offset: int, outs: list[OutputRecord]) -> None:
        tagged = self._tagged
        for o in outs:
            self._seq += 1
            tagged.append((offset, self._seq, o))
