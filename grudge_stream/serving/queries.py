"""Score queries: parsing, routing each key to its owner, answering and combining."""
from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
import time
import urllib.parse
from typing import Any, Callable

from grudge_stream.exceptions import ConfigError
from grudge_stream.serving.members import MembersDirectory, advertised_url
from grudge_stream.serving.partitioner import PARTITIONERS, PartitionerCheck, partition_for
from grudge_stream.serving.peers import _STALE, PeerConnections, _Forward
from grudge_stream.webauth import QueryAccess, client_tls

log = logging.getLogger("grudge_stream.serving")

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
        """The queries of a ``Serving`` section (or of the ``Settings`` it is read from)."""
        from grudge_stream.sections import Serving, as_section

        serving = as_section(Serving, settings)
        debug = bool(serving.query_debug_detail)
        if debug:
            log.warning("query_debug_detail=true: score answers carry per-level reads and cell indexes, "
                        "which let anyone who can query search for keys that frame or hide another "
                        "(docs/serving.md). Turn it off outside debugging.")
        return cls(slot_of, partition_count, partitioner=serving.key_partitioner,
                   directory=directory, url=advertised_url(serving), debug_detail=debug,
                   access=QueryAccess.from_settings(serving, metrics), tls=client_tls(serving))

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
