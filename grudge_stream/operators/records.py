"""Plain record types that cross the operator boundary (no Kafka or Faust types).

Inputs are ``SourceRecord``; outputs are ``OutputRecord`` (what the runtimes publish),
whose JSON values are built from the typed records below: one immutable named tuple per kind
of output (``Alert``, ``ScoreUpdate``, ``RateDecision``, ``KeyCheck``, ``TopKReport``,
``GlobalTopKReport``, ``DeadLetter``), each with its fields in wire order. ``to_bytes()`` is the compact
JSON of ``body()``; optional fields that are ``None`` stay out of it (docs/runtime.md).
"""
from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, NamedTuple, Protocol

# Named tuples, not dataclasses: a runtime creates one per consumed record, and a tuple is
# several times cheaper to build than a frozen dataclass.


class SourceRecord(NamedTuple):
    """One consumed record, as any runtime hands it to an operator.

    ``timestamp_ms`` is the Kafka record timestamp in integer milliseconds. ``headers``
    (``(name, bytes)`` pairs, None = none) are filled only for operators that declare
    ``needs_headers`` (those that forward records): reading them costs every other
    operator's batch path a Python object per record.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


class OutputRecord(NamedTuple):
    """One record an operator wants published.

    ``role`` names the topology output it goes to: ``"scores"``,
    ``"decisions"``, ``"alerts"``, ``"reports"``, ``"global_reports"``,
    ``"forward"``, ``"checks"`` or ``"dead_letters"``; the runtime maps roles to
    topic names. Every output carries an ``output_id`` (a JSON ``id`` field, or the
    ``grudge-id`` header when the value is a forwarded source value).
    """

    role: str
    key: bytes | None
    value: bytes | None  # None: a tombstone (compacted topics: the key's entry is deleted)
    # Record headers, as (name, bytes) pairs, and the record timestamp; None = no headers and
    # the producer's clock. Forwarded records keep their source's headers and timestamp.
    headers: list[tuple[str, bytes]] | None = None
    timestamp_ms: int | None = None


# The header that carries an output's id on records whose value is not ours to change
# (forwarded records keep the source's bytes): docs/runtime.md, "Output ids".
ID_HEADER = "grudge-id"

# A tick: a record a worker writes into a quiet source partition (``idle_tick_s``) so its
# watermark, and with it the sweep that clears raised keys, moves on without traffic. It
# changes no key; any operator reading it treats it so (docs/runtime.md, "Quiet
# partitions"). The key is no valid public key's by accident: it starts with a NUL byte.
TICK_KEY = b"\x00grudge-stream-tick"
TICK_HEADER = "grudge-tick"


def output_id(operator_id: str, partition: int, offset: int, kind: str, key: bytes) -> str:
    """Deterministic id of one output: the first 128 bits (hex) of SHA-256 over the
    operator, the source partition and offset of the record that produced it, the output's
    kind and a key.

    Replaying the same source records (an at-least-once restart) produces the same outputs
    with the same ids, so a consumer drops copies by id. The kind and key tell apart the
    outputs of one record (a sweep clears several keys; a report catches up several
    intervals). Alert ids are the ids of kind ``raised`` / ``cleared``.
    """
    return hashlib.sha256(f"{operator_id}\x00{partition}\x00{offset}\x00{kind}\x00".encode() + key).hexdigest()[:32]


def with_id_header(headers: list[tuple[str, bytes]] | None, oid: str) -> list[tuple[str, bytes]]:
    """``headers`` plus the output id as ``grudge-id`` (a ``grudge-id`` already there, from
    an upstream grudge-stream stage, is replaced: the id names this output)."""
    kept = [h for h in headers if h[0] != ID_HEADER] if headers else []
    kept.append((ID_HEADER, oid.encode("ascii")))
    return kept


# ---- typed output records -------------------------------------------------------------------


def key_fields(key: bytes) -> dict:
    """JSON fields that carry a key: ``key`` as text when it is UTF-8, else ``key_b64``."""
    try:
        return {"key": key.decode("utf-8")}
    except UnicodeDecodeError:
        return {"key": None, "key_b64": base64.b64encode(key).decode("ascii")}


# One compact encoder, built once: json.dumps with separators builds a new one per call.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


class Source(NamedTuple):
    """Where an output comes from: the source record that produced it (or made a timer due)."""

    topic: str
    partition: int
    offset: int

    @classmethod
    def of(cls, rec: SourceRecord) -> "Source":
        return tuple.__new__(cls, rec[:3])  # SourceRecord starts with topic, partition, offset

    def body(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}


def _to_bytes(self: Any) -> bytes:
    """The record's value on the wire: compact JSON of ``body()``, byte for byte
    ``json.dumps(body, separators=(",", ":")).encode()``."""
    return _ENCODE(self.body()).encode()


def _output(self: Any, key: bytes | None, headers: list[tuple[str, bytes]] | None = None,
            timestamp_ms: int | None = None, role: str | None = None) -> OutputRecord:
    """The ``OutputRecord`` the runtimes publish (``role``: another role than the record's)."""
    return OutputRecord(role or self.role, key, _ENCODE(self.body()).encode(), headers, timestamp_ms)


class TypedRecord(Protocol):
    """What every typed output record offers: its ``role``, ``body()`` (the JSON fields in
    wire order), ``to_bytes()`` and ``output(key, ...)``. The records are named tuples
    (immutable, typed, and several times cheaper to build than frozen dataclasses: a rate
    limiter emits one per request); ``to_bytes``/``output`` are shared functions."""

    role: str

    def body(self) -> dict: ...

    def to_bytes(self) -> bytes: ...

    def output(self, key: bytes | None, headers: list[tuple[str, bytes]] | None = None,
               timestamp_ms: int | None = None, role: str | None = None) -> OutputRecord: ...


class Alert(NamedTuple):
    """A key raised (its score reached ``threshold`` = raise_at) or cleared (fell to
    ``threshold`` = clear_at); ``override``: ``deny`` / ``allow`` when a manual entry did it."""

    role = "alerts"  # the OutputRecord role (not a field)
    to_bytes = _to_bytes
    output = _output
    alert_id: str
    operator: str
    key: bytes
    state: str
    score: float
    threshold: float
    event_time_ms: int
    source: Source
    override: str | None = None

    def body(self) -> dict:
        body = {"alert_id": self.alert_id, "operator": self.operator, **key_fields(self.key),
                "state": self.state, "score": self.score, "threshold": self.threshold,
                "event_time_ms": self.event_time_ms, "source": self.source.body()}
        if self.override is not None:
            body["override"] = self.override
        return body


class ScoreUpdate(NamedTuple):
    """A key's score after an event; ``crossing``: ``raised`` / ``cleared`` when it crossed."""

    role = "scores"  # the OutputRecord role (not a field)
    to_bytes = _to_bytes
    output = _output
    id: str
    operator: str
    key: bytes
    score: float
    event_time_ms: int
    source: Source
    crossing: str | None = None

    def body(self) -> dict:
        body = {"id": self.id, "operator": self.operator, **key_fields(self.key), "score": self.score,
                "event_time_ms": self.event_time_ms, "source": self.source.body()}
        if self.crossing is not None:
            body["crossing"] = self.crossing
        return body


class RequestId(NamedTuple):
    """A request's id as a decision echoes it: ``request_id`` (text, an integer or None),
    ``request_id_b64`` for bytes that are not UTF-8, ``request_id_sha256`` and
    ``request_id_bytes`` for an id too long to echo."""

    request_id: str | int | None = None
    request_id_b64: str | None = None
    request_id_sha256: str | None = None
    request_id_bytes: int | None = None

    def body(self) -> dict:
        body: dict[str, Any] = {"request_id": self.request_id}
        if self.request_id_b64 is not None:
            body["request_id_b64"] = self.request_id_b64
        if self.request_id_sha256 is not None:
            body["request_id_sha256"] = self.request_id_sha256
            body["request_id_bytes"] = self.request_id_bytes
        return body


class RateDecision(NamedTuple):
    """A rate-limit decision: ``allowed``, and for a denial the ``retry_after_ms`` after
    which the same request would be admitted (None: never, or until an override ends)."""

    role = "decisions"  # the OutputRecord role (not a field)
    to_bytes = _to_bytes
    output = _output
    id: str
    operator: str
    key: bytes
    request: RequestId
    allowed: bool
    retry_after_ms: int | None
    cost: float
    event_time_ms: int
    source: Source
    override: str | None = None

    def body(self) -> dict:
        body = {"id": self.id, "operator": self.operator, **key_fields(self.key), **self.request.body(),
                "allowed": self.allowed, "retry_after_ms": self.retry_after_ms, "cost": self.cost,
                "event_time_ms": self.event_time_ms, "source": self.source.body()}
        if self.override is not None:
            body["override"] = self.override
        return body


class KeyCheck(NamedTuple):
    """A request to a backend to check a key the known-key cache does not hold."""

    role = "checks"  # the OutputRecord role (not a field)
    to_bytes = _to_bytes
    output = _output
    id: str
    operator: str
    key: bytes
    event_time_ms: int
    source: Source

    def body(self) -> dict:
        return {"id": self.id, "operator": self.operator, **key_fields(self.key),
                "event_time_ms": self.event_time_ms, "source": self.source.body()}


class TopKEntry(NamedTuple):
    """One key of a top-k report and its (count-min upper bound) estimate."""

    key: bytes
    estimate: int

    def body(self) -> dict:
        return {**key_fields(self.key), "estimate": self.estimate}


class TopKReport(NamedTuple):
    """One source partition's top-k at the end of a report interval (heavy hitters)."""

    role = "reports"  # the OutputRecord role (not a field)
    to_bytes = _to_bytes
    output = _output
    id: str
    operator: str
    partition: int
    partitions: int | None
    interval_start_ms: int
    interval_end_ms: int
    event_time_ms: int
    k: int
    top: tuple[TopKEntry, ...]
    source: Source

    def body(self) -> dict:
        return {"id": self.id, "operator": self.operator, "partition": self.partition,
                "partitions": self.partitions, "interval_start_ms": self.interval_start_ms,
                "interval_end_ms": self.interval_end_ms, "event_time_ms": self.event_time_ms, "k": self.k,
                "top": [e.body() for e in self.top], "source": self.source.body()}


class GlobalTopKEntry(NamedTuple):
    """A key of a global top-k: ``estimate`` sums the partitions that list it; for a split
    key (or an unkeyed source) ``estimate_max`` bounds its count and ``partitions`` lists
    those partitions (``split``: more than one)."""

    key: bytes
    estimate: int
    estimate_max: int | None = None
    partitions: tuple[int, ...] | None = None
    split: bool = False

    def body(self) -> dict:
        body: dict[str, Any] = {**key_fields(self.key), "estimate": self.estimate}
        if self.estimate_max is not None:
            body["estimate_max"] = self.estimate_max
            body["partitions"] = list(self.partitions or ())
            if self.split:
                body["split"] = True
        return body


class MergedTopK(NamedTuple):
    """The merge of one interval's per-partition reports (operators/globaltopk.py)."""

    k: int
    partitions: int
    missing: tuple[int, ...]
    complete: bool
    exact: bool
    top: tuple[GlobalTopKEntry, ...]
    unlisted_max: int | None = None

    def body(self) -> dict:
        body: dict[str, Any] = {"k": self.k, "partitions": self.partitions, "missing": list(self.missing),
                                "complete": self.complete, "exact": self.exact,
                                "top": [e.body() for e in self.top]}
        if self.unlisted_max is not None:
            body["unlisted_max"] = self.unlisted_max
        return body


class GlobalTopKReport(NamedTuple):
    """One global top-k over every source partition's report of an interval; ``closed_by``:
    ``complete``, ``grace`` or ``capacity``."""

    role = "global_reports"  # the OutputRecord role (not a field)
    to_bytes = _to_bytes
    output = _output
    id: str
    operator: str
    source_operator: str
    interval_start_ms: int
    interval_end_ms: int
    closed_by: str
    merged: MergedTopK
    event_time_ms: int
    source: Source

    def body(self) -> dict:
        return {"id": self.id, "operator": self.operator, "source_operator": self.source_operator,
                "interval_start_ms": self.interval_start_ms, "interval_end_ms": self.interval_end_ms,
                "closed_by": self.closed_by, **self.merged.body(), "event_time_ms": self.event_time_ms,
                "source": self.source.body()}


class CutBytes(NamedTuple):
    """A dead letter's copy of a key or value: base64 of (a prefix of) the bytes; ``size``
    and ``sha256`` of the whole when it had to be cut. ``b64=None``: there were none."""

    b64: str | None
    size: int | None = None
    sha256: str | None = None

    def fields(self, name: str) -> dict:
        body: dict[str, Any] = {name + "_b64": self.b64}
        if self.size is not None:
            body[name + "_bytes"] = self.size
            body[name + "_sha256"] = self.sha256
            body[name + "_truncated"] = True
        return body


class DeadLetter(NamedTuple):
    """A record that could not be processed (or an output that could not be delivered):
    the ``reason``, where it came from (``source``: topic, partition, offset and record
    timestamp; None for an undeliverable output), ``extra`` fields, and the original key
    and value (``operators.deadletters.dead_letter_record`` cuts them to fit the topic)."""

    role = "dead_letters"  # the OutputRecord role (not a field)
    to_bytes = _to_bytes
    output = _output
    id: str
    reason: str
    operator: str
    source: dict | None
    extra: dict | None = None
    key: CutBytes | None = None
    value: CutBytes | None = None

    def body(self) -> dict:
        body: dict[str, Any] = {"id": self.id, "reason": self.reason, "operator": self.operator,
                                "source": self.source}
        if self.extra:
            body.update(self.extra)
        if self.key is not None:
            body.update(self.key.fields("key"))
        if self.value is not None:
            body.update(self.value.fields("value"))
        return body


def group_by_partition(msgs: list) -> tuple[dict[int, list], list]:
    """Consumed confluent-kafka messages -> ({partition: [message]}, errors), in consume order."""
    out: dict[int, list] = {}
    errors = []
    for m in msgs:
        if m.error() is not None:
            errors.append(m)
            continue
        p = m.partition()
        chunk = out.get(p)
        if chunk is None:
            chunk = out[p] = []
        chunk.append(m)
    return out, errors


def group_headed_columns(msgs: list) -> tuple[dict[int, tuple], list]:
    """Consumed confluent-kafka messages -> ({partition: (offsets, timestamps, keys, values,
    headers, timestamp types)}, errors): the shape the native ingest path gives a stage that
    forwards records (``grudge_stream.runtime.loop.HEADED``)."""
    groups, errors = group_by_partition(msgs)
    out: dict[int, tuple] = {}
    for p, chunk in groups.items():
        offs, tss, keys, vals, hdrs, types = [], [], [], [], [], []
        for m in chunk:
            t, ts = m.timestamp()
            offs.append(m.offset())
            tss.append(ts)
            keys.append(m.key())
            vals.append(m.value())
            hdrs.append(m.headers())
            types.append(t)
        out[p] = (offs, tss, keys, vals, hdrs, types)
    return out, errors


def group_source_records(topic: str, msgs: list) -> tuple[dict[int, list[SourceRecord]], list]:
    """Consumed confluent-kafka messages -> ({partition: [SourceRecord with headers]}, errors): the
    record path of operators that declare ``needs_headers`` (``group_messages`` gives the
    header-free columns every other operator reads)."""
    groups, errors = group_by_partition(msgs)
    return {p: [SourceRecord(topic, p, m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers() or None)
                for m in chunk] for p, chunk in groups.items()}, errors
