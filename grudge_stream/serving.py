"""Live score queries: any worker answers ``GET /v1/score?key=K`` from the owning partition's state.

Runtime-neutral; both runtimes add thin HTTP hooks (docs/runtime.md, "Live score queries").

- **The owner.** A key's partition is the one its producers wrote it to: the Kafka default
  partitioner (``murmur2``: Java clients, Kafka Streams, Faust/aiokafka, confluent-kafka
  with ``partitioner=murmur2_random``) or librdkafka's default (``crc32``:
  ``consistent_random``), setting ``key_partitioner``. A partition computed with the wrong
  one names another partition, whose sketch has never seen the key: the answer would be a
  confident zero. That is why the setting is explicit and documented, not guessed.
- **Answering locally.** A worker that holds the partition restored reads the operator's
  ``describe_key`` (read-only: nothing written, the state stays bit-identical to a replay)
  under the slot's lock, so a batch never runs halfway through a read.
- **Forwarding.** Otherwise the worker looks the partition up in the members directory and
  forwards the request once, marked with the ``X-Grudge-Forwarded`` header; a marked
  request is never forwarded again. The owner recomputes the partition from the key itself,
  so a stale directory can only cost a 503, never another partition's state.
- **The members directory** is a compacted topic ``<app_id>-members``: each worker
  publishes, on every assignment change, a record keyed by its member id with its
  advertised URL and the partitions it holds restored, and a tombstone on a clean
  shutdown. Every worker follows the whole topic in a background thread (manual
  assignment, no group, no commits). When two records claim a partition (a rebalance
  in flight, a killed worker's last record) the newest wins; a wrong pick answers 503.
- **Failure is explicit.** Every way a query cannot be answered is a 503 with a JSON
  ``error`` (``not_owner``, ``owner_unknown``, ``owner_unreachable``, ``not_ready``) and
  a ``Retry-After``: during a rebalance a query answers or fails clearly.
"""
from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from typing import Any, Callable, Iterable

from grudge_stream._cyext._hashing import kafka_murmur2
from grudge_stream.exceptions import ConfigError
from grudge_stream.operators.records import TICK_KEY
from grudge_stream.webauth import QueryAccess, client_tls

log = logging.getLogger("grudge_stream.serving")

PARTITIONERS = ("murmur2", "crc32")
FORWARDED_HEADER = "X-Grudge-Forwarded"
# Seconds a client should wait before asking again after a 503: a rebalance's restores take
# about that long per partition on the default sketch sizes.
RETRY_AFTER_S = 1
# A forwarded request waits this long for the owner; a slower owner answers 503 owner_unreachable.
FORWARD_TIMEOUT_S = 2.0
# At most this many keys per request (one JSON answer each).
MAX_KEYS = 1000
# Keys an event loop reads in one go before it lets its other tasks run (docs/benchmarks.md:
# well under a millisecond at the default sketch size).
LOOP_SLICE = 100
MEMBERS_KIND = "members"  # the entry kind a signed members record's MAC covers (grudge_stream.signing)
MEMBERS_TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                        "segment.ms": "600000"}


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


def advertised_url(settings: Any) -> str:
    """The URL other workers forward to: ``advertised_url``, else http://<web_host>:<web_port>
    (the host name when the server binds every address)."""
    url = settings.get("advertised_url", None)
    if url:
        return str(url).rstrip("/")
    host = settings.get("web_host", "127.0.0.1")
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    scheme = "https" if settings.get("web_tls_cert_file", None) else "http"
    return f"{scheme}://{host}:{settings.get('web_port', 6066)}"


# -- connections to the other workers --------------------------------------------------------------

class PeerConnections:
    """Persistent HTTP(S) connections to the other workers, for forwards.

    A forward on a new connection costs a TCP (and TLS) handshake, and on the owner a
    thread started for it; on a busy machine each of those steps waits for a core. Idle
    connections are kept, at most ``IDLE_PER_PEER`` per owner and for ``IDLE_S`` (less
    than the owner's 30 s idle timeout, so the owner rarely closes one under us; when it
    does, the forward is sent again once on a new connection: reads are idempotent).
    Thread-safe."""

    IDLE_PER_PEER = 4
    IDLE_S = 20.0

    def __init__(self, timeout_s: float, tls: Any = None) -> None:
        self.timeout_s = timeout_s
        self.tls = tls
        self._idle: dict[str, list[tuple[float, http.client.HTTPConnection]]] = {}
        self._lock = threading.Lock()

    def get(self, url: str) -> tuple[http.client.HTTPConnection, bool]:
        """A connection to ``url`` and whether it was used before."""
        now = time.monotonic()
        with self._lock:
            idle = self._idle.get(url, [])
            while idle:
                used, conn = idle.pop()
                if now - used < self.IDLE_S:
                    return conn, True
                conn.close()
        return self.new(url), False

    def new(self, url: str) -> http.client.HTTPConnection:
        """A new connection to ``url`` (connected on first use)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=self.timeout_s,
                                               context=self.tls)
        return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=self.timeout_s)

    def put(self, url: str, conn: http.client.HTTPConnection) -> None:
        now = time.monotonic()
        stale: list[http.client.HTTPConnection] = []
        with self._lock:
            # Connections to owners no longer asked (a worker gone, a new address) go too.
            for u in list(self._idle):
                stale += [c for used, c in self._idle[u] if now - used >= self.IDLE_S]
                self._idle[u] = [(used, c) for used, c in self._idle[u] if now - used < self.IDLE_S]
                if not self._idle[u]:
                    del self._idle[u]
            idle = self._idle.setdefault(url, [])
            if len(idle) < self.IDLE_PER_PEER:
                idle.append((now, conn))
            else:
                stale.append(conn)
        for c in stale:
            c.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for _, conn in conns:
                conn.close()


# A pooled connection the owner closed meanwhile fails with one of these before any answer.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class _Forward:
    """One forward in flight: the request sent on ``conn``, the answer not read yet."""

    __slots__ = ("url", "idxs", "body", "headers", "conn", "reused", "error")

    def __init__(self, url: str, idxs: list[int], body: bytes, headers: dict) -> None:
        self.url, self.idxs, self.body, self.headers = url, idxs, body, headers
        self.conn: http.client.HTTPConnection | None = None
        self.reused = False
        self.error: Exception | None = None


# -- queries before processing ------------------------------------------------------------------------

class QueryGate:
    """Live queries ahead of processing, within a share of the time.

    In the batch runtime a query is answered by a request thread of the same interpreter as
    the consume loop: on a busy worker the two take turns with the interpreter lock, every
    switch interval and at every socket wait, so a request of a few milliseconds of work
    takes several times that, and its tail follows the loop's longest stretches. The request
    threads hold the gate (``serving()``) while they answer; the loop calls
    ``yield_to_queries()`` before each partition of a batch, and while a request is in
    flight it waits there (holding no slot lock, not the interpreter lock) until the
    requests are done. It waits at most ``share`` of the time (a bucket of pause time
    refilled at ``share`` seconds a second, at most ``MAX_PAUSE_S`` in one go), so a flood
    of queries slows processing by that share at most; ``share`` 0: never waits."""

    MAX_PAUSE_S = 0.05

    def __init__(self, share: float, metrics: Any = None) -> None:
        if not 0.0 <= share <= 1.0:
            raise ConfigError(f"query_priority_share must be between 0 and 1, not {share!r}")
        self.share = float(share)
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._tokens = self.MAX_PAUSE_S
        self._refilled = time.monotonic()
        self.paused_s = 0.0  # the loop's waits so far
        self.metrics = metrics

    def serving(self) -> "_Serving":
        """A request in flight (a context manager) while its thread answers it."""
        return _Serving(self)

    def _enter(self) -> None:
        with self._cond:
            self._active += 1

    def _exit(self) -> None:
        with self._cond:
            self._active -= 1
            if not self._active:
                self._cond.notify_all()

    def yield_to_queries(self) -> float:
        """The loop: while requests are in flight, wait for them within the share; the seconds waited."""
        if not self._active or not self.share:
            return 0.0
        now = time.monotonic()
        self._tokens = min(self.MAX_PAUSE_S, self._tokens + (now - self._refilled) * self.share)
        self._refilled = now
        if self._tokens <= 0.0:
            return 0.0
        with self._cond:
            self._cond.wait_for(lambda: not self._active, self._tokens)
        waited = time.monotonic() - now
        self._tokens -= waited
        self.paused_s += waited
        if self.metrics is not None:
            self.metrics.query_priority_paused.inc(waited)
        return waited


class _Serving:
    __slots__ = ("gate",)

    def __init__(self, gate: QueryGate) -> None:
        self.gate = gate

    def __enter__(self) -> None:
        self.gate._enter()

    def __exit__(self, *exc: Any) -> None:
        self.gate._exit()


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


# -- queries ----------------------------------------------------------------------------------------

def key_fields(key: bytes) -> dict:
    try:
        return {"key": key.decode("utf-8")}
    except UnicodeDecodeError:
        return {"key": None, "key_b64": base64.b64encode(key).decode("ascii")}


def _b64(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


class QueryError(Exception):
    """A request that cannot be parsed: HTTP 400."""


def parse_query(query: str) -> tuple[list[bytes], bool]:
    """Keys (``key=`` UTF-8 text, ``key_b64=``) and whether forwarding is allowed (``forward=0``
    asks this worker alone) from a URL query string."""
    keys: list[bytes] = []
    forward = True
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name == "key":
            keys.append(value.encode("utf-8"))
        elif name == "key_b64":
            try:
                keys.append(base64.b64decode(value, validate=True))
            except ValueError:
                raise QueryError(f"key_b64 is not base64: {value!r}") from None
        elif name == "forward":
            forward = value.lower() not in ("0", "false", "no")
    return keys, forward


def parse_body(body: bytes) -> list[bytes]:
    """A JSON list of keys (strings), or ``{"keys": [...], "keys_b64": [...]}``."""
    try:
        doc = json.loads(body or b"null")
    except ValueError:
        raise QueryError("the body must be JSON: a list of keys or {\"keys\": [...], \"keys_b64\": [...]}") from None
    texts, b64s = (doc, []) if isinstance(doc, list) else (
        (doc.get("keys", []), doc.get("keys_b64", [])) if isinstance(doc, dict) else (None, None))
    if not isinstance(texts, list) or not isinstance(b64s, list) or not all(
            isinstance(k, str) for k in [*texts, *b64s]):
        raise QueryError("keys must be a JSON list of strings ({\"keys_b64\": [...]} for binary keys)")
    try:
        return [k.encode("utf-8") for k in texts] + [base64.b64decode(k, validate=True) for k in b64s]
    except ValueError:
        raise QueryError("keys_b64 holds a value that is not base64") from None


def _error(key: bytes, error: str, message: str, partition: int | None = None, **extra: Any) -> dict:
    return {**key_fields(key), "error": error, "message": message, "partition": partition,
            "retry_after_s": RETRY_AFTER_S, **extra}


class ScoreQueries:
    """Answers score queries for one worker.

    ``slot_of(p)``: the ``PartitionSlot`` of partition ``p`` when this worker holds it
    restored, else None. ``partition_count()``: the source topic's partition count once
    known, else None. ``directory``: None answers local partitions only.
    """

    def __init__(self, slot_of: Callable[[int], Any], partition_count: Callable[[], int | None], *,
                 partitioner: str = "murmur2", directory: MembersDirectory | None = None,
                 url: str = "", forward_timeout_s: float = FORWARD_TIMEOUT_S, debug_detail: bool = False,
                 access: QueryAccess | None = None, tls: Any = None) -> None:
        if partitioner not in PARTITIONERS:
            raise ConfigError(f"key_partitioner must be one of {PARTITIONERS}, not {partitioner!r}")
        self.slot_of = slot_of
        self._partition_count = partition_count
        self.partitioner = partitioner
        self.directory = directory
        self.url = url
        self.forward_timeout_s = forward_timeout_s
        # Per-level reads, cell indexes and the slot's offsets in every answer: they show
        # which cells a key occupies (a framing search's input). Debugging only.
        self.debug_detail = bool(debug_detail)
        # Tokens and budgets (grudge_stream.webauth); None: open, no budget (tests, tools).
        self.access = access
        self._resolved: dict[str, tuple[float, set[str]]] = {}  # member host -> (when, addresses)
        # The SSL context forwards to https:// owners verify with (None: the default).
        self.tls = tls
        self.peers = PeerConnections(forward_timeout_s, tls)
        # Whether the records' partitions agree with ``partitioner`` (set by the worker core).
        self.partitioner_check: PartitionerCheck | None = None

    @classmethod
    def from_settings(cls, settings: Any, slot_of: Callable[[int], Any],
                      partition_count: Callable[[], int | None],
                      directory: MembersDirectory | None, metrics: Any = None) -> "ScoreQueries":
        from grudge_stream.settings import setting

        debug = bool(setting(settings, "query_debug_detail"))
        if debug:
            log.warning("query_debug_detail=true: score answers carry per-level reads and cell indexes, "
                        "which let anyone who can query search for keys that frame or hide another "
                        "(docs/serving.md). Turn it off outside debugging.")
        return cls(slot_of, partition_count, partitioner=settings.get("key_partitioner", "murmur2"),
                   directory=directory, url=advertised_url(settings), debug_detail=debug,
                   access=QueryAccess.from_settings(settings, metrics), tls=client_tls(settings))

    def partition_count(self) -> int | None:
        n = self._partition_count()
        if not n and self.directory is not None:
            n = self.directory.partition_count()
        return n or None

    # -- local reads -------------------------------------------------------------------------

    def holds(self, partition: int, n: int) -> Any:
        """This worker's slot of ``partition`` when it holds it restored at ``n`` partitions, else None."""
        slot = self.slot_of(partition)
        if slot is None or slot.partition != partition or slot.partition_count != n:
            return None
        return slot

    def read_partition(self, keys: list[bytes], partition: int, n: int, idxs: list[int],
                       results: list[dict | None], wait: bool = True) -> bool:
        """The answers of ``keys[i]`` for ``i`` in ``idxs`` (all on ``partition``), into
        ``results``: read together under one acquisition of the slot's lock, so a request
        waits for the processing thread at most once per partition, and every answer of a
        partition reads the same state. ``wait=False``: nothing is read, and False returned,
        while the processing thread holds the slot."""
        slot = self.holds(partition, n)
        if slot is None:  # revoked since the request was routed
            for i in idxs:
                results[i] = _error(keys[i], "owner_unknown", f"partition {partition} moved during the "
                                    "request (a rebalance in progress?)", partition)
            return True
        op = slot.operator
        describe = getattr(op, "describe_key", None)
        debug = self.debug_detail
        lock = getattr(slot, "lock", None)
        if lock is not None and not lock.acquire(wait):
            return False
        try:
            details = ([describe(keys[i], debug) for i in idxs] if describe is not None
                       else [{"kind": op.kind, "error": "not_supported"}] * len(idxs))
            meta: dict = {"partition": partition, "watermark_ms": op.watermark}
            if debug:
                meta.update(partitions=n, operator=op.operator_id, next_offset=op.next_offset,
                            snapshot_offset=slot.snapshotted_offset, restore_mode=slot.restore_mode)
        finally:
            if lock is not None:
                lock.release()
        check = self.partitioner_check
        if check is not None and check.status() != "verified":
            # Not a confident answer: the key may live on another partition than computed.
            meta["partitioner_check"] = check.status()
        served = {"served_by": self.url}
        for i, detail in zip(idxs, details):
            results[i] = {**key_fields(keys[i]), **meta, **detail, **served}
        return True

    # -- a request ------------------------------------------------------------------------------

    def route(self, keys: list[bytes], forward: bool, lo: int, hi: int, results: list[dict | None],
              local: dict[int, list[int]], remote: dict[str, list[int]]) -> int:
        """Where each of ``keys[lo:hi]`` is answered: indexes by partition this worker holds
        into ``local``, by owner URL to forward to into ``remote``; the keys no one can answer
        get their error in ``results``. Returns the partition count (0: not known yet)."""
        n = self.partition_count() or 0
        for i in range(lo, hi):
            key = keys[i]
            if not n:
                results[i] = _error(key, "not_ready", "this worker does not know the source topic's "
                                    "partition count yet (no assignment so far)")
                continue
            p = partition_for(key, n, self.partitioner)
            if self.holds(p, n) is not None:
                local.setdefault(p, []).append(i)
                continue
            owner = self.directory.owner(p) if self.directory is not None else None
            if not forward:
                results[i] = _error(key, "not_owner", f"this worker does not hold partition {p} restored",
                                    p, owner=owner.get("url") if owner else None)
                continue
            if owner is None or owner.get("url") in (None, "", self.url):
                results[i] = _error(key, "owner_unknown", f"no worker is known to hold partition {p} restored "
                                    "(a rebalance in progress?)", p)
                continue
            remote.setdefault(owner["url"], []).append(i)
        return n

    def read_local(self, keys: list[bytes], n: int, local: dict[int, list[int]],
                   results: list[dict | None]) -> None:
        """``read_partition`` for each partition of ``local`` (from ``route``): first those
        the processing thread is not in, then the others, waiting. The loop processes a
        batch partition by partition, so a request waits for at most the one partition in
        progress instead of following the loop from partition to partition."""
        busy = [(p, idxs) for p, idxs in local.items() if not self.read_partition(keys, p, n, idxs, results, False)]
        for p, idxs in busy:
            self.read_partition(keys, p, n, idxs, results)

    def remote_part(self, keys: list[bytes], remote: dict[str, list[int]]) -> dict[int, dict]:
        """Forward each owner its keys (once, marked) and wait for their answers; blocking:
        run it off an event loop. Every request is sent before any answer is read, so
        several owners work at once."""
        return self.receive_forwards(keys, self.send_forwards(keys, remote))

    def send_forwards(self, keys: list[bytes], remote: dict[str, list[int]]) -> list[_Forward]:
        """Send each owner of ``remote`` its keys; the answers are read by ``receive_forwards``
        (meanwhile the owners read, and this thread may read its own keys)."""
        headers = {"Content-Type": "application/json", FORWARDED_HEADER: self.url or "1",
                   **(self.access.forward_headers() if self.access else {})}
        sent = []
        for url, idxs in remote.items():
            fwd = _Forward(url, idxs, json.dumps({"keys_b64": [_b64(keys[i]) for i in idxs]}).encode(), headers)
            self._send(fwd)
            sent.append(fwd)
        return sent

    def _send(self, fwd: _Forward, fresh: bool = False) -> None:
        """``fwd``'s request on a pooled connection (``fresh``: a new one); a pooled one the
        owner had closed is replaced once."""
        fwd.conn, fwd.reused = (self.peers.new(fwd.url), False) if fresh else self.peers.get(fwd.url)
        fwd.error = None
        try:
            fwd.conn.request("POST", urllib.parse.urlsplit(fwd.url).path.rstrip("/") + "/v1/scores",
                             fwd.body, fwd.headers)
        except (OSError, http.client.HTTPException) as exc:
            fwd.conn.close()
            if fwd.reused and isinstance(exc, _STALE):
                self._send(fwd, fresh=True)
            else:
                fwd.error = exc

    @staticmethod
    def _read(conn: http.client.HTTPConnection) -> tuple[http.client.HTTPResponse, bytes]:
        resp = conn.getresponse()
        return resp, resp.read()

    def _response(self, fwd: _Forward) -> Any:
        assert fwd.conn is not None
        try:
            resp, data = self._read(fwd.conn)
        except _STALE:
            fwd.conn.close()
            if not fwd.reused:
                raise
            self._send(fwd, fresh=True)
            if fwd.error is not None:
                raise fwd.error from None
            assert fwd.conn is not None
            resp, data = self._read(fwd.conn)
        if resp.will_close:
            fwd.conn.close()
        else:
            self.peers.put(fwd.url, fwd.conn)
        return json.loads(data or b"{}")  # a 503 carries the owner's per-key errors

    def receive_forwards(self, keys: list[bytes], sent: list[_Forward]) -> dict[int, dict]:
        """The answers of ``send_forwards``'s requests (or an ``owner_unreachable`` error per key)."""
        out: dict[int, dict] = {}
        for fwd in sent:
            url, idxs = fwd.url, fwd.idxs
            try:
                if fwd.error is not None:
                    raise fwd.error
                doc = self._response(fwd)
                answers = doc.get("results") if isinstance(doc, dict) else None
                if not isinstance(answers, list) or len(answers) != len(idxs):
                    raise ValueError(f"unexpected answer from {url}: {str(doc)[:200]}")
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if fwd.conn is not None:
                    fwd.conn.close()
                for i in idxs:
                    out[i] = _error(keys[i], "owner_unreachable", f"the owner {url} did not answer: {exc}",
                                    owner=url)
                continue
            for i, ans in zip(idxs, answers):
                if isinstance(ans, dict) and not ans.get("error"):
                    ans["forwarded_by"] = self.url
                elif isinstance(ans, dict):
                    ans.setdefault("owner", url)
                out[i] = ans
        return out

    @staticmethod
    def combine(results: list[dict | None], forwarded: dict[int, dict], single: bool) -> tuple[int, dict, dict]:
        """``(status, body, headers)``: one key → its answer; several → ``{"results": [...]}``,
        200 when at least one key was answered. Every 503 carries ``Retry-After``."""
        for i, ans in forwarded.items():
            results[i] = ans
        done = [r if r is not None else {"error": "internal", "message": "no answer"} for r in results]
        failed = [r for r in done if r.get("error")]
        status = 503 if failed and (single or len(failed) == len(done)) else 200
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else {}
        return status, (done[0] if single else {"results": done}), headers

    def answer(self, keys: list[bytes], forward: bool = True, single: bool = False) -> tuple[int, dict, dict]:
        """A whole request, blocking (the batch runtime's HTTP threads). The forwards are sent
        first, and the owners read while this worker reads its own keys: a request mixing
        local and remote keys takes the longer of the two, not their sum."""
        results: list[dict | None] = [None] * len(keys)
        local: dict[int, list[int]] = {}
        remote: dict[str, list[int]] = {}
        n = self.route(keys, forward, 0, len(keys), results, local, remote)
        if not remote:
            self.read_local(keys, n, local, results)
            return self.combine(results, {}, single)
        if not local:
            return self.combine(results, self.remote_part(keys, remote), single)
        sent = self.send_forwards(keys, remote)
        try:
            self.read_local(keys, n, local, results)
        finally:
            forwarded = self.receive_forwards(keys, sent)
        return self.combine(results, forwarded, single)

    @staticmethod
    def parse_request(method: str, path: str, query: str, body: bytes,
                      headers: Any) -> tuple[list[bytes], bool, bool] | tuple[int, dict, dict]:
        """``(keys, forward, single)`` of a ``/v1/score`` or ``/v1/scores`` request, or a 400 answer."""
        try:
            keys, forward = parse_query(query)
            if method == "POST":
                keys += parse_body(body)
        except QueryError as exc:
            return 400, {"error": "bad_request", "message": str(exc)}, {}
        if not keys:
            return 400, {"error": "bad_request", "message": "give key=K (repeatable), key_b64=, or POST "
                         "a JSON list of keys to /v1/scores"}, {}
        if len(keys) > MAX_KEYS:
            return 400, {"error": "bad_request", "message": f"at most {MAX_KEYS} keys per request"}, {}
        if headers.get(FORWARDED_HEADER):
            forward = False  # forwarded once already: never again
        return keys, forward, path.rstrip("/") == "/v1/score" and len(keys) == 1

    def admit(self, headers: Any, peer: str = "") -> tuple[str, None] | tuple[None, tuple[int, dict, dict]]:
        """``(client, None)``, or ``(None, answer)``: a 401 / 403 from the headers alone, before
        a request body is read (an unauthenticated caller never gets a worker to read 1 MB)."""
        if self.access is None:
            return f"addr:{peer}", None
        return self.access.authorize(headers, peer)

    def prepare(self, method: str, path: str, query: str, body: bytes | Callable[[], bytes], headers: Any,
                peer: str = "", client: str | None = None) -> tuple[list[bytes], bool, bool] | tuple[int, dict, dict]:
        """``parse_request`` behind the access rules: a 401 / 403 before the body is read
        (``body`` may be a function that reads it; ``client``: already ``admit``-ted), a 429
        past the client's budget (one unit per key)."""
        if client is None:
            client, refusal = self.admit(headers, peer)
            if refusal is not None:
                return refusal
        parsed = self.parse_request(method, path, query, body() if callable(body) else body, headers)
        if isinstance(parsed[0], int) or self.access is None:
            return parsed
        forwarded = bool(headers.get(FORWARDED_HEADER))
        if forwarded and self.access.tokens is None:
            # Without tokens the mark proves nothing: only a peer at a member's address is a
            # worker forwarding (charged where the client asked); anyone else is charged here.
            forwarded = self.peer_is_member(peer)
        refusal = self.access.charge(client, len(parsed[0]), forwarded)
        return refusal if refusal is not None else parsed

    def peer_is_member(self, peer: str) -> bool:
        """Whether ``peer`` (an IP address) is the address of a worker in the members
        directory (their advertised hosts, resolved at most once a minute)."""
        directory = self.directory
        if directory is None or not peer:
            return False
        hosts = {urllib.parse.urlsplit(url).hostname for url in directory.urls()}
        now = time.monotonic()
        addresses: set[str] = set()
        for host in hosts:
            if not host:
                continue
            cached = self._resolved.get(host)
            if cached is None or now - cached[0] > 60.0:
                try:
                    found = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
                except OSError:
                    found = set()
                cached = self._resolved[host] = (now, found)
            addresses |= cached[1]
        return peer in addresses

    def handle(self, method: str, path: str, query: str, body: bytes | Callable[[], bytes], headers: Any,
               peer: str = "") -> tuple[int, dict, dict]:
        """One request, blocking (the batch runtime's HTTP threads): ``(status, body, headers)``."""
        parsed = self.prepare(method, path, query, body, headers, peer)
        if isinstance(parsed[0], int):
            return parsed  # type: ignore[return-value]
        keys, forward, single = parsed  # type: ignore[misc]
        return self.answer(keys, forward, single)
