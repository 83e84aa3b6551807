"""The partition slots of one worker (``PartitionSlots``), a part the worker core holds.

Owns: one ``PartitionSlot`` per restored source partition, the set of partitions the group
assigned (restored or not yet), the source topic's partition count (asked once), and the
log end offsets the slots report lag against. A partition comes in by ``restore``
(blocking: the newest usable snapshot, rules in ``grudge_stream.partitions``) and
``adopt``, and goes by ``release``.

It does not own the commit limits (``grudge_stream.runtime.commits``) nor the snapshots
(``grudge_stream.runtime.checkpointer``): the core (``grudge_stream.runtime.core``) tells
those parts when a partition comes or goes.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from grudge_stream.metrics import Metrics
from grudge_stream.partitions import PartitionSlot, RestoreOutcome, restore_partition
from grudge_stream.topology import Topology

# Consumer lag is recorded at most this often.
LAG_INTERVAL_S = 1.0


class PartitionSlots:
    """The slots of the partitions a worker holds (see the module docstring).

    ``partition_count()`` asks the source's partition count (blocking, called once);
    ``low_watermark(partition)`` its earliest retained offset (a replay from the start).
    Both are the worker's hooks, asked when needed.
    """

    def __init__(self, topology: Topology, metrics: Metrics, *, partition_count: Callable[[], int],
                 low_watermark: Callable[[int], int]) -> None:
        self.topology = topology
        self.metrics = metrics
        self.slots: dict[int, PartitionSlot] = {}
        self.assigned: set[int] = set()
        self.partition_count: int | None = None
        self._ask_count = partition_count
        self._low_watermark = low_watermark
        self._lag_checked = 0.0

    def count(self) -> int:
        """The source topic's partition count (asked once)."""
        if self.partition_count is None:
            self.partition_count = self._ask_count()
        return self.partition_count

    def restore(self, partition: int, store: Any, dead_letter_limit: Callable[[], int]) -> RestoreOutcome:
        """Load ``partition``'s newest usable snapshot from ``store`` (blocking)."""
        return restore_partition(self.topology, store, partition, self.count(),
                                 lambda: self._low_watermark(partition), self.metrics, dead_letter_limit())

    def adopt(self, partition: int, outcome: RestoreOutcome) -> PartitionSlot:
        """A restored partition becomes a slot; processing starts at its ``next_offset``."""
        slot = self.slots[partition] = PartitionSlot(self.topology, partition, outcome, self.count(),
                                                     self.metrics)
        return slot

    def release(self, partition: int) -> None:
        """A revoked partition goes: its slot, and its place in the assignment."""
        self.slots.pop(partition, None)
        self.assigned.discard(partition)

    def dirty(self, partitions: Any = None) -> list[PartitionSlot]:
        """The slots of ``partitions`` (default: all) with changes since their last snapshot."""
        slots = self.slots
        parts = sorted(slots) if partitions is None else partitions
        return [slots[p] for p in parts if p in slots and slots[p].dirty]

    def query_slot(self, partition: int) -> PartitionSlot | None:
        """The slot of ``partition`` if it is held restored (called from HTTP threads)."""
        slot = self.slots.get(partition)
        return slot if slot is not None and partition in self.assigned else None

    def held(self) -> dict[int, PartitionSlot]:
        """The restored slots of the assigned partitions, copied (safe from any thread)."""
        assigned = set(self.assigned)
        return {p: slot for p, slot in list(self.slots.items()) if p in assigned}

    def record_lag(self, log_end: Callable[[int], int | None]) -> None:
        """Consumer lag per partition from ``log_end(partition)`` (the adapter's cached log
        end offsets), at most every ``LAG_INTERVAL_S``."""
        now = time.monotonic()
        if now - self._lag_checked < LAG_INTERVAL_S:
            return
        self._lag_checked = now
        for p, slot in list(self.slots.items()):
            try:
                high = log_end(p)
            except Exception:  # noqa: BLE001 - no fetch yet for a just-assigned partition
                continue
            if high is not None:
                slot.set_log_end(high)
