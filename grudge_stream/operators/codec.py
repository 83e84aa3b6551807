"""Decoding source records into events, validated at the edge.

A topology maps fields to meaning: the entity key (default: the Kafka record
key), the value (delta, cost, outcome or weight) and the event timestamp
(default: the Kafka record timestamp). A record that cannot be decoded raises
``BadRecord`` with a reason; operators turn it into a dead letter and never
touch a sketch with it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, NamedTuple

from grudge_stream.exceptions import ConfigError

# The limits and dead-letter reasons this decoder shares with the batch path's compiled
# loop (cyext/_ingest.pyx). Timestamps outside [0, 2**53) ms are refused: they cannot be
# real event times and would not survive a round trip through a float.
from grudge_stream.record_checks import (
    EMPTY_KEY,
    MAX_TIMESTAMP_MS,
    NO_KEY,
    NO_VALUE,
    key_too_long,
    timestamp_out_of_range,
)

CACHE_MAX_VALUE_BYTES = 256
CACHE_MAX_ENTRIES = 65_536


class BadRecord(Exception):
    """A record that must go to the dead-letter topic; ``str(exc)`` is the reason."""


class Event(NamedTuple):
    key: bytes
    ts_ms: int
    value: Any  # a float weight/delta/cost, or an outcome string before mapping


@dataclass(frozen=True)
class EventCodec:
    """How a topology reads its events.

    - ``encoding``: ``"json"`` (a UTF-8 JSON object) or ``"raw"`` (the key only,
      value 1).
    - ``key_field``: JSON field holding the entity key; ``None`` = the record key.
    - ``value_field``: JSON field holding the number or outcome; ``None`` = 1.
    - ``time_field``: JSON field holding the event time in ms; ``None`` = the
      record timestamp.
    - ``outcomes``: map from outcome strings to numbers (``{"bad": 0.04, "good":
      -0.001}``); when set, the value field must be one of its keys, or a number
      if ``allow_numbers`` is true.
    - ``max_key_bytes``: longer keys are dead-lettered (0 = no limit).
    - ``allow_empty_keys``: an empty key (``b""``) is dead-lettered unless this is true:
      every empty-keyed producer would otherwise share one key's state.
    """

    # Whether decoded values are floats (the column pipeline keeps them in an array and
    # weighs late ones); a codec whose values are other objects says False.
    numeric_values: ClassVar[bool] = True

    encoding: str = "json"
    key_field: str | None = None
    value_field: str | None = "value"
    time_field: str | None = None
    outcomes: Mapping[str, float] | None = None
    allow_numbers: bool = True
    max_key_bytes: int = 0
    allow_empty_keys: bool = False
    _outcome_map: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # value bytes -> decoded value (float) or BadRecord reason (str), for codecs whose result
    # depends on the value bytes alone (key and time from the record): payloads repeat a lot.
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.encoding not in ("json", "raw"):
            raise ConfigError(f"encoding must be 'json' or 'raw', not {self.encoding!r}")
        if self.outcomes:
            for name, v in self.outcomes.items():
                if not isinstance(name, str) or not _finite_number(v):
                    raise ConfigError(f"outcome {name!r} must map a string to a finite number, got {v!r}")
            self._outcome_map.update({k: float(v) for k, v in self.outcomes.items()})

    def to_dict(self) -> dict:
        return {
            "encoding": self.encoding,
            "key_field": self.key_field,
            "value_field": self.value_field,
            "time_field": self.time_field,
            "outcomes": dict(sorted(self.outcomes.items())) if self.outcomes else None,
            "allow_numbers": self.allow_numbers,
            "max_key_bytes": self.max_key_bytes,
            "allow_empty_keys": self.allow_empty_keys,
        }

    def decode(self, key: bytes | None, value: bytes | None, record_ts_ms: int) -> Event:
        """Decode one record or raise BadRecord(reason)."""
        if self.encoding == "raw":
            if key is None and value is None:
                raise BadRecord("raw record has neither key nor value")
            k = key if key is not None else value
            return Event(self._check_key(k), self._check_ts(record_ts_ms, "record timestamp"), 1.0)
        if value is None:
            raise BadRecord(NO_VALUE)
        if self.key_field is None and self.time_field is None:
            cached = self._cache.get(value)
            if cached is None:
                try:
                    cached = self._decode_value(value)
                except BadRecord as exc:
                    cached = str(exc)
                if len(value) <= CACHE_MAX_VALUE_BYTES and len(self._cache) < CACHE_MAX_ENTRIES:
                    self._cache[value] = cached
            if cached.__class__ is str:
                raise BadRecord(cached)
            if key is None:
                raise BadRecord(NO_KEY)
            return Event(self._check_key(key), self._check_ts(record_ts_ms, "record timestamp"), cached)
        obj = _json_object(value)
        if self.key_field is None:
            if key is None:
                raise BadRecord(NO_KEY)
            k = key
        else:
            kv = obj.get(self.key_field)
            if isinstance(kv, str):
                k = kv.encode("utf-8")
            elif isinstance(kv, int) and not isinstance(kv, bool):
                k = str(kv).encode()
            elif kv is None:
                raise BadRecord(f"missing key field {self.key_field!r}")
            else:
                raise BadRecord(f"key field {self.key_field!r} must be a string, got {type(kv).__name__}")
        if self.time_field is None:
            ts = self._check_ts(record_ts_ms, "record timestamp")
        else:
            tv = obj.get(self.time_field)
            if tv is None:
                raise BadRecord(f"missing time field {self.time_field!r}")
            if isinstance(tv, bool) or not isinstance(tv, (int, float)):
                raise BadRecord(f"time field {self.time_field!r} must be a number of ms, got {type(tv).__name__}")
            if isinstance(tv, float) and not math.isfinite(tv):
                raise BadRecord(f"time field {self.time_field!r} is not finite")
            ts = self._check_ts(int(tv), f"time field {self.time_field!r}")
        return Event(self._check_key(k), ts, self._value(obj))

    def check_event(self, key: bytes, value: Any, ts_ms: int) -> Any:
        """The meaning of an event its caller decoded (embedded state): ``value`` read as the
        value field would be, the key and time checked as a record's; raises BadRecord."""
        self._check_key(key)
        self._check_ts(ts_ms, "timestamp_ms")
        if self.encoding == "raw":
            return 1.0
        return self._value({} if value is None or self.value_field is None else {self.value_field: value})

    @property
    def value_only(self) -> bool:
        """True when a record's meaning depends on its value bytes alone (key and time come
        from the record): such payloads are decoded once and cached, and batch paths apply."""
        return self.encoding == "json" and self.key_field is None and self.time_field is None

    def decode_value_or_reason(self, value: bytes):
        """The decoded value (float), or the dead-letter reason (str)."""
        try:
            return self._decode_value(value)
        except BadRecord as exc:
            return str(exc)

    def _decode_value(self, value: bytes) -> float:
        return self._value(_json_object(value))

    def _value(self, obj: dict) -> float:
        if self.value_field is None:
            return 1.0
        if self.value_field not in obj:
            raise BadRecord(f"missing value field {self.value_field!r}")
        v = obj[self.value_field]
        if isinstance(v, str):
            if self._outcome_map:
                try:
                    return self._outcome_map[v]
                except KeyError:
                    raise BadRecord(
                        f"unknown outcome {v!r} (expected one of {sorted(self._outcome_map)})"
                    ) from None
            raise BadRecord(f"value field {self.value_field!r} must be a number, got a string")
        if self._outcome_map and not self.allow_numbers:
            raise BadRecord(f"value field {self.value_field!r} must be an outcome string")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadRecord(f"value field {self.value_field!r} must be a number, got {type(v).__name__}")
        fv = float(v)
        if not math.isfinite(fv):
            raise BadRecord(f"value field {self.value_field!r} is not finite ({v!r})")
        return fv

    def _check_key(self, k: bytes) -> bytes:
        if not k and not self.allow_empty_keys:
            raise BadRecord(EMPTY_KEY)
        if self.max_key_bytes and len(k) > self.max_key_bytes:
            raise BadRecord(key_too_long(len(k), self.max_key_bytes))
        return k

    @staticmethod
    def _check_ts(ts: int, what: str) -> int:
        if ts < 0 or ts > MAX_TIMESTAMP_MS:
            raise BadRecord(timestamp_out_of_range(what, ts))
        return ts


def _finite_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _json_object(value: bytes) -> dict:
    """A payload parsed as a JSON object, or ``BadRecord`` saying why it is not one."""
    try:
        obj = json.loads(value)
    except UnicodeDecodeError:
        raise BadRecord("value is not UTF-8") from None
    except ValueError as exc:
        raise BadRecord(f"value is not JSON: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise BadRecord(f"value must be a JSON object, got {type(obj).__name__}")
    return obj
