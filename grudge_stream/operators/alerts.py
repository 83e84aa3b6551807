"""Alert latches with hysteresis, bounded in memory.

A key is *raised* when its score reaches ``raise_at`` and *cleared* when it
falls to ``clear_at`` or below (``clear_at < raise_at``). The set of raised
keys is per-key state, so it has a fixed ``capacity``: when a raise would
exceed it, the raised keys with the lowest scores (as last seen) are dropped
until the set is at 90% of capacity. A dropped key emits no ``cleared`` alert;
if it is still above ``raise_at`` at its next event it is raised again (with a
new ``alert_id``). ``evictions`` counts the drops, so operators can see an
overflow. Memory is bounded by ``capacity`` keys whatever the attack.
"""
from __future__ import annotations

import struct
from typing import Callable, Iterator

from grudge_stream.exceptions import ConfigError, SnapshotError
from grudge_stream.operators.records import Alert, Source, output_id

_ENTRY = struct.Struct("<dI")

#: Raised keys an alert latch holds at most, unless told otherwise (its ``capacity``).
LATCH_CAPACITY = 100_000


class AlertLatch:
    """The bounded set of currently raised keys, with hysteresis."""

    def __init__(self, raise_at: float, clear_at: float, capacity: int = LATCH_CAPACITY) -> None:
        if not (clear_at < raise_at):
            raise ConfigError(f"clear_at ({clear_at}) must be below raise_at ({raise_at})")
        if capacity < 1:
            raise ConfigError("alert latch capacity must be >= 1")
        self.raise_at = float(raise_at)
        self.clear_at = float(clear_at)
        self.capacity = int(capacity)
        self._raised: dict[bytes, float] = {}
        self.evictions = 0
        # Keys dropped by the last overflow, until the operator drains them (to tombstone them
        # on the alert state topic).
        self.evicted: list[bytes] = []

    def __len__(self) -> int:
        return len(self._raised)

    def __contains__(self, key: bytes) -> bool:
        return key in self._raised

    def keys(self) -> Iterator[bytes]:
        return iter(list(self._raised))

    def observe(self, key: bytes, score: float) -> str | None:
        """Feed one key's current score; return "raised", "cleared" or None."""
        raised = self._raised
        if key in raised:
            if score <= self.clear_at:
                del raised[key]
                return "cleared"
            raised[key] = score
            return None
        if score >= self.raise_at:
            raised[key] = score
            if len(raised) > self.capacity:
                self._shed()
            return "raised"
        return None

    def force(self, key: bytes, score: float) -> str | None:
        """Raise ``key`` whatever its score (a deny override); "raised" if it was not."""
        raised = self._raised
        was = key in raised
        raised[key] = score
        if was:
            return None
        if len(raised) > self.capacity:
            self._shed(protect=key)
        return "raised"

    def remove(self, key: bytes) -> bool:
        """Clear ``key`` whatever its score (an allow override); True if it was raised."""
        return self._raised.pop(key, None) is not None

    def sweep(self, score_of: Callable[[bytes], float],
              keep: Callable[[bytes], bool] | None = None) -> list[tuple[bytes, float]]:
        """Re-read every raised key and clear the ones that decayed to clear_at or below
        (except those ``keep`` says stay raised: denied keys)."""
        cleared = []
        for key in list(self._raised):
            s = score_of(key)
            if s <= self.clear_at and not (keep is not None and keep(key)):
                del self._raised[key]
                cleared.append((key, s))
            else:
                self._raised[key] = s
        return cleared

    def _shed(self, protect: bytes | None = None) -> None:
        keep = (self.capacity * 9) // 10
        drop = len(self._raised) - keep
        # Lowest scores first; ties broken by key bytes so the result is deterministic.
        victims = sorted(((k, s) for k, s in self._raised.items() if k != protect),
                         key=lambda kv: (kv[1], kv[0]))[:drop]
        for k, _ in victims:
            del self._raised[k]
        self.evictions += len(victims)
        self.evicted.extend(k for k, _ in victims)

    # -- state -------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        parts = [struct.pack("<I", len(self._raised))]
        for k, s in self._raised.items():
            parts.append(_ENTRY.pack(s, len(k)))
            parts.append(k)
        return b"".join(parts)

    def load(self, data: bytes) -> None:
        view = memoryview(data)
        (n,) = struct.unpack_from("<I", view, 0)
        pos = 4
        raised: dict[bytes, float] = {}
        for _ in range(n):
            s, klen = _ENTRY.unpack_from(view, pos)
            pos += _ENTRY.size
            raised[bytes(view[pos:pos + klen])] = s
            pos += klen
        if pos != len(view):
            raise SnapshotError("alert latch state has trailing bytes")
        if n > self.capacity:
            # A smaller latch_capacity than the snapshot's (a policy change): keep the highest
            # scores, as an overflow does.
            keep = sorted(raised.items(), key=lambda kv: kv[1], reverse=True)[:self.capacity]
            self.evictions += n - self.capacity
            raised = dict(keep)
        self._raised = raised

    def alert(self, *, operator_id: str, key: bytes, state: str, score: float, event_time_ms: int,
              source: Source, override: str | None = None) -> Alert:
        """The ``Alert`` of a crossing (``override``: raised by a deny entry / cleared by an
        allow entry); its threshold is the one crossed."""
        return Alert(output_id(operator_id, source.partition, source.offset, state, key), operator_id, key,
                     state, score, self.raise_at if state == "raised" else self.clear_at, event_time_ms,
                     source, override)
