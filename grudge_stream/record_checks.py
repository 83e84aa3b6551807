"""The per-record checks both decoders apply, and their messages, in one place.

``operators/codec.py`` checks one record in Python; the batch path's compiled loop
(``cyext/_ingest.pyx``) checks a column of them. Both take the limits and the
dead-letter reasons from here. Pure Python with no grudge_stream imports, so the
kernels can use it without importing the operators.
"""

from __future__ import annotations

MAX_TIMESTAMP_MS = 2**53 - 1
"""Timestamps outside ``[0, 2**53)`` ms are refused (they do not round-trip through JSON doubles)."""

NO_VALUE = "record has no value (tombstone)"
NO_KEY = "record has no key"
EMPTY_KEY = "empty key (allow_empty_keys is off)"


def key_too_long(n: int, limit: int) -> str:
    return f"key is {n} bytes, over the limit of {limit}"


def timestamp_out_of_range(what: str, ts: int) -> str:
    return f"{what} {ts} is out of range [0, 2**53)"
