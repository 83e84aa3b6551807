"""The one consume loop of grudge-stream's own Kafka consumers.

The batch worker, ``grudge-stream replay`` and the repartition stage read their source
through ``ConsumeLoop``: it consumes up to ``batch_size`` records, reports each consume
error (the end of a partition is not one), groups the records by partition in the shape
the reader asked for, and hands the batch to the reader's ``step``. A reader says only
what a batch means to it: the worker processes, publishes and checkpoints; replay applies
a range; the repartition stage re-keys and forwards.

The Faust runtime reads through Faust's own fetcher (aiokafka) and hands its batches to
the same per-partition step of the worker core (``WorkerCore.process_groups``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from confluent_kafka import KafkaError

from grudge_stream._cyext._ingest import group_messages
from grudge_stream.operators.records import group_by_partition, group_headed_columns, group_source_records

__all__ = ["Batch", "ConsumeLoop", "COLUMNS", "RECORDS", "MESSAGES", "HEADED", "group_as"]

log = logging.getLogger("grudge_stream.runtime")

# The shapes a batch's partitions come in:
COLUMNS = "columns"    # (offsets, timestamps, keys, values): what operators read fastest
RECORDS = "records"    # [SourceRecord] with headers: operators that declare needs_headers
MESSAGES = "messages"  # [confluent_kafka.Message]: stages that forward records as they are
# (offsets, timestamps, keys, values, headers, timestamp types): stages that forward records,
# on the native ingest path too (headers: None for a record without any)
HEADED = "headed"
SHAPES = (COLUMNS, RECORDS, MESSAGES, HEADED)


class Batch:
    """One consume call's records, by partition (in offset order within each)."""

    __slots__ = ("groups", "count", "started")

    def __init__(self, groups: dict[int, Any], count: int, started: float) -> None:
        self.groups = groups    # partition -> its records, in the loop's shape
        self.count = count      # records in ``groups``
        self.started = started  # time.perf_counter() before the consume call

    def offsets(self, partition: int, shape: str) -> list[int]:
        """The offsets of one partition's records."""
        chunk = self.groups[partition]
        if shape == COLUMNS or shape == HEADED:
            return chunk[0]
        if shape == RECORDS:
            return [r.offset for r in chunk]
        return [m.offset() for m in chunk]


def group_as(shape: str, topic: str, msgs: list) -> tuple[dict[int, Any], list]:
    """Consumed confluent-kafka messages -> ({partition: its records in ``shape``}, errors)."""
    if shape == COLUMNS:
        return group_messages(msgs)
    if shape == RECORDS:
        return group_source_records(topic, msgs)
    if shape == HEADED:
        return group_headed_columns(msgs)
    return group_by_partition(msgs)


def _log_error(err: KafkaError) -> None:
    log.warning("consume error: %s", err)


@dataclass
class ConsumeLoop:
    """Read ``consumer`` (subscribed or assigned by its owner) batch by batch: up to
    ``batch_size`` records per consume call, waiting at most ``wait_s`` for them, grouped in
    ``shape``. ``on_error`` gets every consume error but a partition's end (default: a
    warning; a reader for which an error is final raises from it). ``beat`` runs before
    each consume (a liveness beat)."""

    consumer: Any
    topic: str
    batch_size: int
    wait_s: float
    shape: str = COLUMNS
    on_error: Callable[[KafkaError], None] = _log_error
    beat: Callable[[], None] | None = None
    # The native ingest (grudge_stream.runtime.native.NativeReader): its ``read`` serves the
    # consumer's callbacks and takes the records in the loop's shape (not MESSAGES), no
    # Message per record.
    native: Any = None

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES}, not {self.shape!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size}")
        if self.native is not None and self.shape == MESSAGES:
            raise ValueError("the native ingest path gives no confluent-kafka messages: read HEADED")

    def read(self) -> Batch:
        """One consume call: the records it brought, by partition (maybe none)."""
        if self.native is not None:
            return self.native.read(self)
        started = time.perf_counter()
        msgs = self.consumer.consume(self.batch_size, timeout=self.wait_s)
        if not msgs:
            return Batch({}, 0, started)
        groups, errors = group_as(self.shape, self.topic, msgs)
        for m in errors:
            err = m.error()
            if err.code() != KafkaError._PARTITION_EOF:
                self.on_error(err)
        return Batch(groups, len(msgs) - len(errors), started)

    def run(self, step: Callable[[Batch], None], until: Callable[[], bool]) -> None:
        """``step`` each batch, empty ones included (a reader's housekeeping runs between
        batches whether or not records came), until ``until()`` is true."""
        beat, read = self.beat, self.read
        while not until():
            if beat is not None:
                beat()
            step(read())
