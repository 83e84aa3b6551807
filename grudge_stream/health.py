"""Health signals both runtimes share: broker reachability for ``/ready``, and a log line
that says why a starting worker waits for its partitions."""
from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

log = logging.getLogger("grudge_stream.health")


class BrokerProbe:
    """Whether the cluster answers a metadata request, asked in the background at most every
    ``interval_s``: ``/ready`` reads the cached answer and never waits on the network."""

    def __init__(self, client_config: dict, topic: str, interval_s: float = 5.0, timeout_s: float = 3.0) -> None:
        self._conf = {**client_config, "log_level": 0}
        self.topic = topic
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.reachable = True  # until a probe says otherwise
        self.error: str | None = None
        self._checked = 0.0
        self._running = False
        self._lock = threading.Lock()
        self._admin: AdminClient | None = None

    def ok(self) -> bool:
        with self._lock:
            start = not self._running and time.monotonic() - self._checked >= self.interval_s
            if start:
                self._running = True
        if start:
            threading.Thread(target=self._probe, name="grudge-broker-probe", daemon=True).start()
        return self.reachable

    def _probe(self) -> None:
        try:
            if self._admin is None:
                self._admin = AdminClient(self._conf)
            self._admin.list_topics(topic=self.topic, timeout=self.timeout_s)
            if not self.reachable:
                log.info("the Kafka cluster answers again")
            self.reachable, self.error = True, None
        except KafkaException as exc:
            if self.reachable:
                log.warning("the Kafka cluster does not answer (%s): /ready says 503 until it does", exc)
            self.reachable, self.error = False, str(exc)
        finally:
            with self._lock:
                self._checked = time.monotonic()
                self._running = False


def readiness(assigned, slots, broker: BrokerProbe, in_group: bool = False) -> tuple[int, dict]:
    """``/ready`` of either runtime: 200 once every assigned partition is restored and the
    cluster answers, else 503; the body says which partitions are assigned and restored.

    ``in_group``: the group gave this member an assignment, possibly empty. A member with no
    partitions (more replicas than partitions) is ready: it is in the group, takes over a
    partition at the next rebalance and forwards score queries to the owners."""
    restored = all(p in slots for p in assigned)
    ready = (bool(assigned) and restored or not assigned and in_group) and broker.ok()
    body = {"ready": ready, "assigned": sorted(assigned), "restored": sorted(p for p in assigned if p in slots),
            "idle": in_group and not assigned, "broker": broker.reachable, "broker_error": broker.error}
    return (200 if ready else 503), body


class AssignmentWatch:
    """Logs, every ``every_s`` while a started worker holds no partition, why it may wait: a
    member that left without saying so (kill -9, a lost pod) keeps its partitions until the
    group's session timeout passes, and with static membership until it comes back."""

    def __init__(self, session_timeout_s: float, static: bool, every_s: float = 10.0) -> None:
        self.session_timeout_s = session_timeout_s
        self.static = static
        self.every_s = every_s
        self.started = time.monotonic()
        self._last = self.started

    def tick(self, assigned: int) -> None:
        if assigned:
            self.started = self._last = time.monotonic()
            return
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        log.info("no partitions assigned yet after %.0f s: the group waits for members that left without "
                 "leaving (a killed worker) to time out, up to session_timeout_s=%g s%s, or every partition "
                 "is taken by other workers", now - self.started, self.session_timeout_s,
                 " (static membership: until the same group_instance_id returns)" if self.static else "")
