"""Commit limits and the group's positions, parts the worker core holds.

- ``CommitLimits`` owns, per source partition, the offset the group's committed offset may
  reach (a durable snapshot's, or the outputs' delivered position), the cadence of commits
  apart from snapshots (``commit_interval_s``) and the limits noted but not yet delivered.
  A limit never moves back: not below a restored snapshot, a resumed commit, or itself.
- ``GroupOffsets`` owns the questions to the cluster about the consumer group: its committed
  offsets (``committed``, retried through a cluster at its worst) and the sums of committed
  and log end offsets (``position``, what ``liveness.GroupProgress`` watches).
- ``restart_point``: where a restored partition without a snapshot starts again.

The core (``grudge_stream.runtime.core``) keeps the names runtimes call
(``commit_limits``, ``group_committed``, ``resume``, ``advance_commit_limits``, ...).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

from grudge_stream.checkpoint import BROKER_ABORT_CHECK_INTERVAL_S, OPEN_TRANSACTION_MARGIN_S
from grudge_stream.partitions import PartitionSlot, RestoreOutcome
from grudge_stream.sections import Checkpointing, KafkaClient, as_section
from grudge_stream.topology import Settings


def open_transaction_wait(checkpointing: Checkpointing | Settings) -> float:
    """How long a restore waits out another producer's open transaction on the snapshot
    topic: ``open_transaction_wait_s`` (0: not at all), by default the time the broker
    takes to abort a dead worker's transaction — its timeout (that of the fleet, assumed
    equal to ours) plus the broker's abort-check interval and a margin. Of a
    ``Checkpointing`` section, or of the ``Settings`` it is read from."""
    checkpointing = as_section(Checkpointing, checkpointing)
    wait = checkpointing.open_transaction_wait_s
    if wait is None:
        wait = (checkpointing.transaction_timeout_s + BROKER_ABORT_CHECK_INTERVAL_S
                + OPEN_TRANSACTION_MARGIN_S)
    return float(wait)


def restart_point(outcome: RestoreOutcome, committed: int | None, low_watermark: Callable[[], int]
                  ) -> RestoreOutcome:
    """A restored partition whose group committed offsets but kept no snapshot (they are
    apart now) is rebuilt from its earliest retained offset (``low_watermark()``), silently
    up to the commit (``PartitionSlot.suppress_below``) — never resumed at the commit with
    an empty sketch."""
    if outcome.operator.next_offset is None and committed is not None:
        outcome.operator.next_offset = low_watermark()
    return outcome


class CommitLimits:
    """The offsets a commit of each partition must not pass (see the module docstring).

    ``cadence`` is a ``CheckpointCadence`` of ``commit_interval_s``."""

    def __init__(self, cadence: Any) -> None:
        self.limits: dict[int, int] = {}
        self.cadence = cadence
        # (output stream position, offsets): limits waiting for their outputs' delivery.
        self.pending: tuple[int, dict[int, int]] | None = None

    def raise_to(self, offsets: dict[int, int]) -> None:
        """Limits up to ``offsets`` (durable snapshots, a resumed commit): never back."""
        limits = self.limits
        for p, o in offsets.items():
            if o > limits.get(p, -1):
                limits[p] = o

    def adopted(self, partition: int, next_offset: int | None) -> None:
        """A restored partition's limit starts at its snapshot's next offset."""
        if next_offset is not None:
            self.limits[partition] = next_offset

    def forget(self, partition: int) -> None:
        self.limits.pop(partition, None)

    def advance(self, slots: dict[int, PartitionSlot], publisher: Any) -> None:
        """For a consumer that commits on its own (Faust): every ``commit_interval_s`` note
        each slot's next offset and the output stream's position; once every output before
        that position is delivered, the limits move there."""
        pending = self.pending
        if pending is not None:
            mark, offsets = pending
            if publisher.delivered_through(mark):
                self.raise_to({p: o for p, o in offsets.items() if p in slots})
                self.pending = None
        if self.pending is None and self.cadence.due():
            self.cadence.done()
            limits = self.limits
            moved = {p: s.operator.next_offset for p, s in slots.items()
                     if s.operator.next_offset is not None and s.operator.next_offset > limits.get(p, -1)}
            if moved:
                self.pending = (publisher.mark(), moved)


class GroupOffsets:
    """What the cluster says of the consumer group ``group`` on ``topic`` (see the module
    docstring); every call blocks and makes clients of its own.

    ``kafka``: its ``broker_wait_s``; ``checkpointing``: the open-transaction wait (a
    ``Settings`` as ``kafka`` stands for both)."""

    def __init__(self, group: str, topic: str, kafka: KafkaClient | Settings, client_config: dict,
                 log: logging.Logger, checkpointing: Checkpointing | None = None) -> None:
        self.app_id = group
        self.topic = topic
        self.wait_s = as_section(KafkaClient, kafka).broker_wait_s
        if checkpointing is None:
            checkpointing = Checkpointing() if isinstance(kafka, KafkaClient) else Checkpointing.of(kafka)
        self.unstable_wait_s = open_transaction_wait(checkpointing)
        self.client_config = client_config
        self.log = log

    def committed(self, partitions: Iterable[int]) -> dict[int, int]:
        """The group's committed offsets of ``partitions``, those it has (blocking).

        Asked on every assignment, so it meets the cluster at its worst (a coordinator that is
        loading or moving, a broker bounced): transient answers are retried for up to
        ``broker_wait_s``, then the last one is raised (one line, exit 2 from the CLI)."""
        from confluent_kafka import KafkaError, KafkaException

        from grudge_stream.kafka.offsets import committed_offsets
        from grudge_stream.topics import transient

        partitions = list(partitions)
        if not partitions:
            return {}
        # Stable offsets only: while a transaction holding offsets of these partitions is open
        # (a crashed predecessor's, or one the broker is aborting after an outage), the broker
        # answers UNSTABLE_OFFSET_COMMIT instead of an offset that may move back or forward once
        # it ends (KIP-447), and the read times out; that wait is bounded by the transaction's
        # timeout, so a timeout is retried for the longer of the two waits.
        t0 = time.monotonic()
        deadline = t0 + self.wait_s
        unstable_deadline = max(deadline, t0 + self.unstable_wait_s)
        delay, warned = 0.25, 0.0
        while True:
            try:
                # A client per attempt: one kept across a broker outage kept timing out after it.
                got = committed_offsets(self.client_config, self.app_id, self.topic, partitions)
                return {p: o for p, o in got.items() if o >= 0}
            except KafkaException as exc:
                now = time.monotonic()
                code = exc.args[0].code()
                unstable = code in (KafkaError.UNSTABLE_OFFSET_COMMIT, KafkaError._TIMED_OUT)
                if not transient(exc) or now + delay > (unstable_deadline if unstable else deadline):
                    raise
                if now - warned >= 15:
                    self.log.warning("the group's committed offsets of %s%s: %s; retrying for up to %.0f s "
                                     "(broker_wait_s)", self.topic, sorted(partitions), exc,
                                     deadline - now)
                    warned = now
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def position(self, count: int) -> tuple[int, int]:
        """The group's committed offsets and the source's log end offsets, each summed over
        the source's ``count`` partitions (blocking)."""
        from confluent_kafka import Consumer, TopicPartition

        committed = self.committed(range(count))
        c = Consumer({**self.client_config, "group.id": "grudge-watermarks", "log_level": 0})
        try:
            ends = [c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5, cached=False)[1]
                    for p in range(count)]
        finally:
            c.close()
        return sum(committed.values()), sum(ends)
