"""A consumer group's committed offsets, read by a short-lived consumer of that group.

The consumer carries the group's id and never joins the group. It asks for stable offsets
(``isolation.level=read_committed``, KIP-447): while a transaction holding offsets of these
partitions is open, the broker does not answer an offset that may still move, and the call
times out instead. An answer of NOT_COORDINATOR (a coordinator that moved, or a broker that
has just restarted) goes to the consumer's group handle, which looks the coordinator up again.

The admin client's ``list_consumer_group_offsets`` is not used for this: librdkafka (2.12 and
the releases before it) hands that answer to a group handle the admin client does not have,
and the process dies with a segmentation fault. A worker asked for its group's offsets on
every assignment, so a broker restart that moved the group mid-rebalance killed it without a
line in its log.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def committed_offsets(client_config: dict[str, Any], group: str, topic: str, partitions: Iterable[int],
                      timeout_s: float = 15.0) -> dict[int, int]:
    """The committed offset of each of ``partitions`` of ``topic`` (a negative one: no commit).
    Raises ``KafkaException`` for the first partition answered with an error, and on a timeout
    (the broker unreachable, or an open transaction holding the offsets)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    conf = {"log_level": 3, **client_config, "group.id": group, "enable.auto.commit": False,
            "isolation.level": "read_committed"}
    consumer = Consumer(conf)
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
    finally:
        consumer.close()
    failed = [tp.error for tp in got if tp.error is not None]
    if failed:  # a coordinator still loading answers per partition: never read as "no commit"
        raise KafkaException(failed[0])
    return {tp.partition: tp.offset for tp in got}
