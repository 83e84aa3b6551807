"""Resolving ``--from`` / ``--to`` positions to per-partition offsets.

Accepted forms:

- ``earliest`` — the partition's first retained offset;
- ``now`` (or ``latest``) — the partition's end offset when the command starts;
- an integer ``N`` — offset N in every partition (clamped to the retained range);
- ``@MS`` — a timestamp in epoch milliseconds;
- an ISO-8601 date-time (``2026-11-29T10:00:00Z``; no zone means UTC).

A timestamp resolves, per partition, with ``offsets_for_times`` to the first
offset whose record timestamp is at or after it (the end offset when there is
none). A range ``[from, to)`` therefore selects the records with
``from <= timestamp < to`` in every partition whose timestamps do not go
backwards (CreateTime topics written in time order, or LogAppendTime topics).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from confluent_kafka import Consumer, TopicPartition

from grudge_stream.checkpoint import watermarks
from grudge_stream.exceptions import ConfigError


@dataclass(frozen=True)
class Position:
    kind: str  # "earliest", "now", "offset", "time"
    value: int = 0

    def describe(self) -> str:
        if self.kind in ("earliest", "now"):
            return self.kind
        if self.kind == "offset":
            return f"offset {self.value}"
        return datetime.fromtimestamp(self.value / 1000, tz=timezone.utc).isoformat()


_DIGITS = re.compile(r"[0-9]+")
_FRACTION = re.compile(r"T\d\d:\d\d:\d\d\.(\d+)")


def _iso_for_python(t: str) -> str:
    """Python 3.10's ``fromisoformat`` reads fractions of exactly 3 or 6 digits: pad or cut
    any other (``.5`` is ``.500000``; ISO 8601 allows any number of digits)."""
    m = _FRACTION.search(t)
    if m is None:
        return t
    return t[:m.start(1)] + (m.group(1) + "000000")[:6] + t[m.end(1):]


def parse_position(text: str) -> Position:
    t = text.strip()
    if t in ("earliest", "beginning"):
        return Position("earliest")
    if t in ("now", "latest", "end"):
        return Position("now")
    if t.startswith("@"):
        # ASCII digits only: int() would also take "1_000", " 5" and other scripts' digits, and a
        # negative time is one of Kafka's special values (-1 latest, -2 earliest) in a time lookup.
        if not _DIGITS.fullmatch(t[1:]):
            raise ConfigError(f"bad timestamp {text!r}: expected @<epoch milliseconds>, digits only")
        return Position("time", int(t[1:]))
    if _DIGITS.fullmatch(t.lstrip("-")) and len(t) - len(t.lstrip("-")) <= 1:
        n = int(t)
        if n < 0:
            raise ConfigError(f"bad offset {text!r}: offsets are >= 0")
        return Position("offset", n)
    try:
        dt = datetime.fromisoformat(_iso_for_python(t.replace("Z", "+00:00")))
    except ValueError:
        raise ConfigError(
            f"bad position {text!r}: expected earliest, now, an offset, @<epoch ms> or an ISO-8601 time"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    ms = int(dt.timestamp() * 1000)
    if ms < 0:
        raise ConfigError(f"bad position {text!r}: a time before 1970 (epoch milliseconds are >= 0)")
    return Position("time", ms)


def resolve(consumer: Consumer, topic: str, partitions: list[int], pos: Position,
            timeout: float = 30.0) -> dict[int, int]:
    """Offsets of ``pos`` in each partition."""
    marks = {p: watermarks(consumer, TopicPartition(topic, p), timeout) for p in partitions}
    if pos.kind == "earliest":
        return {p: lo for p, (lo, _) in marks.items()}
    if pos.kind == "now":
        return {p: hi for p, (_, hi) in marks.items()}
    if pos.kind == "offset":
        return {p: min(max(pos.value, lo), hi) for p, (lo, hi) in marks.items()}
    found = consumer.offsets_for_times([TopicPartition(topic, p, pos.value) for p in partitions],
                                       timeout=timeout)
    out = {}
    for tp in found:
        if tp.error is not None:
            raise ConfigError(f"cannot resolve {pos.describe()} in {topic}[{tp.partition}]: {tp.error}")
        out[tp.partition] = tp.offset if tp.offset >= 0 else marks[tp.partition][1]
    return out


def topic_partitions(consumer: Consumer, topic: str, timeout: float = 30.0) -> list[int]:
    md = consumer.list_topics(topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        raise ConfigError(f"topic {topic!r} does not exist (or has no partitions)")
    return sorted(t.partitions)
