"""The members directory: which worker holds which partition, and the URL it answers at."""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Iterable

log = logging.getLogger("grudge_stream.serving")

MEMBERS_KIND = "members"  # the entry kind a signed members record's MAC covers (grudge_stream.signing)
MEMBERS_TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                        "segment.ms": "600000"}


def advertised_url(settings: Any) -> str:
    """The URL other workers forward to: ``advertised_url``, else http://<web_host>:<web_port>
    (the host name when the server binds every address); of a ``Serving`` section, or of the
    ``Settings`` it is read from."""
    from grudge_stream.sections import Serving, as_section

    serving = as_section(Serving, settings)
    url = serving.advertised_url
    if url:
        return str(url).rstrip("/")
    host = serving.web_host
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    scheme = "https" if serving.web_tls_cert_file else "http"
    return f"{scheme}://{host}:{serving.web_port}"


# -- the members directory ----------------------------------------------------------------------------

class MembersDirectory:
    """Publishes this worker's restored partitions to ``<app_id>-members`` and follows the topic.

    ``member_id``: stable across restarts of the same worker (its ``group_instance_id``, else
    its advertised URL), so a restarted worker's record replaces its predecessor's.
    """

    def __init__(self, bootstrap: str, app_id: str, member_id: str, url: str, *,
                 client_config: dict | None = None, runtime: str = "", source_topic: str = "",
                 signing: Any = None, on_reject: Callable[[], None] | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = f"{app_id}-members"
        self.member_id = member_id
        self.url = url
        self.runtime = runtime
        self.source_topic = source_topic
        self.client_config = dict(client_config or {})
        self.members: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer: Any = None
        self.caught_up = threading.Event()
        # With signing keys (grudge_stream.signing) records are signed, and records that do
        # not verify are ignored and counted: a forged record cannot redirect a forward.
        self.signing = signing
        self.on_reject = on_reject
        self.rejected = 0

    def _encode(self, rec: dict) -> bytes:
        if self.signing is None:
            return json.dumps(rec).encode()
        return self.signing.sign(MEMBERS_KIND, self.member_id.encode(), rec)

    def start(self) -> "MembersDirectory":
        """Start publishing and following; never blocks on the broker (the follower thread
        creates the topic, retrying while the cluster is unreachable)."""
        from confluent_kafka import Producer

        self._producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0, "acks": "all",
                                   "log_level": 3, **self.client_config})
        self._thread = threading.Thread(target=self._follow, name="grudge-members", daemon=True)
        self._thread.start()
        return self

    def publish(self, partitions: Iterable[int], partition_count: int | None = None,
                watermarks: dict[int, int | None] | None = None) -> None:
        """This worker's record: call on every assignment change (never blocks on the broker).
        ``watermarks``: each held partition's event-time watermark, which ``grudge-stream
        alerts`` shows the age of (a quiet partition's bans stand still with it)."""
        if self._producer is None:
            return
        rec = {"member": self.member_id, "url": self.url, "partitions": sorted(partitions),
               "partition_count": partition_count, "runtime": self.runtime, "source_topic": self.source_topic,
               "watermarks": {str(p): w for p, w in sorted((watermarks or {}).items())},
               "host": socket.gethostname(), "pid": os.getpid(), "timestamp_ms": time.time_ns() // 1_000_000}
        value = self._encode(rec)
        self._apply(self.member_id.encode(), value)  # our own view at once
        try:
            self._producer.produce(self.topic, key=self.member_id.encode(), value=value)
            self._producer.poll(0)
        except Exception as exc:  # noqa: BLE001 - the directory is advisory; queries answer 503 meanwhile
            log.warning("members record not published: %s", exc)

    def close(self, clean: bool = True) -> None:
        """Stop following; on a clean shutdown publish a tombstone (others stop forwarding here)."""
        self._stop.set()
        if self._producer is not None:
            if clean:
                # Signed: a record holding no partitions (readers ignore unsigned tombstones).
                value = None if self.signing is None else self._encode(
                    {"member": self.member_id, "url": self.url, "partitions": [],
                     "timestamp_ms": time.time_ns() // 1_000_000})
                try:
                    self._producer.produce(self.topic, key=self.member_id.encode(), value=value)
                except Exception as exc:  # noqa: BLE001
                    log.warning("members tombstone not published: %s", exc)
            self._producer.flush(5)
        if self._thread is not None:
            self._thread.join(5)

    def _apply(self, key: bytes, value: bytes | None) -> None:
        mid = key.decode("utf-8", "replace")
        if self.signing is not None:
            try:
                rec, _signer = self.signing.verify(MEMBERS_KIND, key, value)
                if not isinstance(rec.get("partitions"), list):
                    raise ValueError("no partitions")
            except ValueError as exc:
                self.rejected += 1
                if self.on_reject is not None:
                    self.on_reject()
                log.warning("ignoring a members record of %r that does not verify (%s)", mid[:80], exc)
                return
            with self._lock:
                old = self.members.get(mid)
                if old is None or rec.get("timestamp_ms", 0) >= old.get("timestamp_ms", 0):
                    self.members[mid] = rec
            return
        with self._lock:
            if value is None:
                self.members.pop(mid, None)
                return
            try:
                rec = json.loads(value)
            except ValueError:
                return
            old = self.members.get(mid)
            if old is None or rec.get("timestamp_ms", 0) >= old.get("timestamp_ms", 0):
                self.members[mid] = rec

    def _follow(self) -> None:
        from grudge_stream.follow import TopicFollower
        from grudge_stream.topics import create_topics

        warned = False
        while not self._stop.is_set():
            try:
                create_topics(self.bootstrap, {self.topic: (1, dict(MEMBERS_TOPIC_CONFIG))}, timeout=10,
                              client_config=self.client_config)
                break
            except Exception as exc:  # noqa: BLE001 - unreachable cluster, no ACL: retried
                if not warned:
                    warned = True
                    log.warning("members topic %s not available yet (%s): score queries answer for "
                                "this worker's partitions only until it is; retrying", self.topic, exc)
            self._stop.wait(2.0)
        if self._stop.is_set():
            return
        follower = TopicFollower(self.bootstrap, [self.topic],
                                 lambda _t, k, v: None if k is None else self._apply(k, v),
                                 client_config=self.client_config, name="grudge-members").start()
        try:
            while not self._stop.is_set():
                if follower.wait_caught_up(0.2):
                    self.caught_up.set()
                    self._stop.wait()
        finally:
            follower.stop()

    def owner(self, partition: int) -> dict | None:
        """The newest record (other than ours) claiming ``partition``, or None."""
        best = None
        with self._lock:
            for mid, rec in self.members.items():
                if mid == self.member_id or partition not in rec.get("partitions", ()):
                    continue
                if best is None or rec.get("timestamp_ms", 0) > best.get("timestamp_ms", 0):
                    best = rec
        return best

    def urls(self) -> set[str]:
        """The advertised URLs of the members known (ours included)."""
        with self._lock:
            return {str(rec.get("url", "")) for rec in self.members.values()}

    def watermarks(self) -> dict[int, tuple[int | None, int]]:
        """Per partition, ``(watermark_ms, published_ms)`` from the newest record claiming it
        that carries one."""
        out: dict[int, tuple[int | None, int]] = {}
        with self._lock:
            records = list(self.members.values())
        def ms(v: Any) -> int | None:  # records come from a topic: anything not an int is absent
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        for rec in records:
            published = ms(rec.get("timestamp_ms")) or 0
            marks, parts = rec.get("watermarks"), rec.get("partitions")
            if not isinstance(marks, dict) or not isinstance(parts, list):
                continue
            for p in parts:
                if ms(p) is not None and str(p) in marks and (p not in out or published > out[p][1]):
                    out[p] = (ms(marks[str(p)]), published)
        return out

    def partition_count(self) -> int | None:
        with self._lock:
            for rec in self.members.values():
                if rec.get("partition_count"):
                    return int(rec["partition_count"])
        return None


def read_watermarks(bootstrap: str, app_id: str, *, client_config: dict | None = None, signing: Any = None,
                    timeout_s: float = 10.0) -> dict[int, tuple[int | None, int]]:
    """Per partition, ``(watermark_ms, published_ms)`` from the newest members record of
    ``<app_id>-members`` claiming it (records that do not verify are ignored when ``signing``
    is given); empty when the topic cannot be read to its end within ``timeout_s``."""
    from grudge_stream.follow import TopicFollower

    directory = MembersDirectory(bootstrap, app_id, "", "", client_config=client_config, signing=signing)
    follower = TopicFollower(bootstrap, [directory.topic],
                             lambda _t, k, v: None if k is None else directory._apply(k, v),
                             client_config=client_config, name="grudge-watermarks").start()
    try:
        if not follower.wait_caught_up(timeout_s):
            return {}
    finally:
        follower.stop()
    return directory.watermarks()
