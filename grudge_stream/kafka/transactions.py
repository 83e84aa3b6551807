"""Exactly-once transactions over a confluent-kafka producer: the transaction of a checkpoint
interval, and transactional calls that are resumed while they fail retriably and given up when
they block (the Kafka layer: imports nothing of grudge-stream above the exceptions)."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from grudge_stream.exceptions import WorkerFault

__all__ = ["Transaction", "TransactionStuck", "TXN_CALL_TIMEOUT_S", "TXN_CALL_LIMIT_S", "resume", "bounded"]


class Transaction:
    """The exactly-once transaction of a checkpoint interval: outputs, snapshot chunks and
    manifests, and the source offsets the snapshots cover (``send_offsets_to_transaction``),
    committed together at the end of the round."""

    def __init__(self, producer, group_metadata: Callable[[], Any]) -> None:
        self.producer = producer
        self.group_metadata = group_metadata
        self.open = False
        self.commits = 0  # transactions committed so far

    def begin(self) -> None:
        if not self.open:
            self.producer.begin_transaction()
            self.open = True

    def commit(self, topic: str, offsets: dict[int, int]) -> None:
        from confluent_kafka import TopicPartition

        if offsets:
            parts = [TopicPartition(topic, p, o) for p, o in offsets.items()]
            resume(lambda: self.producer.send_offsets_to_transaction(parts, self.group_metadata(),
                                                                       TXN_CALL_TIMEOUT_S))
        resume(lambda: self.producer.commit_transaction(TXN_CALL_TIMEOUT_S))
        self.open = False
        self.commits += 1


# A transactional call's own timeout (it then fails retriably and is called again), and how
# long it may block before the producer counts as stuck: librdkafka can block past the call's
# timeout when the group coordinator went away with the whole cluster (confluentinc/librdkafka
# issues 5456 and 5511).
TXN_CALL_TIMEOUT_S = 10
TXN_CALL_LIMIT_S = TXN_CALL_TIMEOUT_S + 10


class TransactionStuck(WorkerFault):
    """A transactional call blocked past its own timeout: the producer cannot be used again
    and is replaced (``WorkerCore.renew_producer``)."""


def resume(call: Callable[[], Any], limit_s: float = TXN_CALL_LIMIT_S) -> None:
    """A transactional call, called again while it fails retriably: a cluster that is down
    makes commit_transaction time out with "retry call to resume", and librdkafka resumes the
    same operation on the next call (the worker ended there during a 45 s outage). Each call
    runs on a helper thread and is given up after ``limit_s``: ``TransactionStuck``."""
    from confluent_kafka import KafkaException

    while True:
        try:
            return bounded(call, limit_s)
        except KafkaException as exc:
            err = exc.args[0]
            if not err.retriable() or err.fatal() or err.txn_requires_abort():
                raise
            logging.getLogger("grudge_stream.runtime").warning(
                "transaction not committed yet (%s); calling again", err.str())


def bounded(call: Callable[[], Any], limit_s: float) -> Any:
    """``call()`` on a helper thread, its result or its exception; ``TransactionStuck`` when
    it has not returned after ``limit_s`` (the thread is left blocked inside the client)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    t = threading.Thread(target=run, name="grudge-transaction-call", daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        raise TransactionStuck(f"a transactional call blocked for more than {limit_s:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("result")
