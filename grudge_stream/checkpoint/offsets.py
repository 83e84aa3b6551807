"""A snapshot partition's offsets, asked with retries: ``watermarks``.

The store's readers, replay's ranges and backfill ask a partition for its low and high
offsets right after a topic was made or while its leader moves; the transient errors of
those moments are retried here instead of failing the restore.
"""
from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

# A topic that was just created, a leader that is moving, metadata that is briefly stale
# (_UNKNOWN_PARTITION: the client's metadata lacks the partition during a broker bounce), brokers
# briefly unreachable: all pass in seconds on a healthy cluster.
_RETRIABLE = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
              KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError._ALL_BROKERS_DOWN,
              KafkaError._WAIT_COORD, KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS,
              KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
              KafkaError.OFFSET_NOT_AVAILABLE}


# Errors that mean the client's metadata is stale: it is refreshed before the next try.
_STALE_METADATA = {KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError.NOT_LEADER_FOR_PARTITION,
                   KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
                   KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH}


def watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
    """``(low, high)`` offsets of a partition, retrying the transient errors of a topic that was
    just created or whose leader is moving.

    On stale metadata it asks the consumer for the topic's metadata (``list_topics``): a
    consumer not assigned the partition never refreshes it otherwise, and kept answering
    ``_UNKNOWN_PARTITION`` for longer than the timeout after a broker's kill -9. So never pass
    a consumer from inside one of its own callbacks (confluent-kafka aborts; see
    runtime/batch.py)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=max(0.1, deadline - time.monotonic()),
                                                  cached=False)
        except KafkaException as exc:
            code = exc.args[0].code()
            if code not in _RETRIABLE or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            if code in _STALE_METADATA:
                try:
                    consumer.list_topics(tp.topic, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                except KafkaException:
                    pass  # the next try says what is wrong
