"""The batch worker's commits, transactions and checkpoints (``BatchCommits``, a part of
``BatchWorker``): offsets committed apart from snapshots once the outputs before them are
delivered (at-least-once), or with the outputs in one transaction every
``commit_interval_s`` (exactly-once), a transaction that failed aborted and the held
partitions reset to their snapshots, and the blocking checkpoint of revocation and shutdown
(docs/runtime.md, "Commits and snapshots").
"""
from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from grudge_stream.exceptions import CheckpointError, DeliveryError
from grudge_stream.runtime.batch_renewal import _FENCED, ConsumerFatal, _fatal
from grudge_stream.runtime.core import TXN_CALL_TIMEOUT_S, TransactionStuck, _resume

log = logging.getLogger("grudge_stream.batch")

_COMMIT_LATER = {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
                 KafkaError._WAIT_COORD, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                 KafkaError.REQUEST_TIMED_OUT}


class BatchCommits:
    """The commits, transactions and checkpoints of ``BatchWorker``, one of its base classes."""

    reset_pending = False

    def commit_offsets(self, offsets: dict[int, int]) -> None:
        try:
            self.consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                                 asynchronous=False)
        except KafkaException as exc:
            # A cooperative rebalance in progress (the consumer keeps consuming during one), a
            # coordinator that moved: the next round commits again (a restore then replays a
            # little more, silently up to the older commit).
            err = exc.args[0]
            if _fatal(err):
                raise ConsumerFatal(err) from None
            if not (err.retriable() or err.code() in _COMMIT_LATER):
                raise
            log.info("offset commit deferred to the next round: %s", err.str())
            return
        self.committed.update(offsets)
        self.core.metrics.commits.labels(self.core.topology.operator_id).inc()

    def checkpoint(self, partitions=None) -> None:
        """On revocation and shutdown (blocking): outputs delivered (or in the transaction),
        every changed partition of ``partitions`` snapshotted, and every offset reached
        committed."""
        if self.core.checkpointer.no_more_snapshots:
            return
        parts = sorted(self.core.slots) if partitions is None else [p for p in partitions if p in self.core.slots]
        dirty = self.core.dirty(parts)
        moved = {p: o for p, o in self._moved().items() if p in parts}
        txn = self.core.transactions.transaction
        if txn is not None:
            if not txn.open and not dirty and not moved:
                return
            txn.begin()
        elif moved and not dirty:
            self.core.publisher.flush(should_stop=self.is_stopping)
        offsets = {**moved, **self.core.write_snapshots(dirty)}
        if txn is not None:
            txn.commit(self.topic, offsets)
            self.committed.update(offsets)
            self.core.metrics.commits.labels(self.core.topology.operator_id).inc()
        elif offsets:
            self.commit_offsets(offsets)
        self.core.checkpointed(offsets)

    def _moved(self) -> dict[int, int]:
        """Each slot's next offset where it moved past the last commit."""
        return {p: s.operator.next_offset for p, s in self.core.slots.items()
                if s.operator.next_offset is not None and s.operator.next_offset > self.committed.get(p, -1)}

    def _commit_if_due(self) -> None:
        """At-least-once: every ``commit_interval_s`` note the offsets reached and the output
        stream's position; commit them (asynchronously) once every output before that position
        is delivered. Never waits, except to re-send refused outputs."""
        pending = self._pending_commit
        publisher = self.core.publisher
        if pending is not None:
            if publisher.has_failures():
                try:
                    publisher.flush(should_stop=self.is_stopping)
                except DeliveryError as exc:
                    self.core.round_failed(exc)
                    return
            mark, offsets = pending
            if publisher.delivered_through(mark):
                offsets = {p: o for p, o in offsets.items() if p in self.core.slots}
                if offsets:
                    try:
                        self.consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                                             asynchronous=True)
                    except KafkaException as exc:  # a rebalance in progress, say: the next interval
                        if _fatal(exc.args[0]):
                            raise ConsumerFatal(exc.args[0]) from None
                        log.info("offset commit deferred to the next interval: %s", exc.args[0].str())
                    else:
                        self.committed.update(offsets)
                        self.core.metrics.commits.labels(self.core.topology.operator_id).inc()
                self._pending_commit = None
        if self._pending_commit is None and self.core.limits.cadence.due():
            self.core.limits.cadence.done()
            moved = self._moved()
            if moved:
                self._pending_commit = (publisher.mark(), moved)

    def _transaction_round(self) -> None:
        """Exactly-once: every ``commit_interval_s`` the open transaction commits the outputs
        and the offsets reached. Periodic snapshots are not in it: they are written in the
        background like at-least-once ones, their manifests once a transaction holding every
        output before their copy has committed (``WorkerCore.finish_writer``)."""
        txn = self.core.transactions.transaction
        self.core.limits.cadence.done()
        moved = self._moved()
        if not txn.open and not moved:
            return
        try:
            txn.begin()
            txn.commit(self.topic, moved)
        except (CheckpointError, DeliveryError) as exc:
            self.core.round_failed(exc)  # raises: a failed transaction ends the worker
        except (KafkaException, TransactionStuck) as exc:
            self.abort_transaction(exc)
            self.reset_held()
            return
        self.committed.update(moved)
        self.core.metrics.commits.labels(self.core.topology.operator_id).inc()

    def abort_transaction(self, exc: KafkaException | TransactionStuck) -> None:
        """Exactly-once: the open transaction failed in a way that only aborts it (the member
        fell out of the group and its generation is gone, the transaction timed out while the
        cluster was away). Abort it and carry on, as Kafka Streams does with a migrated task:
        every partition still held goes back to its last snapshot before its next record,
        since its state is ahead of the aborted outputs (``reset_held``). A producer the broker
        fenced, or one stuck in a call, is replaced first (``_renew_producer``); any other
        fatal error is raised: the worker ends (one line, exit 2)."""
        err = exc.args[0] if exc.args else None
        if self.core.transactions.transaction is None:
            raise exc
        if isinstance(exc, TransactionStuck):
            self._renew_producer(exc, stuck=True)
        elif not isinstance(err, KafkaError):
            raise exc
        elif err.fatal() and err.code() in _FENCED:
            self._renew_producer(exc)
        elif err.fatal() or not err.txn_requires_abort():
            raise exc
        else:
            log.warning("transaction aborted (%s): the outputs since the last commit are dropped, and the "
                        "partitions held go back to their last snapshots", err.str())
            try:
                _resume(lambda: self.core.transactions.producer.abort_transaction(TXN_CALL_TIMEOUT_S))
            except TransactionStuck as stuck:
                self._renew_producer(stuck, stuck=True)
            else:
                self.core.transactions.transaction.open = False
                self.core.publisher.drop_unfinished()
        w = self.core.checkpointer.writer
        if w is not None:  # its manifest would cover outputs that were just aborted
            w.cancelled.set()
            w.done.wait()
            self.core.checkpointer.writer = None
        self.core.checkpointer.queue.clear()
        self.core.metrics.transactions_aborted.inc()
        self.reset_pending = True

    def reset_held(self) -> list[int]:
        """After an aborted transaction, on the loop (not in a rebalance callback): every
        held partition restored again from its last snapshot and the consumer sought there;
        the records up to the group's committed offset are replayed silently, as after any
        restore. The partitions reset."""
        self.reset_pending = False
        parts = sorted(self.core.slots)
        if not parts:
            return parts
        committed = self.core.group_committed(parts)
        for p in parts:
            self.core.slots.pop(p, None)
            self.core.store.forget(self.core.topology.operator_id, p)
            self.core.limits.limits.pop(p, None)
            self.consumer.seek(TopicPartition(self.topic, p, self._restore_slot(p, committed.get(p))))
        log.info("partitions %s restored again after the aborted transaction", parts)
        self.core.record_assignment()
        return parts
