"""Plain record types that cross the operator boundary (no Kafka or Faust types)."""
from __future__ import annotations

from typing import NamedTuple

# Named tuples, not dataclasses: a runtime creates one per consumed record, and a tuple is
# several times cheaper to build than a frozen dataclass.


class SourceRecord(NamedTuple):
    """One consumed record, as any runtime hands it to an operator.

    ``timestamp_ms`` is the Kafka record timestamp in integer milliseconds.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


class OutputRecord(NamedTuple):
    """One record an operator wants published.

    ``role`` names the topology output it goes to: ``"scores"``,
    ``"decisions"``, ``"alerts"``, ``"reports"``, ``"forward"`` or
    ``"dead_letters"``; the runtime maps roles to topic names.
    """

    role: str
    key: bytes | None
    value: bytes
