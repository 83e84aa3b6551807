"""Plain record types that cross the operator boundary (no Kafka or Faust types)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One consumed record, as any runtime hands it to an operator.

    ``timestamp_ms`` is the Kafka record timestamp in integer milliseconds.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One record an operator wants published.

    ``role`` names the topology output it goes to: ``"scores"``,
    ``"decisions"``, ``"alerts"``, ``"reports"``, ``"forward"`` or
    ``"dead_letters"``; the runtime maps roles to topic names.
    """

    role: str
    key: bytes | None
    value: bytes
