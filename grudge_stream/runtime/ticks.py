"""Tick records into quiet source partitions, so their bans clear without traffic.

Scores live in event time: a partition's watermark moves only with its records, and a
raised key is cleared by a sweep at a later watermark. On a partition that receives
nothing, a ban would stay until its next record. With ``idle_tick_s`` set, a worker
writes a tick record (key ``TICK_KEY``, no value, the wall clock as its timestamp) into
each of its partitions that holds raised keys and has had no record for ``idle_tick_s``.
Operators read a tick as "time has come this far": the watermark moves to it and the
sweep runs; no key changes.

The tick is a record of the source partition itself, so a replay, and a restore that
replays the records after its snapshot, read it where the live worker did and compute
the same state and outputs: the idle advance is recorded, not guessed from a clock.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from grudge_stream.kafkaconf import producer_config
from grudge_stream.operators.records import TICK_HEADER, TICK_KEY

log = logging.getLogger("grudge_stream.runtime")


class IdleTicks:
    """Sends the ticks of one worker's source partitions (``check`` once per loop turn)."""

    CHECK_S = 1.0

    def __init__(self, topic: str, after_s: float, client_config: Mapping[str, Any], counter: Any = None) -> None:
        self.topic = topic
        self.after_s = float(after_s)
        self._client_config = dict(client_config)
        self._counter = counter
        # Per partition: the next offset last seen, and when it last changed (monotonic).
        self._seen: dict[int, tuple[int | None, float]] = {}
        self._checked = 0.0
        self._producer: Any = None
        self.sent = 0
        self.off_reason: str | None = None

    @property
    def enabled(self) -> bool:
        return self.after_s > 0 and self.off_reason is None

    def check(self, slots: Mapping[int, Any], now: float | None = None) -> list[int]:
        """Tick every held partition whose operator wants one and whose position has not
        moved for ``after_s``; the partitions ticked."""
        if not self.enabled:
            return []
        now = time.monotonic() if now is None else now
        if now - self._checked < self.CHECK_S:
            return []
        self._checked = now
        for p in [p for p in self._seen if p not in slots]:
            del self._seen[p]
        ticked = []
        for p, slot in list(slots.items()):
            op = slot.operator
            pos = op.next_offset
            seen = self._seen.get(p)
            if seen is None or seen[0] != pos:
                self._seen[p] = (pos, now)
            elif now - seen[1] >= self.after_s and op.wants_tick():
                self._send(p)
                self._seen[p] = (pos, now)
                ticked.append(p)
        if self._producer is not None:
            self._producer.poll(0)
        return ticked

    def _send(self, partition: int) -> None:
        from confluent_kafka import KafkaException, Producer

        if self._producer is None:
            self._producer = Producer(producer_config(self._client_config, linger_ms=0))
        try:
            self._producer.produce(self.topic, key=TICK_KEY, value=None, partition=partition,
                                   timestamp=time.time_ns() // 1_000_000, headers=[(TICK_HEADER, b"1")],
                                   on_delivery=self._delivered)
        except (KafkaException, BufferError) as exc:
            log.warning("idle tick into %s[%d] not sent: %s", self.topic, partition, exc)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.sent += 1
            if self._counter is not None:
                self._counter.inc()
            return
        name = err.name() if hasattr(err, "name") else str(err)
        if "AUTHORIZATION" in name:
            # Without WRITE on the source topic a tick can never land: say so once.
            self.off_reason = str(err)
            log.error("idle ticks off: this worker may not write to %s (%s); quiet partitions keep their "
                      "raised keys until their next record. Grant WRITE on the topic or set idle_tick_s=0",
                      self.topic, err)
        else:
            log.warning("idle tick into %s[%s] not delivered: %s", self.topic, msg.partition(), err)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(2)
            self._producer = None
