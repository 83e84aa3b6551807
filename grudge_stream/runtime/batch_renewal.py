"""The batch worker's clients that failed for good, replaced in place (``ClientRenewal``, a
part of ``BatchWorker``): a source consumer that failed fatally (``ConsumerFatal``: a static
member fenced by another with its ``group_instance_id``, say) and a transactional producer
the broker fenced or that is stuck inside a call (docs/operations.md, "A fenced static
member").
"""
from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException

from grudge_stream.exceptions import WorkerFault, exit_code
from grudge_stream.runtime.core import TXN_CALL_TIMEOUT_S, TransactionStuck, _resume

log = logging.getLogger("grudge_stream.batch")

# A producer the broker fenced: its transaction was aborted by the coordinator (timed out while
# the cluster was away), and only a new producer can go on.
_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}

# A consumer that fails fatally (a static member fenced by another with its group_instance_id)
# is replaced in place; this many times within the window, and the worker ends with EXIT_FAULT
# instead, for its orchestrator to restart (two live incarnations fencing each other, say).
CONSUMER_RENEWALS_MAX = 3
CONSUMER_RENEWALS_WINDOW_S = 300.0
# Closing a fatal consumer may wait on the broker; it is given this long, then left behind.
CONSUMER_CLOSE_LIMIT_S = 10.0


class ConsumerFatal(WorkerFault):
    """The source consumer failed for good (librdkafka's fatal error): it cannot consume,
    commit or rejoin, and only a new consumer can go on."""

    def __init__(self, err: KafkaError) -> None:
        super().__init__(err.str())
        self.error = err


def _fatal(err: object) -> bool:
    return isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL)


class ClientRenewal:
    """The consumer and producer renewals of ``BatchWorker``, one of its base classes."""

    _fenced_at = float("-inf")

    def _replace_consumer(self, exc: ConsumerFatal) -> None:
        """The consumer failed for good: typically a static member fenced because another
        consumer joined with its ``group_instance_id`` (a replaced pod whose old incarnation
        still ran, a session that timed out while the coordinator moved). As Kafka Streams
        replaces a dead stream thread: the partitions held are released without a snapshot
        or a commit (another member may own them by now; their state goes back to the last
        snapshot wherever they are assigned next), an open transaction is aborted, and a new
        consumer rejoins under the same ``group_instance_id`` (fencing the other incarnation,
        if one still runs). More than ``CONSUMER_RENEWALS_MAX`` renewals within
        ``CONSUMER_RENEWALS_WINDOW_S`` end the worker with ``EXIT_FAULT``."""
        self.core.metrics.consumer_fatal.inc()
        now = time.monotonic()
        self._consumer_renewals = [t for t in self._consumer_renewals if now - t < CONSUMER_RENEWALS_WINDOW_S]
        if len(self._consumer_renewals) >= CONSUMER_RENEWALS_MAX:
            log.error("the consumer failed for good again (%s): %d times within %.0f s; ending the worker "
                      "for a restart (exit %d)", exc, len(self._consumer_renewals) + 1,
                      CONSUMER_RENEWALS_WINDOW_S, exit_code(exc))
            self.core.checkpointer.no_more_snapshots = True
            raise exc
        self._consumer_renewals.append(now)
        held = sorted(set(self.core.slots) | self.core.assigned)
        log.error("the consumer failed for good (%s): a new consumer rejoins the group%s; the %d partitions "
                  "held are released without a snapshot and go back to their last snapshots",
                  exc, f" as {self.core.instance_id!r}" if self.core.instance_id else "", len(held))
        # A background snapshot in flight is dropped: its manifest is never written.
        w = self.core.checkpointer.writer
        if w is not None:
            w.cancelled.set()
            w.done.wait()
            self.core.checkpointer.writer = None
        self.core.checkpointer.queue.clear()
        txn = self.core.transactions.transaction
        if txn is not None and txn.open:
            try:
                _resume(lambda: self.core.transactions.producer.abort_transaction(TXN_CALL_TIMEOUT_S))
            except TransactionStuck as stuck:
                self._renew_producer(stuck, stuck=True)
            except KafkaException as kexc:
                if not (kexc.args and isinstance(kexc.args[0], KafkaError) and kexc.args[0].code() in _FENCED):
                    raise
                self._renew_producer(kexc)
            else:
                txn.open = False
                self.core.publisher.drop_unfinished()
            self.core.metrics.transactions_aborted.inc()
        self.reset_pending = False
        self.core.release(held)
        self.committed.clear()
        self._pending_commit = None
        self.core.in_group = False
        self.core.record_assignment()
        old = self.consumer
        self._close_native()
        self.consumer = Consumer(self._consumer_conf)
        self._open_native()
        if txn is not None:
            txn.group_metadata = self.consumer.consumer_group_metadata
        closer = threading.Thread(target=_close_quietly, args=(old,), name="grudge-consumer-close", daemon=True)
        closer.start()
        closer.join(CONSUMER_CLOSE_LIMIT_S)
        self.consumer.subscribe([self.topic], on_assign=self.on_assign, on_revoke=self.on_revoke)
        self.core.metrics.consumers_renewed.inc()

    def _renew_producer(self, exc: KafkaException | TransactionStuck, stuck: bool = False) -> None:
        """The broker aborted the open transaction itself and fenced the producer (the cluster
        was away longer than ``transaction_timeout_s``), or a transactional call blocked past
        its timeout (``stuck``): a new producer under the same transactional id, then the
        partitions held go back to their snapshots. Fenced again within a minute (or two
        transaction timeouts) of the last fencing means another live instance shares the
        transactional id (the same ``group_instance_id``): that ends the worker."""
        why = str(exc) if stuck else exc.args[0].str()
        now = time.monotonic()
        if not stuck:
            if now - self._fenced_at < max(60.0, 2 * self.core.sections.checkpointing.transaction_timeout_s):
                log.error("the transactional producer was fenced again right after its renewal (%s): "
                          "another instance runs with the same group_instance_id?", why)
                raise exc
            self._fenced_at = now
        log.warning("the transactional producer cannot go on (%s): a new producer takes over, the "
                    "outputs since the last commit are dropped, and the partitions held go back to "
                    "their last snapshots", why)
        self.core.renew_producer(stuck=stuck)
        self.core.metrics.producers_renewed.inc()


def _close_quietly(consumer: Consumer) -> None:
    try:
        consumer.close()
    except Exception as exc:  # noqa: BLE001 - a fatal consumer may refuse even that; it is dropped
        log.debug("closing the replaced consumer: %s", exc)
