"""Liveness: is the worker's processing loop making progress? (``GET /live``)

``/metrics`` and ``/ready`` answer from their own thread (batch runtime) or task
(Faust) whatever the processing loop does, so they cannot tell a wedged worker
from a healthy one. ``/live`` can: the runtimes call :meth:`Liveness.beat` at
every step that shows progress, and ``/live`` fails (503) once the last beat is
older than ``liveness_timeout_s`` (default 60 s).

What beats:

- every iteration of the processing loop: the batch runtime's ``consume()`` loop
  (it returns at least every ``batch_max_wait_ms``, records or not), the Faust
  consumer's fetch loop (``_wait_next_records``: at least every second while the
  flow is active);
- a checkpoint round that waits for outputs during a broker outage: the output
  flush retries and logs every second, and beats each time — an outage is not
  cured by a restart, and the round goes on once the broker is back;
- restores, once per partition (before and after), so a rebalance that restores
  many partitions counts as progress.

A background stage of the worker (the repartition stage, ``grudge_stream.repartition``)
has its own ``Liveness``, attached with :meth:`Liveness.watch`: ``/live`` then fails when
any of them made no progress for its timeout, and names each part's age.

What does not: a loop blocked in one call (a deadlock, a hung client call), a
Faust rebalance that never completes (the flow stays stopped), a snapshot write
or a restore of one partition longer than the timeout. Keep ``liveness_timeout_s``
above the longest of those that is legitimate: the snapshot topic's flush
timeout (30 s) and, with ``exactly_once``, ``open_transaction_wait_s``.

Thread-safe without a lock: a beat is one float assignment (atomic under the GIL)
and a reader only compares it with the clock.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from grudge_stream.exceptions import ConfigError

DEFAULT_TIMEOUT_S = 60.0


class Liveness:
    __slots__ = ("timeout_s", "_last", "_clock", "_parts")

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not timeout_s > 0:
            raise ConfigError(f"setting 'liveness_timeout_s' must be > 0, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self._last = clock()
        self._parts: dict[str, Liveness] = {}

    def watch(self, name: str, part: "Liveness") -> None:
        """Make ``/live`` depend on ``part`` too (a background stage's own progress)."""
        self._parts[name] = part

    @classmethod
    def from_settings(cls, settings) -> "Liveness":
        """The liveness of a ``Group`` section (or of the ``Settings`` it is read from)."""
        from grudge_stream.sections import Group, as_section

        return cls(as_section(Group, settings).liveness_timeout_s)

    def beat(self) -> None:
        self._last = self._clock()

    def age(self) -> float:
        """Seconds since the last beat."""
        return max(0.0, self._clock() - self._last)

    @property
    def alive(self) -> bool:
        return self.age() <= self.timeout_s

    def beating(self, should_stop: Callable[[], bool]) -> Callable[[], bool]:
        """``should_stop`` that also beats: handed to the output flush, which calls it about
        once a second while it waits (and logs why)."""
        def check() -> bool:
            self._last = self._clock()
            return should_stop()
        return check

    def status(self) -> tuple[int, dict]:
        """HTTP status (200 or 503) and JSON body of ``/live``."""
        age = self.age()
        alive = age <= self.timeout_s
        body: dict = {"live": alive, "last_progress_s": round(age, 3), "timeout_s": self.timeout_s}
        if self._parts:
            parts = {}
            for name, part in self._parts.items():
                page = part.age()
                parts[name] = {"live": page <= part.timeout_s, "last_progress_s": round(page, 3)}
                alive = alive and page <= part.timeout_s
            body["live"] = alive
            body["parts"] = parts
        return (200 if alive else 503), body


class GroupProgress(Liveness):
    """``/live``'s watch on a member that holds no partition: legitimate when the group has
    more members than partitions and the others consume, a zombie when nobody does.

    The consume loop calls :meth:`tick` every turn. While the member holds partitions it
    beats. While it holds none, ``position()`` (blocking: the group's committed offsets and
    the source's log end offsets, each summed over the source's partitions, or None when
    the cluster does not answer) is asked in the background every ``interval_s``, and it
    beats when the group's committed offsets moved (another member consumes) or the log end
    did not (nothing to consume), or the cluster did not answer (an outage is not cured by
    a restart). So it stops beating only while records arrive, the group commits none of
    them, and this member holds nothing: after ``timeout_s`` of that, ``/live`` fails and
    the orchestrator restarts the member, which rejoins the group."""

    __slots__ = ("interval_s", "_position", "_seen", "_asked", "_running")

    def __init__(self, timeout_s: float, position: Callable[[], "tuple[int, int] | None"],
                 interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(timeout_s, clock)
        self.interval_s = interval_s
        self._position = position
        self._seen: tuple[int, int] | None = None
        self._asked = float("-inf")
        self._running = False

    def tick(self, holding: bool) -> None:
        if holding:
            self._seen = None
            self.beat()
            return
        now = self._clock()
        if self._running or now - self._asked < self.interval_s:
            return
        self._asked, self._running = now, True
        threading.Thread(target=self._probe, name="grudge-group-progress", daemon=True).start()

    def _probe(self) -> None:
        try:
            try:
                pos = self._position()
            except Exception:  # noqa: BLE001 - the cluster did not answer: not this member's fault
                pos = None
            self.observe(pos)
        finally:
            self._running = False

    def observe(self, pos: "tuple[int, int] | None") -> None:
        """One answer of ``position()``: (committed, log end) summed, or None."""
        seen, self._seen = self._seen, pos
        if pos is None or seen is None or pos[0] != seen[0] or pos[1] <= seen[1]:
            self.beat()


class RecoveryStall:
    """Notices a changelog recovery that stopped moving (a Faust app's Table recovery).

    Fed every few seconds with whether a recovery runs and, per changelog partition it
    reads, ``(have, need)``: the offset read so far and the one it must reach. Reports the
    partitions still short of their offset once no partition's read offset has moved for
    ``stall_s`` while a recovery runs, then again after every further ``stall_s`` without
    a move. A slow recovery that moves never counts, however long it takes."""

    def __init__(self, stall_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not stall_s > 0:
            raise ConfigError(f"recovery_stall_s: must be > 0, got {stall_s!r}")
        self.stall_s = float(stall_s)
        self.clock = clock
        self._offsets: dict | None = None
        self._since = 0.0
        self.stalls = 0

    def observe(self, recovering: bool, progress: dict) -> list | None:
        """The partitions (sorted ``(partition, (have, need))``) of a stalled recovery, or None."""
        now = self.clock()
        short = {tp: hn for tp, hn in progress.items()
                 if hn[1] is not None and (hn[0] if hn[0] is not None else -1) < hn[1]}
        if not recovering or not short:
            self._offsets = None
            return None
        offsets = {tp: hn[0] for tp, hn in progress.items()}
        if offsets != self._offsets:
            self._offsets, self._since = offsets, now
            return None
        if now - self._since < self.stall_s:
            return None
        self._since = now
        self.stalls += 1
        return sorted(short.items(), key=lambda kv: (str(kv[0]), kv[1]))
