"""Plain record types that cross the operator boundary (no Kafka or Faust types)."""
from __future__ import annotations

import hashlib
from typing import NamedTuple

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
