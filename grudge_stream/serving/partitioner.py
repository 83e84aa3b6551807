"""Which partition a key belongs to, as its producers placed it, and the check that the
source topic is partitioned that way."""
from __future__ import annotations

import logging
import zlib
from typing import Any

from grudge_stream._cyext._hashing import kafka_murmur2
from grudge_stream.exceptions import ConfigError
from grudge_stream.operators.records import TICK_KEY

log = logging.getLogger("grudge_stream.serving")

PARTITIONERS = ("murmur2", "crc32")


# -- partitioners ----------------------------------------------------------------------------------

def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) as an unsigned 32-bit int."""
    return kafka_murmur2(data)


def partition_for(key: bytes, partitions: int, partitioner: str = "murmur2") -> int:
    """The partition a producer using ``partitioner`` writes ``key`` to.

    ``murmur2``: ``(murmur2(key) & 0x7fffffff) % partitions`` (Java's ``toPositive``);
    ``crc32``: ``crc32(key) % partitions`` (librdkafka's ``consistent``; its default
    ``consistent_random`` differs only for empty keys, which it spreads at random)."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    if partitioner == "murmur2":
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    if partitioner == "crc32":
        return zlib.crc32(key) % partitions
    raise ConfigError(f"key_partitioner must be one of {PARTITIONERS}, not {partitioner!r}")


class PartitionerCheck:
    """Samples the keys each partition's records carry and checks that ``key_partitioner``
    puts them there: a producer on another partitioner (librdkafka's default crc32 under a
    murmur2 setting, say) makes every score answer read a partition that never saw the key,
    a confident zero. Per batch and partition at most ``SAMPLE`` keys are hashed (the pure
    Python partitioners: microseconds). Counts go to ``grudge_partitioner_checked_total`` and
    ``grudge_partitioner_mismatches_total`` per partition; the first mismatch logs one
    WARNING with the fix; ``status()`` (in ``/ready`` and, unless verified, in every score
    answer) is ``unverified`` (no keyed record checked yet), ``verified`` or ``mismatched``."""

    SAMPLE = 8

    def __init__(self, partitioner: str, topic: str = "", metrics: Any = None) -> None:
        if partitioner not in PARTITIONERS:
            raise ConfigError(f"key_partitioner must be one of {PARTITIONERS}, not {partitioner!r}")
        self.partitioner = partitioner
        self.other = next(x for x in PARTITIONERS if x != partitioner)
        self.topic = topic
        self.metrics = metrics
        self.checked = 0
        self.mismatched = 0
        self.other_matches = 0
        self.by_partition: dict[int, int] = {}
        self._warned = False

    def check(self, partition: int, partitions: int, keys: list) -> None:
        if not keys or partitions < 2:
            return
        step = max(1, len(keys) // self.SAMPLE)
        checked = bad = 0
        for k in keys[::step][:self.SAMPLE]:
            if not k or k == TICK_KEY:
                # Empty keys are spread at random by some partitioners; ticks are written to
                # the quiet partition itself (grudge_stream.runtime.ticks): nothing to check.
                continue
            checked += 1
            if partition_for(k, partitions, self.partitioner) != partition:
                bad += 1
                if partition_for(k, partitions, self.other) == partition:
                    self.other_matches += 1
        self.checked += checked
        if self.metrics is not None and checked:
            self.metrics.partitioner_checked.labels(str(partition)).inc(checked)
        if not bad:
            return
        self.mismatched += bad
        self.by_partition[partition] = self.by_partition.get(partition, 0) + bad
        if self.metrics is not None:
            self.metrics.partitioner_mismatches.labels(str(partition)).inc(bad)
        if not self._warned:
            self._warned = True
            hint = (f"they look {self.other}-partitioned: set key_partitioner={self.other}, or produce with "
                    f"the {self.partitioner} partitioner" if self.other_matches else
                    "they are not keyed by either partitioner (an explicit partition?)")
            log.warning("records of %s[%d] are not where key_partitioner=%s puts their keys (%d of %d sampled "
                        "keys so far): score queries for those keys read a partition that never saw them. "
                        "%s (confluent-kafka / librdkafka: partitioner=murmur2_random is Kafka's default "
                        "murmur2).", self.topic, partition, self.partitioner, bad, checked, hint)

    def status(self) -> str:
        if self.mismatched:
            return "mismatched"
        return "verified" if self.checked else "unverified"

    def report(self) -> dict:
        return {"name": self.partitioner, "status": self.status(), "checked": self.checked,
                "mismatched": self.mismatched, "mismatched_partitions": sorted(self.by_partition)}
