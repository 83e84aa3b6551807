"""Restoring past open transactions: where a ``read_committed`` scan for the newest manifest
must end (``OpenTransactionReads``, a part of ``CheckpointStore``).

Restore reads ``read_committed``, and such a reader stops at the partition's
last stable offset (LSO): before the first record of the oldest transaction
still open there. A manifest committed *after* another producer's open
transaction (a crashed exactly-once worker's, say) is invisible until that
transaction ends, so restore first compares the LSO with the log end and,
when a manifest of the partition being restored lies between them, waits a
bounded time (``open_transaction_wait_s``) for the open transaction to end —
the broker aborts it after its ``transaction.timeout.ms`` — and raises
``CheckpointError`` rather than adopt the stale older snapshot.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

from confluent_kafka import Consumer, TopicPartition

from grudge_stream.checkpoint.offsets import watermarks
from grudge_stream.exceptions import CheckpointError

log = logging.getLogger("grudge_stream.checkpoint")

# How long a restore waits for another producer's transaction that hides a newer manifest
# (above, docs/checkpoints.md "Open transactions"). The broker aborts a transaction
# whose producer went away once its transaction.timeout.ms has passed, checking every
# transaction.abort.timed.out.transaction.cleanup.interval.ms; then the abort markers are
# written. Defaults: the batch runtime's transaction_timeout_s (60 s), Kafka's check interval
# (10 s), and a margin for the markers, a busy coordinator and the clock skew of a takeover.
DEFAULT_TRANSACTION_TIMEOUT_S = 60.0
BROKER_ABORT_CHECK_INTERVAL_S = 10.0
OPEN_TRANSACTION_MARGIN_S = 20.0
DEFAULT_OPEN_TRANSACTION_WAIT_S = (DEFAULT_TRANSACTION_TIMEOUT_S + BROKER_ABORT_CHECK_INTERVAL_S
                                   + OPEN_TRANSACTION_MARGIN_S)
# Commit markers trail a commit by milliseconds: stay quiet for this long before warning.
_OPEN_TRANSACTION_GRACE_S = 1.0
_OPEN_TRANSACTION_PROGRESS_S = 10.0


class OpenTransactionReads:
    """The open-transaction reads of ``CheckpointStore``, its base class: the true log end
    of a snapshot partition, the manifests behind other producers' open transactions, and
    the end of the committed records a restore scans up to (``_committed_end``)."""

    # Set by CheckpointStore.__init__; ``_read_range`` is its reader of an offset range.
    topic: str
    bootstrap_servers: str
    timeout_s: float
    open_transaction_wait_s: float
    _consumer_config: dict
    _peeker: Consumer | None
    _peeker_lock: threading.Lock
    _read_range: Callable[[Consumer, int, int, int], Iterable]

    def _peek_consumer(self) -> Consumer:
        if self._peeker is None:
            self._peeker = Consumer({**self._consumer_config, "isolation.level": "read_uncommitted"})
        return self._peeker

    def _log_end(self, sp: int) -> int:
        """The true end of snapshot partition ``sp`` (its high watermark), open transactions
        included; ``watermarks`` of the read_committed reader gives the last stable offset."""
        with self._peeker_lock:
            return watermarks(self._peek_consumer(), TopicPartition(self.topic, sp), self.timeout_s)[1]

    def _manifest_between(self, sp: int, key: bytes, start: int, end: int) -> int | None:
        """Offset of the first record keyed ``key`` in [start, end) of ``sp``, read uncommitted
        (open, aborted and committed alike), or None."""
        with self._peeker_lock:
            peeker = self._peek_consumer()
            try:
                for m in self._read_range(peeker, sp, start, end):
                    if m.key() == key:
                        return m.offset()
            finally:
                peeker.unassign()  # the reader is kept: no fetching in the background
        return None

    def _committed_end(self, consumer: Consumer, operator_id: str, partition: int, sp: int,
                       key: bytes) -> tuple[int, int]:
        """``(low, end)``: reading [low, end) read_committed finds the newest committed manifest.

        A read_committed reader sees the partition up to its last stable offset (LSO), the
        first offset of the oldest transaction still open there. Records past it — among
        them manifests other producers committed after that transaction began — stay hidden
        until it commits or aborts. So: the LSO, then the log end ``hw`` (read_uncommitted).
        Equal (no open transaction: every normal restore, one extra offset query), or no
        record keyed like this manifest anywhere in [LSO, hw): the newest committed manifest
        is below the LSO and the scan can start there. Otherwise wait, polling the LSO, until
        every transaction open at the start has ended (LSO >= hw) or the records past the
        new LSO hold no such manifest; after ``open_transaction_wait_s`` raise
        CheckpointError — never fall back to the older manifest below the LSO.
        """
        tp = TopicPartition(self.topic, sp)
        # The LSO first: records appended between the two queries can only make it look behind
        # (asked again once; at worst a scan of them and a short wait), never hide a transaction.
        # (The other order made a just-created reader's first offset query stall ~700 ms now
        # and then: another client's request while its first connection was being set up.)
        low, lso = watermarks(consumer, tp, self.timeout_s)
        hw = self._log_end(sp)
        if lso < hw:  # an open transaction, or records appended between the two queries?
            low, lso = watermarks(consumer, tp, self.timeout_s)
        if lso >= hw:
            return low, lso
        t0 = time.monotonic()
        first_lso, checked, behind = lso, -1, None
        warned, last_note = False, t0
        while True:
            if lso >= hw:
                break
            if lso != checked:
                checked = lso
                behind = self._manifest_between(sp, key, lso, hw)
                if behind is None:
                    if lso == first_lso:
                        log.info("%s[%d] has a transaction open since offset %d (log end %d) that holds no "
                                 "manifest of %s[%d]: its newest committed manifest is below it",
                                 self.topic, sp, lso, hw, operator_id, partition)
                    break
            now = time.monotonic()
            waited = now - t0
            if waited >= self.open_transaction_wait_s:
                raise CheckpointError(
                    f"cannot restore {operator_id}[{partition}]: snapshot partition {self.topic}[{sp}] has "
                    f"a transaction open since offset {lso} (last stable offset {lso}, log end {hw}) that "
                    f"hides the snapshot manifest at offset {behind}, and it did not end within "
                    f"{self.open_transaction_wait_s:g} s. The snapshot readable below it may be older than "
                    "the newest committed one, and resuming from it would process records twice, so it is "
                    "not used. Operator action: if the producer that opened the transaction is gone (a "
                    "crashed worker with another transactional id), abort it: kafka-transactions.sh "
                    f"--bootstrap-server {self.bootstrap_servers} abort --topic {self.topic} --partition "
                    f"{sp} --start-offset {lso} (find-hanging / describe-producers show it), then restart "
                    "the worker; or raise open_transaction_wait_s above the writers' transaction timeout "
                    "plus the broker's transaction.abort.timed.out.transaction.cleanup.interval.ms."
                )
            if not warned and waited >= min(_OPEN_TRANSACTION_GRACE_S, self.open_transaction_wait_s / 2):
                log.warning(
                    "restore of %s[%d] waits for an open transaction on %s[%d]: last stable offset %d, "
                    "log end %d, a manifest of this partition at offset %d is behind it; waiting at most "
                    "%g s for it to commit or be aborted (the broker aborts it once its "
                    "transaction.timeout.ms has passed)",
                    operator_id, partition, self.topic, sp, lso, hw, behind, self.open_transaction_wait_s)
                warned, last_note = True, now
            elif warned and now - last_note >= _OPEN_TRANSACTION_PROGRESS_S:
                log.warning("restore of %s[%d] still waiting for the open transaction on %s[%d]: last stable "
                            "offset %d, log end %d, %.0f s waited, at most %.0f s more", operator_id, partition,
                            self.topic, sp, lso, hw, waited, self.open_transaction_wait_s - waited)
                last_note = now
            time.sleep(0.05 if waited < _OPEN_TRANSACTION_GRACE_S else 0.25)
            low, lso = watermarks(consumer, tp, self.timeout_s)
        if warned or time.monotonic() - t0 > 0.5:
            log.info("open transaction on %s[%d] no longer hides a manifest of %s[%d] after %.1f s "
                     "(last stable offset %d -> %d, log end then %d)", self.topic, sp, operator_id, partition,
                     time.monotonic() - t0, first_lso, lso, hw)
        return low, lso
