"""Clocks: where a sketch reads ``now_ms`` when the caller does not pass one.

All time in grudge-stream is integer milliseconds. ``SystemClock`` reads the
wall clock; ``ManualClock`` is set by hand (tests); ``EventClock`` is a
monotone watermark, ``max(seen timestamps)``, for callers that feed a sketch
record timestamps themselves: only their own ``observe(ts)`` calls advance it.
Neither runtime (``grudge_stream.runtime``) nor the replay runner uses or
advances an ``EventClock``: each operator keeps its partition's watermark in
``Operator.watermark`` (``grudge_stream.operators.base``), advances it as it
processes records, and passes it to the sketches as ``now_ms``.
"""
from __future__ import annotations

import math
import threading
import time

__all__ = ["Clock", "SystemClock", "ManualClock", "EventClock", "as_ms"]


def as_ms(value: object, what: str = "now_ms") -> int:
    """Validate and convert a timestamp to int milliseconds (bool, NaN, Inf refused)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer number of milliseconds, not bool")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be finite, got {value!r}")
        return int(value)
    index = getattr(value, "__index__", None)  # numpy integers
    if index is None:
        raise TypeError(f"{what} must be an int (milliseconds), not {type(value).__name__}")
    return int(index())


class Clock:
    """Interface: ``now_ms() -> int``."""

    def now_ms(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError


class SystemClock(Clock):
    """Wall-clock time in milliseconds since the Unix epoch."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock(Clock):
    """A clock that only moves when told to; for tests and simulations."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = as_ms(start_ms, "start_ms")

    def now_ms(self) -> int:
        return self._now

    def set(self, now_ms: int) -> None:
        self._now = as_ms(now_ms)

    def advance(self, delta_ms: int) -> int:
        self._now += as_ms(delta_ms, "delta_ms")
        return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now})"


class EventClock(Clock):
    """A monotone event-time watermark: ``max`` of the timestamps it has observed.

    ``observe(ts)`` returns the watermark after the observation; a late
    timestamp (below the watermark) leaves it unchanged. Thread-safe.
    """

    def __init__(self, start_ms: int = 0) -> None:
        self._wm = as_ms(start_ms, "start_ms")
        self._lock = threading.Lock()

    def observe(self, ts_ms: int) -> int:
        ts = as_ms(ts_ms, "timestamp")
        with self._lock:
            if ts > self._wm:
                self._wm = ts
            return self._wm

    def now_ms(self) -> int:
        return self._wm

    @property
    def watermark(self) -> int:
        return self._wm

    def __repr__(self) -> str:
        return f"EventClock(watermark={self._wm})"


_SYSTEM = SystemClock()


def default_clock() -> Clock:
    return _SYSTEM
