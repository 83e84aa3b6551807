"""The worker core under embedded state (``grudge_stream.state``): a caller's own loop.

``EmbeddedCore`` holds a state's ``WorkerCore`` (``grudge_stream.runtime.core``), as the
batch and Faust runtimes hold theirs.

The core's restore rules, slots, checkpoint round and commit limits, with the
partition count and low watermarks asked of the cluster with confluent-kafka, and
snapshots that can be taken at a batch boundary and written later
(``take_snapshots`` / ``write_taken``), so an event loop never waits on the broker.
"""
from __future__ import annotations

import logging
from typing import Callable

from grudge_stream.checkpoint import SnapshotWrite
from grudge_stream.operators.records import OutputRecord
from grudge_stream.partitions import snapshot_write
from grudge_stream.runtime.core import WorkerCore
from grudge_stream.settings import Settings
from grudge_stream.topology import Topology

log = logging.getLogger("grudge_stream.state")


def ensure_topics(topology: Topology, settings: Settings, bootstrap_servers: str | None,
                  client_properties: dict) -> None:
    """The state's snapshot and output topics, created with the source's partition count if
    missing (the source topic must exist)."""
    from grudge_stream.kafkaconf import client_config
    from grudge_stream.topics import ensure_topology_topics

    bootstrap = bootstrap_servers or settings.bootstrap_servers
    ensure_topology_topics(topology, bootstrap,
                           client_config={**client_config(settings, bootstrap), **client_properties})


class EmbeddedCore:
    """The embedded runtime of one state: it holds the state's ``WorkerCore`` (``core``),
    which the state reads as ``state.core``, and adds what only a caller's own loop needs:
    outputs published as they come, snapshots taken now and written later."""

    def __init__(self, topology: Topology, settings: Settings, *, bootstrap_servers: str | None = None,
                 client_config: dict | None = None) -> None:
        self.stopping_check: Callable[[], bool] | None = None
        self.core = WorkerCore(topology, settings, runtime="embedded", log=log, is_stopping=self.is_stopping,
                               bootstrap_servers=bootstrap_servers, client_properties=client_config)

    def publish(self, outputs: list[OutputRecord]) -> None:
        self.core.publisher.publish(outputs)

    def take_snapshots(self, partitions=None) -> list[SnapshotWrite]:
        """Copy the state of every changed slot of ``partitions`` (default: all) now; each
        is serialized where it is written (``write_taken``, off the event loop)."""
        return [snapshot_write(slot, deferred=True) for slot in self.core.dirty(partitions)]

    def write_taken(self, taken: list[SnapshotWrite], should_stop: Callable[[], bool] | None) -> dict[int, int]:
        """Outputs delivered, then ``taken`` written; commit limits raised to them."""
        core = self.core
        slots = [core.slots[w.partition] for w in taken if w.partition in core.slots]
        if len(slots) != len(taken):
            taken = [w for w in taken if w.partition in core.slots]
        if not taken:
            return {}
        if should_stop is not None:
            self.stopping_check = should_stop
        offsets = core.write_snapshots(slots, taken)
        core.checkpointed(offsets)
        return offsets

    def is_stopping(self) -> bool:
        return bool(self.stopping_check and self.stopping_check())

    def close(self) -> None:
        core = self.core
        try:
            core.publisher.flush(should_stop=lambda: True)
        finally:
            core.store.close()
            core.checkpointer.close()
            producer = getattr(core.publisher, "producer", None)
            if producer is not None:
                producer.flush(0)
