"""Live queries ahead of the batch consume loop, within a share of its time."""
from __future__ import annotations

import threading
import time
from typing import Any

from grudge_stream.exceptions import ConfigError

# -- queries before processing ------------------------------------------------------------------------

class QueryGate:
    """Live queries ahead of processing, within a share of the time.

    In the batch runtime a query is answered by a request thread of the same interpreter as
    the consume loop: on a busy worker the two take turns with the interpreter lock, every
    switch interval and at every socket wait, so a request of a few milliseconds of work
    takes several times that, and its tail follows the loop's longest stretches. The request
    threads hold the gate (``serving()``) while they answer; the loop calls
    ``yield_to_queries()`` before each partition of a batch, and while a request is in
    flight it waits there (holding no slot lock, not the interpreter lock) until the
    requests are done. It waits at most ``share`` of the time (a bucket of pause time
    refilled at ``share`` seconds a second, at most ``MAX_PAUSE_S`` in one go), so a flood
    of queries slows processing by that share at most; ``share`` 0: never waits."""

    MAX_PAUSE_S = 0.05

    def __init__(self, share: float, metrics: Any = None) -> None:
        if not 0.0 <= share <= 1.0:
            raise ConfigError(f"query_priority_share must be between 0 and 1, not {share!r}")
        self.share = float(share)
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._tokens = self.MAX_PAUSE_S
        self._refilled = time.monotonic()
        self.paused_s = 0.0  # the loop's waits so far
        self.metrics = metrics

    def serving(self) -> "_Serving":
        """A request in flight (a context manager) while its thread answers it."""
        return _Serving(self)

    def _enter(self) -> None:
        with self._cond:
            self._active += 1

    def _exit(self) -> None:
        with self._cond:
            self._active -= 1
            if not self._active:
                self._cond.notify_all()

    def yield_to_queries(self) -> float:
        """The loop: while requests are in flight, wait for them within the share; the seconds waited."""
        if not self._active or not self.share:
            return 0.0
        now = time.monotonic()
        self._tokens = min(self.MAX_PAUSE_S, self._tokens + (now - self._refilled) * self.share)
        self._refilled = now
        if self._tokens <= 0.0:
            return 0.0
        with self._cond:
            self._cond.wait_for(lambda: not self._active, self._tokens)
        waited = time.monotonic() - now
        self._tokens -= waited
        self.paused_s += waited
        if self.metrics is not None:
            self.metrics.query_priority_paused.inc(waited)
        return waited


class _Serving:
    __slots__ = ("gate",)

    def __init__(self, gate: QueryGate) -> None:
        self.gate = gate

    def __enter__(self) -> None:
        self.gate._enter()

    def __exit__(self, *exc: Any) -> None:
        self.gate._exit()
