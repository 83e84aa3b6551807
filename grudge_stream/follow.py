"""Following whole topics from the beginning, in a background thread: the overrides table,
the alert views of ``grudge_stream.client`` and the score-query members directory all
read small compacted topics this way."""
from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from confluent_kafka import Consumer

log = logging.getLogger("grudge_stream.follow")


class TopicFollower:
    """Reads whole topics from the beginning and keeps following them, in a daemon thread.

    No consumer group offsets (a throw-away group id, no commits): every follower
    reads everything. ``handle(topic, key, value)`` is called on the follower's
    thread for every record in order per partition; ``caught_up`` is set once the
    follower has read up to the log ends it saw at start (the bootstrap); ``tick()``
    (optional) runs after every poll.
    """

    def __init__(self, bootstrap_servers: str, topics: list[str], handle: Callable[[str, bytes | None, bytes | None], None],
                 *, client_config: dict[str, Any] | None = None, tick: Callable[[], None] | None = None,
                 name: str = "grudge-follower", poll_s: float = 0.1, isolation: str = "read_committed") -> None:
        self.topics = list(topics)
        self.handle = handle
        self.tick = tick
        self.poll_s = poll_s
        self.name = name
        self._conf = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"grudge-follower-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.partition.eof": False,
            "log_level": 3,
            **(client_config or {}),
        }
        self.caught_up = threading.Event()
        self.stopped = threading.Event()
        self.error: str | None = None
        self.records = 0
        self._thread: threading.Thread | None = None
        self._ends: dict[tuple[str, int], int] = {}
        self._assigned: set[tuple[str, int]] = set()

    def start(self) -> "TopicFollower":
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def wait_caught_up(self, timeout_s: float) -> bool:
        return self.caught_up.wait(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _assign_new(self, consumer: Consumer) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        md = consumer.list_topics(timeout=10)
        new = []
        for t in self.topics:
            tm = md.topics.get(t)
            if tm is None or tm.error is not None:
                continue
            for p in tm.partitions:
                if (t, p) not in self._assigned:
                    new.append(TopicPartition(t, p, OFFSET_BEGINNING))
        if new:
            # All or nothing: a failure (a just-created topic without a leader yet) retries
            # every partition at the next metadata round.
            ends = {}
            for tp in new:
                low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10)
                if high > low:
                    ends[(tp.topic, tp.partition)] = high
            consumer.incremental_assign(new)
            self._ends.update(ends)
            self._assigned.update((tp.topic, tp.partition) for tp in new)

    def _run(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        consumer = None
        next_meta = 0.0
        try:
            while not self.stopped.is_set():
                try:
                    if consumer is None:
                        consumer = Consumer(self._conf)
                    now = time.monotonic()
                    if now >= next_meta:
                        # New partitions (or a topic created after we started) join the read.
                        self._assign_new(consumer)
                        next_meta = now + (30.0 if self._assigned else 2.0)
                    msgs = consumer.consume(500, timeout=self.poll_s)
                except KafkaException as exc:
                    self.error = str(exc)
                    log.warning("%s: %s; retrying", self.name, exc)
                    next_meta = 0.0
                    time.sleep(1.0)
                    continue
                for m in msgs:
                    if m.error() is not None:
                        continue
                    self.records += 1
                    topic, partition, offset = m.topic() or "", m.partition() or 0, m.offset() or 0
                    try:
                        self.handle(topic, m.key(), m.value())
                    except Exception:  # noqa: BLE001 - one bad record must not stop the follower
                        log.exception("%s: handling a record of %s failed", self.name, topic)
                    tp = (topic, partition)
                    end = self._ends.get(tp)
                    if end is not None and offset + 1 >= end:
                        del self._ends[tp]
                if not self.caught_up.is_set() and self._ends:
                    self._check_ends(consumer)
                if not self._ends and not self.caught_up.is_set():
                    self.caught_up.set()  # read to the start's log ends (or nothing to read)
                if self.tick is not None:
                    try:
                        self.tick()
                    except Exception:  # noqa: BLE001
                        log.exception("%s: tick failed", self.name)
        finally:
            if consumer is not None:
                consumer.close()

    def _check_ends(self, consumer: Consumer) -> None:
        """A bootstrap end may never be reached as a record offset (compaction, transaction
        markers): compare positions too."""
        from confluent_kafka import TopicPartition

        tps = [TopicPartition(t, p) for t, p in self._ends]
        try:
            for tp in consumer.position(tps):
                if tp.offset >= 0 and tp.offset >= self._ends.get((tp.topic, tp.partition), 0):
                    self._ends.pop((tp.topic, tp.partition), None)
        except Exception:  # noqa: BLE001 - positions are not known before the first fetch
            pass
