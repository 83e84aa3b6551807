"""The native ingest path (setting ``ingest``, docs/runtime.md "Ingest paths") of the batch
worker, ``grudge-stream replay`` / ``backfill`` and the repartition stage.

confluent-kafka builds a Python ``Message`` per record, then ``group_messages`` takes it apart
into columns. The native path reads the records of the worker's assigned partitions through
librdkafka's C API instead (``grudge_stream._cyext._native``), straight into the columns
``(offsets, timestamps, keys, values)`` the operators read: no ``Message`` per record.

Everything but fetching stays with the confluent-kafka ``Consumer``: subscribe, the rebalance
callbacks, commits, seeks, the exactly-once group metadata, close. The fetcher uses the very
librdkafka instance of that consumer (its ``rd_kafka_t``), and the librdkafka library that
confluent-kafka loaded (the one its wheel ships), resolved at run time: never a second copy and
no link-time dependency. Each assigned partition's fetch queue is forwarded to a queue of the
fetcher before the partition is assigned (librdkafka then keeps that forwarding instead of
routing its records to the consumer queue), so the consumer queue carries only what is not a
record: rebalances, errors, statistics. Each loop turn serves it with a non-blocking
``consume()`` (callbacks run there as today; an error it returns goes to the worker's error
handling as today, a fatal one to ``ConsumerFatal``), then takes up to ``batch_size`` records
from the fetcher, waiting at most ``batch_max_wait_ms`` when none came. After a full batch (a
backlog) the next takes up to ``batch_backlog_factor`` times as many of the records already
fetched, without waiting; one of fewer than ``batch_size`` ends the backlog. The batch worker's columns hold each
partition's offsets and timestamps as ``array.array('q')`` (no int object per record).

``ingest``: ``auto`` (the default) runs the native path where it loads and today's path with
one info line where it does not; ``native`` refuses to start without it (exit 2); ``python``
always runs today's path. ``/ready`` says which runs (``"ingest"``), and so does the gauge
``grudge_ingest_native``.
"""
from __future__ import annotations

import functools
import glob
import logging
import os
import time
from typing import Any

from confluent_kafka import KafkaError

from grudge_stream.exceptions import ConfigError

__all__ = ["INGEST_PATHS", "NativeReader", "allocator", "unavailable", "librdkafka_path", "open_reader", "assign",
           "unassign", "cooperative"]

log = logging.getLogger("grudge_stream.runtime")

INGEST_PATHS = ("auto", "native", "python")

_reason: list[str | None] = []  # the cached answer of unavailable()


def librdkafka_path() -> str | None:
    """The file of the librdkafka confluent-kafka loaded into this process (the copy its wheel
    ships in ``confluent_kafka.libs``, or a system one for a build from source)."""
    import confluent_kafka.cimpl  # noqa: F401 - loads librdkafka

    for path in _mapped():
        if os.path.basename(path).startswith("librdkafka") and ".so" in path:
            return path
    import confluent_kafka

    base = os.path.dirname(os.path.dirname(confluent_kafka.__file__))
    found = sorted(glob.glob(os.path.join(base, "confluent_kafka.libs", "librdkafka*.so*")))
    return found[0] if found else None


def _mapped() -> list[str]:
    """The files mapped into this process (Linux ``/proc/self/maps``; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            return [line.rstrip("\n").split(None, 5)[-1] for line in f if line.count(" ") >= 5]
    except OSError:
        return []


_ALLOCATORS = (("libjemalloc", "jemalloc"), ("libmimalloc", "mimalloc"), ("libtcmalloc", "tcmalloc"))


@functools.cache
def allocator() -> str:
    """The C allocator this process runs on: ``jemalloc``, ``mimalloc`` or ``tcmalloc`` when
    one is loaded (``LD_PRELOAD``), else ``system`` (the C library's malloc).

    It matters on the native path: librdkafka's broker thread allocates one op per record
    and the consuming thread frees it, a pattern glibc's malloc serves under its arena lock;
    jemalloc takes 10-14% off the worker's CPU per event (docs/runtime.md). Asked once
    per process (what is preloaded cannot change)."""
    for path in _mapped():
        base = os.path.basename(path)
        for prefix, name in _ALLOCATORS:
            if base.startswith(prefix) and ".so" in base:
                return name
    return "system"


def unavailable() -> str | None:
    """None where the native path can run here, else why not (one line)."""
    if _reason:
        return _reason[0]
    _reason.append(_check())
    return _reason[0]


def _check() -> str | None:
    try:
        from grudge_stream._cyext import _native
    except ImportError as exc:
        return f"the native ingest module is not built ({exc})"
    if _native.loaded():
        return None
    try:
        path = librdkafka_path()
    except ImportError as exc:
        return f"confluent-kafka's module does not load ({exc})"
    if path is None:
        return "confluent-kafka's librdkafka was not found in this process"
    why = _native.load(path)
    if why is not None:
        return why
    import confluent_kafka

    ours, theirs = _native.version(), confluent_kafka.libversion()[1]
    if ours != theirs:
        return f"librdkafka at {path} is {ours:#x}, confluent-kafka runs {theirs:#x}"
    return None


class NativeReader:
    """A consumer's records through the native fetcher, one batch per ``read``: the
    ``ConsumeLoop`` hook (``ConsumeLoop.native``). The loop's shape says what it takes:
    ``COLUMNS``; ``HEADED`` (the columns, each record's headers and timestamp type: stages
    that forward records, the repartition stage); ``RECORDS`` (``SourceRecord`` with headers:
    operators that declare ``needs_headers``)."""

    def __init__(self, consumer: Any, topic: str, batch_size: int, arrays: bool = False,
                 backlog_factor: int = 1) -> None:
        from grudge_stream._cyext._native import PARTITION_EOF, PartitionFetch

        if backlog_factor < 1:
            raise ValueError(f"backlog_factor must be at least 1, not {backlog_factor}")
        self.consumer = consumer
        self.topic = topic
        self.arrays = arrays  # COLUMNS: offsets and timestamps as array('q'), not lists of ints
        # After a full batch (a backlog), the next read takes up to this many times the loop's
        # batch size of what is already fetched, without waiting (setting batch_backlog_factor).
        self.backlog_factor = backlog_factor
        self._backlog = False
        self._eof = PARTITION_EOF
        self.fetch = PartitionFetch(consumer, topic, batch_size * backlog_factor)

    arrays = False       # (class defaults: a reader made without __init__, as tests do)
    backlog_factor = 1
    _backlog = False

    def identity(self) -> tuple[str, int]:
        """(librdkafka's instance name, client type) of the handle read from the consumer."""
        from grudge_stream._cyext._native import client_identity

        return client_identity(self.consumer)

    # -- the rebalance hooks: split before assign, release after unassign ---------------------

    def split(self, partitions: list[int]) -> None:
        self.fetch.split(partitions)

    def release(self, partitions: list[int] | None = None) -> None:
        self.fetch.release(partitions)

    def close(self) -> None:
        self.fetch.close()

    # -- one loop turn ------------------------------------------------------------------------------

    def read(self, loop: Any) -> Any:
        from grudge_stream.runtime.loop import COLUMNS, RECORDS, Batch, group_as

        started = time.perf_counter()
        shape = loop.shape
        # The consumer queue: rebalance callbacks run here (split/release included), errors
        # come back as messages. A record can come too only if a partition's queue was not
        # split before its assignment; it is processed all the same, ahead of the fetcher's.
        msgs = self.consumer.consume(loop.batch_size, timeout=0)
        groups: dict[int, Any] = {}
        count = 0
        if msgs:
            groups, errors = group_as(shape, loop.topic, msgs)
            for m in errors:
                err = m.error()
                if err.code() != KafkaError._PARTITION_EOF:
                    loop.on_error(err)
            count = len(msgs) - len(errors)
        size = loop.batch_size * self.backlog_factor if self._backlog else loop.batch_size
        want = size - count
        if want > 0 and not self.fetch.closed:
            # Records already there: no wait; nor in a backlog (a read under batch_size ends it).
            wait_ms = 0 if count or self._backlog else int(loop.wait_s * 1000)
            more, errs, n = self.fetch.fetch(want, wait_ms, shape != COLUMNS, self.arrays)
            for p, code, text in errs:
                if code != self._eof:
                    loop.on_error(KafkaError(code, f"{loop.topic}[{p}]: {text}"))
            if n:
                if shape == RECORDS:
                    more = {p: source_records(loop.topic, p, cols) for p, cols in more.items()}
                if groups:
                    for p, cols in more.items():
                        have = groups.get(p)
                        if have is None:
                            groups[p] = cols
                        elif shape == RECORDS:
                            have.extend(cols)
                        else:
                            for a, b in zip(have, cols):
                                a.extend(b)
                else:
                    groups = more
                count += n
        self._backlog = self.backlog_factor > 1 and count >= loop.batch_size
        return Batch(groups, count, started)


def source_records(topic: str, partition: int, cols: tuple) -> list:
    """One partition's headed columns as ``SourceRecord``s (the record path's shape)."""
    from grudge_stream.operators.records import SourceRecord

    offs, tss, keys, vals, hdrs, _ = cols
    return [SourceRecord(topic, partition, o, t, k, v, h or None) for o, t, k, v, h in zip(offs, tss, keys, vals, hdrs)]


# -- the rebalance steps of a consumer that reads through a NativeReader (None: today's path) ------

def cooperative(conf: dict) -> bool:
    """A consumer configuration with incremental (cooperative-sticky) rebalances."""
    return "cooperative-sticky" in str(conf.get("partition.assignment.strategy", ""))


def assign(consumer: Any, reader: NativeReader | None, partitions: list, incremental: bool) -> None:
    """Assign ``partitions`` (TopicPartitions, offsets set or not), their fetch queues split
    into ``reader`` first: their records then stay off the consumer queue. ``incremental``:
    added to what the consumer holds (cooperative rebalances, a replay's partitions)."""
    if reader is not None:
        reader.split([tp.partition for tp in partitions if tp.topic == reader.topic])
    if incremental:
        consumer.incremental_assign(partitions)
    else:
        consumer.assign(partitions)


def unassign(consumer: Any, reader: NativeReader | None, partitions: list, incremental: bool) -> None:
    """Unassign ``partitions`` (all of them unless ``incremental``), then release their queue
    handles from ``reader``."""
    if incremental:
        consumer.incremental_unassign(partitions)
    else:
        consumer.unassign()
    if reader is not None:
        reader.release([tp.partition for tp in partitions if tp.topic == reader.topic])


def open_reader(choice: str, consumer: Any, topic: str, batch_size: int, columns: bool = True,
                quiet: bool = False, what: str = "ingest", arrays: bool = False,
                backlog_factor: int = 1) -> NativeReader | None:
    """The native reader for ``consumer`` as the ``ingest`` setting ``choice`` asks, or None
    (today's path). ``columns``: false keeps the reader on today's path (a reader that takes
    confluent-kafka messages). ``native`` where it cannot run raises ``ConfigError``. The
    one line said (unless ``quiet``) starts with ``what``. ``arrays``: the column shape's
    offsets and timestamps come as ``array.array('q')`` (for readers that take the columns
    to the operators' pipeline, not to code that expects lists). ``backlog_factor``: after a
    full batch, the next read takes up to that many times ``batch_size`` (``NativeReader``)."""
    if choice not in INGEST_PATHS:
        raise ConfigError(f"ingest must be one of {', '.join(INGEST_PATHS)}, not {choice!r}")
    if choice == "python":
        return None
    why = unavailable() if columns else "its reader takes confluent-kafka messages"
    if why is None and not _is_consumer(consumer):
        why = f"not a confluent-kafka Consumer ({type(consumer).__name__})"
    if why is not None:
        if choice == "native":
            raise ConfigError(f"ingest=native: the native ingest path cannot run: {why}")
        if not quiet:
            log.info("%s: today's path (confluent-kafka messages): the native path cannot run: %s", what, why)
        return None
    reader = NativeReader(consumer, topic, batch_size, arrays, backlog_factor)
    name, kind = reader.identity()
    if kind != 1 or "#consumer-" not in name:  # not the handle of a consumer: refuse to read through it
        reader.close()
        why = f"the handle taken from the consumer is not a consumer's ({name!r}, type {kind})"
        if choice == "native":
            raise ConfigError(f"ingest=native: the native ingest path cannot run: {why}")
        log.info("%s: today's path (confluent-kafka messages): the native path cannot run: %s", what, why)
        return None
    if not quiet:
        alloc = allocator()
        log.info("%s: native (librdkafka %s through confluent-kafka's consumer; allocator %s%s)", what,
                 _libversion(), alloc, "" if alloc != "system" else
                 ", jemalloc took 10-14% off the CPU per event: docs/runtime.md \"The allocator\"")
    return reader


def _is_consumer(consumer: Any) -> bool:
    from confluent_kafka import cimpl

    return isinstance(consumer, cimpl.Consumer)


def _libversion() -> str:
    import confluent_kafka

    return confluent_kafka.libversion()[0]
