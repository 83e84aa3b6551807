"""Global top-k: one heavy-hitter view over every source partition, per report interval.

``HeavyHitterOperator`` reports each source partition's top-k at the end of every
report interval (event time), keyed by the interval start, so all partitions'
reports of one interval land in the same partition of the reports topic. This
operator reads that topic and emits one ``global_reports`` record per interval
once it holds the report of every source partition (``partitions`` in the
reports), or, when a partition stays silent, once its watermark (the latest
interval end it has seen) is ``grace_ms`` past the interval end: that record
lists the partitions it lacks in ``missing``.

The merge: a key's global estimate is the sum of the estimates the reports list
for it, the entries are sorted (estimate descending, then key bytes) and cut to
``k`` (the reports' k, or the smaller ``top_k`` setting).

- **Keyed source** (``keyed=true``, each key lives in one partition: the stream
  is keyed by the counted key): a key's global estimate is its one partition's
  estimate, and a key in the global top-k is in its partition's top-k (else that
  partition alone lists k keys at least as heavy). So the record is **exact**:
  equal to the top-k of the per-partition sketches' estimates at the interval
  end (count-min upper bounds, and only of the keys each partition's top-k
  tracker holds, docs/count-min.md), up to the order of keys tied at the k-th
  estimate. ``"exact": true`` says so: complete, and no key listed twice.
- **Split keys** (``keyed=false``, or a key a keyed source lists in two
  partitions): ``estimate`` sums the partitions that list the key; a reporting
  partition that does not list it holds at most its *floor* of it (its k-th
  listed estimate when it lists k keys, else 0: the top-k tracker's guarantee),
  so the key's global count is at most ``estimate_max`` = ``estimate`` + the
  floors of the reporting partitions that do not list it (the error bound of
  ``estimate`` when estimates are counts). A key no partition lists has a count
  of at most ``unlisted_max`` (the sum of all floors). Such entries carry
  ``estimate_max`` and ``split: true`` when several partitions list them;
  ``"exact"`` is false.

Bounded state: at most ``max_open_intervals`` intervals wait at once; opening
one more closes the oldest early (``closed_by: "capacity"``, with its missing
partitions). Reports that arrive for an interval already closed (a copy from an
upstream restart, or a partition that reports after the grace) are counted
(``reports_duplicate`` / ``reports_late``) and dropped: a global record is never
emitted twice. Malformed reports are dead letters.
"""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from grudge_stream.exceptions import ConfigError, SnapshotError
from grudge_stream.operators.base import Operator
from grudge_stream.operators.codec import BadRecord, Event, EventCodec, _json_object
from grudge_stream.operators.records import (
    GlobalTopKEntry,
    GlobalTopKReport,
    MergedTopK,
    OutputRecord,
    Source,
    SourceRecord,
    output_id,
)
from grudge_stream.record_checks import NO_VALUE

# Bounds a report must respect: a malformed (or hostile) report cannot make a record list
# millions of missing partitions or hold millions of entries per interval.
MAX_PARTITIONS = 10_000
MAX_K = 10_000


class Report(NamedTuple):
    operator: str
    partition: int
    partitions: int | None
    start_ms: int
    end_ms: int
    k: int
    top: list[tuple[bytes, int]]


def _int(obj: dict, name: str, lo: int, hi: int | None = None, null: bool = False) -> Any:
    v = obj.get(name)
    if v is None and null:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRecord(f"report field {name!r} must be an integer, got {type(v).__name__}")
    if v < lo or (hi is not None and v > hi):
        raise BadRecord(f"report field {name!r} = {v} is out of range [{lo}, {hi if hi is not None else 'inf'}]")
    return v


def parse_report(value: bytes | None) -> Report:
    """A heavy-hitters report, checked field by field, or BadRecord saying what is wrong."""
    if value is None:
        raise BadRecord(NO_VALUE)
    obj = _json_object(value)
    op = obj.get("operator")
    if not isinstance(op, str) or not op:
        raise BadRecord("report field 'operator' must be a non-empty string")
    partitions = _int(obj, "partitions", 1, MAX_PARTITIONS, null=True)
    partition = _int(obj, "partition", 0, (partitions - 1) if partitions else MAX_PARTITIONS - 1)
    start = _int(obj, "interval_start_ms", 0, 2**53 - 1)
    end = _int(obj, "interval_end_ms", start + 1, 2**53 - 1)
    k = _int(obj, "k", 0, MAX_K)
    top = obj.get("top")
    if not isinstance(top, list) or len(top) > k:
        raise BadRecord(f"report field 'top' must be a list of at most k={k} entries")
    entries: list[tuple[bytes, int]] = []
    seen: set[bytes] = set()
    for e in top:
        if not isinstance(e, dict):
            raise BadRecord("a top entry must be an object")
        if isinstance(e.get("key"), str):
            key = e["key"].encode("utf-8")
        elif isinstance(e.get("key_b64"), str):
            try:
                key = base64.b64decode(e["key_b64"], validate=True)
            except (binascii.Error, ValueError):
                raise BadRecord("a top entry's key_b64 is not base64") from None
        else:
            raise BadRecord("a top entry needs 'key' (text) or 'key_b64'")
        est = _int(e, "estimate", 0)
        if key in seen:
            raise BadRecord(f"report lists key {key[:64]!r} twice")
        if entries and est > entries[-1][1]:
            raise BadRecord("report entries must be sorted by estimate, heaviest first")
        seen.add(key)
        entries.append((key, est))
    return Report(op, partition, partitions, start, end, k, entries)


@dataclass(frozen=True)
class ReportCodec(EventCodec):
    """Reads heavy-hitters reports: the event time is the interval end, the value the
    parsed ``Report``; anything malformed is a BadRecord (a dead letter)."""

    numeric_values = False  # a Report

    value_field: str | None = None
    time_field: str | None = "interval_end_ms"

    def decode(self, key: bytes | None, value: bytes | None, record_ts_ms: int) -> Event:
        r = parse_report(value)
        return Event(str(r.start_ms).encode(), self._check_ts(r.end_ms, "interval_end_ms"), r)


class _Interval:
    """One interval's reports while it waits for the rest."""

    __slots__ = ("operator", "start", "end", "partitions", "reports")

    def __init__(self, operator: str, start: int, end: int, partitions: int) -> None:
        self.operator, self.start, self.end, self.partitions = operator, start, end, partitions
        self.reports: dict[int, tuple[int, list[tuple[bytes, int]]]] = {}  # partition -> (k, top)

    @property
    def ident(self) -> tuple[str, int, int]:
        return (self.operator, self.start, self.end)

    def to_json(self) -> dict:
        return {"operator": self.operator, "start": self.start, "end": self.end, "partitions": self.partitions,
                "reports": [[p, k, [[base64.b64encode(key).decode("ascii"), est] for key, est in top]]
                            for p, (k, top) in sorted(self.reports.items())]}

    @classmethod
    def from_json(cls, d: dict) -> "_Interval":
        iv = cls(str(d["operator"]), int(d["start"]), int(d["end"]), int(d["partitions"]))
        for p, k, top in d["reports"]:
            iv.reports[int(p)] = (int(k), [(base64.b64decode(key), int(est)) for key, est in top])
        return iv


class GlobalTopKOperator(Operator):
    """Merges per-partition heavy-hitter reports into one global top-k per interval.

    Parameters: ``top_k`` (0: the reports' k; never more than it), ``grace_ms`` (event
    time past an interval's end after which it is emitted without the silent
    partitions), ``max_open_intervals`` (the cap on waiting intervals), ``keyed``
    (the heavy-hitters source is keyed by the counted key), ``source_partitions``
    (the partition count of reports that do not carry one; 0: required in reports).
    Memory: at most ``max_open_intervals`` x partitions x k entries.
    """

    # A report is checked against the interval its first report opened (``validate_event``),
    # which an earlier report of the same batch may have opened: one record at a time.
    validates_against_state = True

    kind = "global_top_k"
    state_keys = ()

    def __init__(self, *, operator_id: str, source_topic: str, partition: int, top_k: int = 0,
                 grace_ms: int = 30_000, max_open_intervals: int = 64, keyed: bool = True,
                 source_partitions: int = 0, codec: EventCodec | None = None, **common: Any) -> None:
        super().__init__(operator_id=operator_id, source_topic=source_topic, partition=partition,
                         codec=codec or ReportCodec(), **common)
        if top_k < 0:
            raise ConfigError("top_k must be >= 0")
        if grace_ms < 0:
            raise ConfigError("grace_ms must be >= 0")
        if max_open_intervals < 1:
            raise ConfigError("max_open_intervals must be >= 1")
        if not 0 <= source_partitions <= MAX_PARTITIONS:
            raise ConfigError(f"source_partitions must be in [0, {MAX_PARTITIONS}]")
        self.top_k = int(top_k)
        self.grace_ms = int(grace_ms)
        self.max_open_intervals = int(max_open_intervals)
        self.keyed = bool(keyed)
        self.source_partitions = int(source_partitions) or None
        self.pending: dict[tuple[str, int, int], _Interval] = {}
        # Intervals emitted while still inside their grace (a copy may yet arrive), and the
        # latest end of those dropped from this set by the cap: both mean "already emitted".
        self.closed: dict[tuple[str, int, int], None] = {}
        self.closed_floor = -1
        self.counters.update(global_reports=0, incomplete=0, reports_duplicate=0, reports_late=0)

    def config_dict(self) -> dict:
        return {"top_k": self.top_k, "grace_ms": self.grace_ms, "max_open_intervals": self.max_open_intervals,
                "keyed": self.keyed, "source_partitions": self.source_partitions or 0}

    def validate_event(self, ev: Event) -> None:
        r: Report = ev.value
        n = r.partitions or self.source_partitions
        if n is None:
            raise BadRecord("report lacks the source partition count ('partitions'); set source_partitions")
        if r.partition >= n:
            raise BadRecord(f"report of partition {r.partition}, but the source has {n} partitions")
        iv = self.pending.get((r.operator, r.start_ms, r.end_ms))
        if iv is not None and iv.partitions != n:
            raise BadRecord(f"report says the source has {n} partitions; the interval's first report "
                            f"said {iv.partitions}")

    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        r: Report = ev.value
        ident = (r.operator, r.start_ms, r.end_ms)
        iv = self.pending.get(ident)
        if iv is None:
            if ident in self.closed or r.end_ms <= self.closed_floor:
                self.counters["reports_duplicate"] += 1
            elif r.end_ms + self.grace_ms <= now_ms:
                self.counters["reports_late"] += 1
            else:
                n = r.partitions or self.source_partitions
                assert n is not None  # validate_event
                iv = self.pending[ident] = _Interval(r.operator, r.start_ms, r.end_ms, n)
        if iv is not None:
            if r.partition in iv.reports:
                self.counters["reports_duplicate"] += 1
            else:
                iv.reports[r.partition] = (r.k, r.top)
                if len(iv.reports) == iv.partitions:
                    self._close(iv, "complete", now_ms, rec, out)
        self._expire(now_ms, rec, out)

    def _expire(self, now_ms: int, rec: SourceRecord, out: list[OutputRecord]) -> None:
        """Close intervals past their grace, then the oldest beyond the cap; forget closed
        intervals whose grace has passed (the late rule covers them from then on)."""
        for iv in sorted((iv for iv in self.pending.values() if iv.end + self.grace_ms <= now_ms),
                         key=lambda iv: (iv.end, iv.start, iv.operator)):
            self._close(iv, "grace", now_ms, rec, out)
        while len(self.pending) > self.max_open_intervals:
            oldest = min(self.pending.values(), key=lambda iv: (iv.end, iv.start, iv.operator))
            self._close(oldest, "capacity", now_ms, rec, out)
        for ident in [i for i in self.closed if i[2] + self.grace_ms <= now_ms]:
            del self.closed[ident]
        while len(self.closed) > self.max_open_intervals:
            ident = min(self.closed, key=lambda i: (i[2], i[1], i[0]))
            del self.closed[ident]
            self.closed_floor = max(self.closed_floor, ident[2])

    def _close(self, iv: _Interval, why: str, now_ms: int, rec: SourceRecord, out: list[OutputRecord]) -> None:
        del self.pending[iv.ident]
        if iv.end + self.grace_ms > now_ms:
            self.closed[iv.ident] = None
        merged = self.merged(iv)
        key = str(iv.start).encode()
        oid = output_id(self.operator_id, rec.partition, rec.offset, "global",
                        f"{iv.operator}\x00{iv.start}\x00{iv.end}".encode())
        report = GlobalTopKReport(oid, self.operator_id, iv.operator, iv.start, iv.end, why, merged, now_ms,
                                  Source.of(rec))
        self.counters["global_reports"] += 1
        if merged.missing:
            self.counters["incomplete"] += 1
        out.append(report.output(key))

    def merge(self, iv: _Interval) -> dict:
        """The merged top-k of one interval's reports, as its JSON fields."""
        return self.merged(iv).body()

    def merged(self, iv: _Interval) -> MergedTopK:
        """The merged top-k of one interval's reports (docs/runtime.md, "Global top-k")."""
        ks = [k for k, _ in iv.reports.values()]
        k = min(ks) if ks else 0
        if self.top_k:
            k = min(k, self.top_k)
        # A partition's floor: what a key it does not list can have at most.
        floors = {p: (top[-1][1] if top and len(top) >= pk else 0) for p, (pk, top) in iv.reports.items()}
        sums: dict[bytes, list] = {}
        for p, (_, top) in sorted(iv.reports.items()):
            for key, est in top:
                s = sums.get(key)
                if s is None:
                    sums[key] = [est, [p]]
                else:
                    s[0] += est
                    s[1].append(p)
        split_any = any(len(s[1]) > 1 for s in sums.values())
        ranked = sorted(sums.items(), key=lambda kv: (-kv[1][0], kv[0]))[:k]
        top = []
        for key, (est, listed) in ranked:
            if not self.keyed or len(listed) > 1:
                top.append(GlobalTopKEntry(key, est, est + sum(f for p, f in floors.items() if p not in listed),
                                           tuple(listed), len(listed) > 1))
            else:
                top.append(GlobalTopKEntry(key, est))
        missing = tuple(p for p in range(iv.partitions) if p not in iv.reports)
        return MergedTopK(k, iv.partitions, missing, not missing, not missing and self.keyed and not split_any,
                          tuple(top), sum(floors.values()) if not self.keyed or split_any else None)

    # -- state --------------------------------------------------------------------------------

    def state_sections(self) -> list[tuple[str, bytes]]:
        state = {"pending": [iv.to_json() for iv in sorted(self.pending.values(),
                                                               key=lambda iv: (iv.end, iv.start, iv.operator))],
                 "closed": sorted([list(i) for i in self.closed], key=lambda i: (i[2], i[1], i[0])),
                 "closed_floor": self.closed_floor}
        return [("intervals", json.dumps(state, separators=(",", ":"), sort_keys=True).encode())]

    def load_sections(self, sections: dict, scalars: dict) -> None:
        try:
            state = json.loads(bytes(sections["intervals"]))
            pending = {iv.ident: iv for iv in map(_Interval.from_json, state["pending"])}
            closed = {(str(o), int(s), int(e)): None for o, s, e in state["closed"]}
            floor = int(state["closed_floor"])
        except (ValueError, TypeError, KeyError, binascii.Error) as exc:
            raise SnapshotError(f"global top-k state is invalid: {exc}") from None
        self.pending, self.closed, self.closed_floor = pending, closed, floor

    def memory_bytes(self) -> int:
        # ~100 bytes per held entry (tuple, key bytes, int, list slot).
        return sum(100 * len(top) for iv in self.pending.values() for _, top in iv.reports.values())
