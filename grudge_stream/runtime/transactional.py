"""The exactly-once producer of one worker (``Transactions``), a part the worker core holds.

Owns: the transactional producer (None without exactly-once), the open ``Transaction``
of the interval (set by the batch adapter, which has the consumer's group metadata), and
the producers set aside while a call is still blocked inside them. It makes the producer
under the worker's transactional id and renews it when the broker fenced it for good.

The producer's users (the output publisher, the snapshot store) are switched to a renewed
producer by the core (``WorkerCore.renew_producer``), which owns them.
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Any

from grudge_stream.checkpoint import BROKER_ABORT_CHECK_INTERVAL_S
from grudge_stream.kafka.transactions import TXN_CALL_TIMEOUT_S, Transaction
from grudge_stream.kafka.transactions import resume as _resume
from grudge_stream.kafkaconf import producer_config
from grudge_stream.sections import Checkpointing, as_section
from grudge_stream.topology import Settings


class Transactions:
    """The transactional producer and transaction of a worker (see the module docstring).

    ``transactional_id`` is ``<app_id>-<group_instance_id>``, or the host and process id
    without a ``group_instance_id``."""

    def __init__(self, checkpointing: Checkpointing | Settings, app_id: str, instance_id: str | None,
                 bootstrap: str, client_config: dict, log: logging.Logger, *, exactly_once: bool = False) -> None:
        self.checkpointing = as_section(Checkpointing, checkpointing)
        self.app_id = app_id
        self.instance_id = instance_id
        self.bootstrap = bootstrap
        self.client_config = client_config
        self.log = log
        self.producer: Any = None
        self.stuck: list = []
        self.transaction: Transaction | None = None
        if exactly_once:
            self.producer = self.make_producer()

    def make_producer(self, renewal: bool = False) -> Any:
        """A transactional producer, its transactions initialized (blocking)."""
        from confluent_kafka import Producer

        txn_timeout_s = self.checkpointing.transaction_timeout_s
        if not self.instance_id and not renewal:
            self.log.warning("exactly_once without group_instance_id: the transactional id changes with "
                             "every restart, so a crashed worker's open transaction is not aborted at once "
                             "and a takeover may wait up to transaction_timeout_s + %g s",
                             BROKER_ABORT_CHECK_INTERVAL_S)
        txn_id = f"{self.app_id}-{self.instance_id or socket.gethostname() + '-' + str(os.getpid())}"
        producer = Producer(producer_config(self.client_config, bootstrap_servers=self.bootstrap, extra={
            "transactional.id": txn_id, "transaction.timeout.ms": int(txn_timeout_s * 1000)}))
        _resume(lambda: producer.init_transactions(TXN_CALL_TIMEOUT_S))  # a cluster just back may be slow
        return producer

    def renew(self, stuck: bool = False) -> Any:
        """Replace a producer fenced for good (or, ``stuck``, one a call is still blocked in)
        by a new one under the same transactional id; the new producer. The old one's unsent
        records are purged and forgotten; a stuck one is set aside, never destroyed under its
        call (the new one fences it)."""
        old = self.producer
        if stuck:
            self.stuck.append(old)
        else:
            try:
                old.purge()
            except Exception:  # a fenced producer may refuse even that; it is dropped either way
                pass
        self.producer = self.make_producer(renewal=True)
        if self.transaction is not None:
            self.transaction.producer = self.producer
            self.transaction.open = False
        return self.producer
