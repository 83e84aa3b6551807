"""The checkpoint store: operator snapshots on a compacted Kafka topic.

Independent of Faust (it speaks confluent-kafka), so the Faust runtime and the
batch runner share it, and so does `grudge-stream replay` when it writes
snapshots for a live worker to adopt.

Layout on the snapshot topic (compacted, one partition per source partition;
the snapshot of source partition ``p`` lives in snapshot partition
``p % partitions``): chunk records, then one manifest record naming them
(their keys, headers and encoding: ``grudge_stream.checkpoint.format``).

A crash while chunks are being written leaves the previous manifest the
newest one, so a half-written snapshot is never loaded. Restore reads only
the newest manifest (scanning backwards from the end of the partition) and
the chunks it names — never the whole history — and falls back to the
previous generation when the newest fails its checks.

Restore reads ``read_committed`` and waits, a bounded time, for another
producer's open transaction that hides a newer manifest rather than adopt an
older snapshot (``grudge_stream.checkpoint.transactions``). ``watermarks``
(``grudge_stream.checkpoint.offsets``) asks a partition for its offsets.
"""
from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from grudge_stream.checkpoint.format import (
    DEFAULT_CHUNK_BYTES, Manifest, SnapshotRef, chunk_key, decode_chunk, encode_chunk, join_chunks,
    manifest_key,
)
from grudge_stream.checkpoint.offsets import watermarks  # noqa: F401 - importable from here too
from grudge_stream.checkpoint.transactions import (  # noqa: F401 - the constants importable from here too
    BROKER_ABORT_CHECK_INTERVAL_S, DEFAULT_OPEN_TRANSACTION_WAIT_S, DEFAULT_TRANSACTION_TIMEOUT_S,
    OPEN_TRANSACTION_MARGIN_S, OpenTransactionReads,
)
from grudge_stream.exceptions import CheckpointError, ConfigError, SnapshotError
from grudge_stream.hashing import crc32c
from grudge_stream.kafkaconf import PRODUCER_MAX_MESSAGE_BYTES
from grudge_stream.kafkaconf import producer_config as kafka_producer_config

log = logging.getLogger("grudge_stream.checkpoint")

# Compaction settings that keep the snapshot topic small: short segments so the active
# segment rolls and becomes cleanable, and an eager cleaner.
SNAPSHOT_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": "60000",
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": "60000",
    "max.message.bytes": str(PRODUCER_MAX_MESSAGE_BYTES),
}


def _chunk_delivered(offsets: list, errors: list, index: int):
    """A delivery callback noting where chunk ``index`` landed (or why it did not)."""
    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            offsets[index] = msg.offset()
    return on_delivery


@dataclass(frozen=True)
class SnapshotWrite:
    """One snapshot to write: the blob and what its manifest records about it."""

    operator_id: str
    partition: int
    blob: bytes
    next_offset: int | None
    watermark: int | None
    fingerprint: str
    source_topic: str
    partition_count: int
    app_id: str = ""  # the deployment that wrote it (its consumer group)
    # A state copied but not serialized yet (``partitions.snapshot_write(deferred=True)``):
    # ``serialized()`` makes ``blob`` from it.
    make: Callable[[], bytes] | None = None

    def serialized(self) -> SnapshotWrite:
        """This write with its blob made (itself when it has one)."""
        return self if self.make is None else replace(self, blob=self.make(), make=None)


@dataclass
class RestoreResult:
    """What a restore found: the blob and its ref, plus every candidate refused on the way."""

    blob: bytes | None
    ref: SnapshotRef | None
    refused: list[tuple[int, str]] = field(default_factory=list)  # (generation, reason)
    manifest: Manifest | None = None


class CheckpointStore(OpenTransactionReads):
    """Write and read operator snapshots on one compacted topic."""

    def __init__(self, bootstrap_servers: str, topic: str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 producer_config: dict | None = None, consumer_config: dict | None = None,
                 scan_window: int = 64, timeout_s: float = 30.0, chunk_delay_s: float = 0.0,
                 producer: Producer | None = None,
                 open_transaction_wait_s: float = DEFAULT_OPEN_TRANSACTION_WAIT_S,
                 client_config: dict | None = None) -> None:
        if chunk_bytes < 1024 or chunk_bytes > 1024 * 1024:
            raise ConfigError("chunk_bytes must be between 1 KiB and 1 MiB")
        if not open_transaction_wait_s >= 0:
            raise ConfigError("open_transaction_wait_s must be 0 or more")
        # The longest a read of the newest manifest waits for another producer's open
        # transaction that hides a newer manifest (see _committed_end); it should exceed the
        # writers' transaction timeout plus the broker's abort-check interval.
        self.open_transaction_wait_s = float(open_transaction_wait_s)
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.chunk_bytes = chunk_bytes
        self.scan_window = scan_window
        # Pause after each chunk (flushed one by one then): throttles snapshot I/O, and lets
        # failure tests kill a worker in the middle of a snapshot write.
        self.chunk_delay_s = chunk_delay_s
        self.timeout_s = timeout_s
        # Security and pass-through properties of every client made here (producer, readers,
        # admin): grudge_stream.kafkaconf.client_config(settings).
        self._client_config: dict = {"bootstrap.servers": bootstrap_servers, **(client_config or {})}
        self._producer_config: dict = kafka_producer_config(
            client_config or {}, bootstrap_servers=bootstrap_servers, linger_ms=0, extra=producer_config)
        self._consumer_config = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"grudge-checkpoint-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.queue.backoff.ms": 1,
            # Restores read up to the end of a partition, where the broker would otherwise hold
            # each fetch for fetch.wait.max.ms (500 ms) waiting for more data.
            "fetch.wait.max.ms": 10,
            "isolation.level": "read_committed",
            **(client_config or {}),
            **(consumer_config or {}),
        }
        # A caller's producer (a transactional one, so snapshots commit atomically with the
        # outputs and source offsets of their interval), or one made on first write.
        self._producer: Producer | None = producer
        self._own_producer = producer is None
        self._partitions: int | None = None
        # (operator, partition) -> (newest generation number, last good generation's ref)
        self._last: dict[tuple[str, int], tuple[int, SnapshotRef | None]] = {}
        # A read_uncommitted reader, made on first use and kept: it asks for the true log end
        # (a read_committed one gets the last stable offset) and looks behind open transactions.
        self._peeker: Consumer | None = None
        self._peeker_lock = threading.Lock()

    # -- topic --------------------------------------------------------------------------------

    def ensure_topic(self, partitions: int, replication_factor: int = -1) -> None:
        """Create the snapshot topic (compacted) if it does not exist."""
        admin = AdminClient({"log_level": 3, **self._client_config})
        md = admin.list_topics(timeout=self.timeout_s)
        if self.topic in md.topics and not md.topics[self.topic].error:
            self._partitions = len(md.topics[self.topic].partitions)
            return
        fut = admin.create_topics([NewTopic(self.topic, num_partitions=partitions,
                                            replication_factor=replication_factor,
                                            config=SNAPSHOT_TOPIC_CONFIG)])[self.topic]
        try:
            fut.result(timeout=self.timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise CheckpointError(f"cannot create snapshot topic {self.topic!r}: {exc}") from None
        self._partitions = None

    def partitions(self) -> int:
        if self._partitions is None:
            admin = AdminClient({"log_level": 3, **self._client_config})
            deadline = time.monotonic() + self.timeout_s
            while True:
                md = admin.list_topics(topic=self.topic, timeout=self.timeout_s)
                t = md.topics.get(self.topic)
                if t is not None and not t.error and t.partitions:
                    self._partitions = len(t.partitions)
                    break
                if time.monotonic() > deadline:
                    raise CheckpointError(
                        f"snapshot topic {self.topic!r} does not exist. Operator action: create it "
                        "(grudge-stream creates it on start when allowed) or fix the topic name."
                    )
                time.sleep(0.2)
        return self._partitions

    def sibling(self) -> CheckpointStore:
        """A store on the same topic with a producer of its own (made on first write) that
        shares this one's record of the newest generations. An exactly-once worker writes its
        background snapshots with it, outside the transaction (grudge_stream.runtime.core);
        never use both from two threads at once."""
        other = copy.copy(self)
        other._producer = None
        other._own_producer = True
        other._peeker = None
        other._peeker_lock = threading.Lock()
        return other

    def snapshot_partition(self, partition: int) -> int:
        return partition % self.partitions()

    # -- write --------------------------------------------------------------------------------

    def use_producer(self, producer: Producer) -> None:
        """Write with ``producer`` from now on (a transactional one that replaced a fenced one)."""
        self._producer = producer
        self._own_producer = False

    def _get_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self._producer_config)
        return self._producer

    def write(self, operator_id: str, partition: int, blob: bytes, *, next_offset: int | None,
              watermark: int | None, fingerprint: str, source_topic: str,
              partition_count: int) -> SnapshotRef:
        """Write one snapshot generation; returns once the manifest is acknowledged."""
        return self.write_many([SnapshotWrite(operator_id, partition, blob, next_offset, watermark, fingerprint,
                                              source_topic, partition_count)])[0]

    def write_many(self, writes: Iterable[SnapshotWrite]) -> list[SnapshotRef]:
        """Write a snapshot generation for each of ``writes``, all in flight together.

        Every chunk of every snapshot is produced first (``writes`` may be a generator: the
        next blob is serialized while the previous one's chunks are sent), then one wait for
        all their acknowledgements, then the manifests of the snapshots whose chunks all
        landed, and one wait for those. A round of P partitions so waits twice instead of
        2P times; each manifest is still written only after its own chunks are durable.
        Returns the refs in the order of ``writes``; raises ``CheckpointError`` if any
        snapshot was not written (the others are, and their refs are cached as the latest).
        """
        return self.write_manifests(self.write_chunks(writes))

    def write_chunks(self, writes: Iterable[SnapshotWrite]) -> list[tuple]:
        """The first half of ``write_many``: every chunk produced and acknowledged. Returns
        what ``write_manifests`` needs to finish the generations; until it runs, the previous
        generation stays the newest (a caller may wait for something else in between: the
        outputs the snapshots cover, say)."""
        producer = self._get_producer()
        pending: list[tuple[SnapshotWrite, int, int, SnapshotRef | None, list, list, int, int]] = []
        for w in writes:
            cached = self._last.get((w.operator_id, w.partition))
            if cached is None:
                found = self.read_manifest(w.operator_id, w.partition)
                cached = (found.current.generation, found.current) if found else (0, None)
            latest_generation, prev = cached
            generation = latest_generation + 1
            # Never overwrite the chunks of the last good generation while writing the next one.
            slot = (1 - prev.slot) if prev is not None else generation % 2
            view = memoryview(w.blob)
            offsets, errors = self.produce_chunks(producer, self.snapshot_partition(w.partition), w,
                                                  generation, slot)
            size, crc = len(view), crc32c(view)
            # Keep what the manifest needs, not the blob: librdkafka copied the chunks (and
            # frees them as they are acknowledged), so the round does not pin every blob.
            pending.append((replace(w, blob=b""), generation, slot, prev, offsets, errors, size, crc))
        self._flush(producer)
        return pending

    def produce_chunks(self, producer: Producer, sp: int, w: SnapshotWrite, generation: int,
                       slot: int) -> tuple[list[int | None], list[str]]:
        """Produce the chunks of ``w.blob`` to snapshot partition ``sp``; the lists their
        delivery callbacks fill: each chunk's offset, and the errors. Each chunk is a
        memoryview slice of the blob, copied once into its record and checksummed without the
        GIL (``encode_chunk``); ``produce`` then copies the record into librdkafka, which
        compresses it (lz4) in its own threads."""
        view = memoryview(w.blob)
        count = max(1, -(-len(view) // self.chunk_bytes))
        offsets: list[int | None] = [None] * count
        errors: list[str] = []
        for i in range(count):
            data = view[i * self.chunk_bytes:(i + 1) * self.chunk_bytes]
            self._produce(producer, sp, chunk_key(w.operator_id, w.partition, slot, i),
                          encode_chunk(generation, i, count, data),
                          _chunk_delivered(offsets, errors, i))
            if self.chunk_delay_s:
                self._flush(producer)
                time.sleep(self.chunk_delay_s)
        return offsets, errors

    def write_manifests(self, pending: list[tuple]) -> list[SnapshotRef]:
        """The second half of ``write_many``: the manifests of ``write_chunks``'s snapshots."""
        producer = self._get_producer()
        refs: list[SnapshotRef | None] = []
        done: list[list] = []
        failed: list[str] = []
        for w, generation, slot, prev, offsets, errors, size, crc in pending:
            if errors or any(o is None for o in offsets):
                failed.append(f"chunks of {w.operator_id}[{w.partition}]: {errors or 'not acknowledged'}")
                refs.append(None)
                done.append([])
                continue
            ref = SnapshotRef(
                generation=generation, slot=slot, offsets=tuple(offsets), size=size, crc=crc,
                next_offset=w.next_offset, watermark=w.watermark, fingerprint=w.fingerprint,
                source_topic=w.source_topic, partition_count=w.partition_count,
                written_ms=time.time_ns() // 1_000_000, app_id=w.app_id,
            )
            acks: list = []
            self._produce(producer, self.snapshot_partition(w.partition), manifest_key(w.operator_id, w.partition),
                          Manifest(w.operator_id, w.partition, ref, prev).encode(),
                          lambda err, msg, acks=acks: acks.append(err))
            refs.append(ref)
            done.append(acks)
        self._flush(producer)
        for (w, generation, *_), ref, acks in zip(pending, refs, done):
            if ref is None:
                continue
            if not acks or acks[0] is not None:
                failed.append(f"manifest of {w.operator_id}[{w.partition}]: {acks}")
                continue
            self._last[(w.operator_id, w.partition)] = (generation, ref)
        if failed:
            raise CheckpointError("snapshots not written: " + "; ".join(failed))
        return refs  # type: ignore[return-value]

    def _produce(self, producer: Producer, partition: int, key: bytes, value: bytes, cb) -> None:
        while True:
            try:
                producer.produce(self.topic, value=value, key=key, partition=partition, on_delivery=cb)
                return
            except BufferError:
                producer.poll(0.05)

    def _flush(self, producer: Producer) -> None:
        remaining = producer.flush(self.timeout_s)
        if remaining:
            raise CheckpointError(f"{remaining} snapshot records still undelivered after {self.timeout_s}s")

    def forget(self, operator_id: str, partition: int) -> None:
        """Drop the cached last generation (after a revocation: another worker may write next)."""
        self._last.pop((operator_id, partition), None)

    def close(self) -> None:
        if self._producer is not None and self._own_producer:
            self._producer.flush(self.timeout_s)
            self._producer = None
        with self._peeker_lock:
            if self._peeker is not None:
                self._peeker.close()
                self._peeker = None

    # -- read ---------------------------------------------------------------------------------

    def _consumer(self) -> Consumer:
        return Consumer(self._consumer_config)

    def _read_range(self, consumer: Consumer, sp: int, start: int, end: int) -> Iterable:
        """Messages of snapshot partition ``sp`` with offsets in [start, end).

        The reader is read_committed: transaction markers and aborted records are never
        delivered, so progress is judged by the consumer's position, and records behind
        another writer's open transaction count as not there yet (the range ends at the
        last stable offset once the position stops moving).
        """
        if start >= end:
            return
        tp = TopicPartition(self.topic, sp, start)
        consumer.assign([tp])
        deadline = time.monotonic() + self.timeout_s
        idle_since = time.monotonic()
        last_pos = start
        while True:
            # consume() waits until it has num_messages or the timeout passes: ask for no more
            # than the range holds, and poll briefly (compacted or control offsets never come).
            msgs = consumer.consume(num_messages=max(1, min(500, end - max(last_pos, start))),
                                    timeout=0.05)
            for m in msgs:
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise CheckpointError(f"error reading {self.topic}[{sp}]: {m.error()}")
                if m.offset() >= end:
                    return
                yield m
            (pos,) = consumer.position([TopicPartition(self.topic, sp)])
            if pos.offset >= end:
                return
            if pos.offset != last_pos or msgs:
                last_pos, idle_since = pos.offset, time.monotonic()
                deadline = time.monotonic() + self.timeout_s
            elif pos.offset >= 0 and time.monotonic() - idle_since > 2.0:
                return  # nothing readable past the last stable offset
            if time.monotonic() > deadline:
                raise CheckpointError(f"timed out reading {self.topic}[{sp}] at offset {pos.offset} (end {end})")

    def read_manifest(self, operator_id: str, partition: int,
                      consumer: Consumer | None = None) -> Manifest | None:
        """The newest manifest of (operator, partition), scanning backwards from the end."""
        sp = self.snapshot_partition(partition)
        key = manifest_key(operator_id, partition)
        own = consumer is None
        consumer = consumer or self._consumer()
        try:
            low, end = self._committed_end(consumer, operator_id, partition, sp, key)
            while end > low:
                start = max(low, end - self.scan_window)
                found = None
                for m in self._read_range(consumer, sp, start, end):
                    if m.key() == key:
                        found = m
                if found is not None:
                    try:
                        return Manifest.decode(found.value(), found.offset())
                    except SnapshotError as exc:
                        log.error("snapshot manifest of %s[%d] at %s[%d]@%d is unreadable: %s",
                                  operator_id, partition, self.topic, sp, found.offset(), exc)
                        end = found.offset()
                        continue
                end = start
            return None
        finally:
            if own:
                consumer.close()

    def load_ref(self, operator_id: str, partition: int, ref: SnapshotRef,
                 consumer: Consumer | None = None) -> bytes:
        """Fetch and verify the chunks of one generation; SnapshotError if anything is off."""
        sp = self.snapshot_partition(partition)
        want = {off: i for i, off in enumerate(ref.offsets)}
        parts: list[bytes | None] = [None] * len(ref.offsets)
        own = consumer is None
        consumer = consumer or self._consumer()
        try:
            for m in self._read_range(consumer, sp, min(want), max(want) + 1):
                i = want.get(m.offset())
                if i is None:
                    continue
                if m.key() != chunk_key(operator_id, partition, ref.slot, i):
                    raise SnapshotError(f"chunk {i} of generation {ref.generation} was compacted away")
                parts[i] = decode_chunk(m.value(), ref, i)
        finally:
            if own:
                consumer.close()
        return join_chunks(parts, ref)

    def restore(self, operator_id: str, partition: int, *, accept=None) -> RestoreResult:
        """The newest snapshot that loads and that ``accept(ref, blob)`` approves.

        Tries the newest generation, then the previous one. ``accept`` raises (e.g.
        SnapshotError, MismatchError) to refuse a candidate; every refusal is logged and
        returned in ``refused``. ``blob`` is None when nothing usable was found.
        """
        result = RestoreResult(None, None)
        consumer = self._consumer()  # one reader for the manifest and the chunks
        try:
            manifest = self.read_manifest(operator_id, partition, consumer)
            result.manifest = manifest
            if manifest is None:
                return result
            for ref in (manifest.current, manifest.previous):
                if ref is None:
                    continue
                try:
                    blob = self.load_ref(operator_id, partition, ref, consumer)
                    if accept is not None:
                        accept(ref, blob)
                except (SnapshotError, ValueError) as exc:  # kernels refuse a bad blob with ValueError
                    log.error("refusing snapshot generation %d of %s[%d] (next_offset %s): %s",
                              ref.generation, operator_id, partition, ref.next_offset, exc)
                    result.refused.append((ref.generation, str(exc)))
                    continue
                result.blob, result.ref = blob, ref
                self._last[(operator_id, partition)] = (manifest.current.generation, ref)
                return result
            self._last[(operator_id, partition)] = (manifest.current.generation, None)
            return result
        finally:
            consumer.close()
