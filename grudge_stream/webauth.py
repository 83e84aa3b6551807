"""Who may ask the query API, and how much (docs/security.md, "The HTTP API").

- **Bearer tokens from a file** (``query_token_file``): one token per line, ``name:token``
  or the token alone (named ``token-<line>``); blank lines and ``#`` comments skipped. A
  token is 16 to 512 printable ASCII characters without spaces or colons. The file is
  re-read when it changes (checked at most once a second), so a token is rotated by
  rewriting the file (add the new one, move the clients, drop the old one), without a
  restart; a rewrite that leaves no valid token keeps the previous set and says so once.
  ``/v1/*`` needs ``Authorization: Bearer <token>``: none (or not a bearer token) → 401,
  an unknown one → 403. ``/live``, ``/ready`` and ``/metrics`` stay open (probes and
  scrapes). The token's name is the client's identity: its query budget, and the ``by``
  of the overrides it signs.
- **The door shut by default.** Without a token file the query API answers only when the
  worker binds a loopback address; any other address refuses to start (one line, exit 2)
  unless ``insecure_open_queries=true``, which logs a WARNING on every start, as
  ``insecure_public_seed`` does for the hash key.
- **TLS** (``web_tls_cert_file`` and ``web_tls_key_file``, PEM): the whole port (queries,
  probes, metrics) speaks HTTPS only, TLS 1.2 or newer; the advertised URL defaults to
  ``https://``; forwards verify the owner against ``web_tls_ca_file`` (else the system's
  CAs), so the workers' token never crosses the network in clear.
- **A budget per client** (``query_rate_per_s`` keys a second, ``query_burst`` at once):
  a token bucket per client (token name, else the peer address), charged one unit per key
  asked. Past it: 429 with ``Retry-After``. Requests forwarded by another worker were
  charged there and pass: those that present the file's first token (the workers' own,
  which they forward with; give clients the others), or, without tokens, a request
  marked forwarded that comes from a worker's address in the members directory (a
  client marking its own requests is charged; on loopback every local process shares
  that address: one more reason to set tokens).
"""
from __future__ import annotations

import hmac
import ipaddress
import ssl
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Mapping

from grudge_stream.exceptions import ConfigError

log = logging.getLogger("grudge_stream.webauth")

TOKEN_MIN, TOKEN_MAX = 16, 512
RECHECK_S = 1.0  # how often the token file's stat is looked at
MAX_CLIENTS = 10_000  # budgets kept (least recently seen dropped first): bounded memory
REALM = 'Bearer realm="grudge-stream"'


def parse_tokens(text: str, where: str) -> dict[str, bytes]:
    """``{name: token}`` from a token file's text (a line without a name is named
    ``token-<line>``); ConfigError naming the line otherwise."""
    from grudge_stream.signing import parse_named_secrets

    return parse_named_secrets(text, where, "token", TOKEN_MIN, TOKEN_MAX, unnamed=True)


class TokenFile:
    """The tokens of a file, re-read when it changes (its mtime, size or inode)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._checked = 0.0
        self._stamp: tuple | None = None
        self._tokens = self._load()  # at start: a bad file is a ConfigError (exit 2)
        self._bad_stamp: tuple | None = None

    def _stat(self) -> tuple:
        st = os.stat(self.path)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> dict[str, bytes]:
        where = f"query_token_file {self.path!r}"
        try:
            stamp = self._stat()
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
        tokens = parse_tokens(text, where)
        self._stamp = stamp
        return tokens

    def tokens(self) -> dict[str, bytes]:
        now = time.monotonic()
        if now - self._checked < RECHECK_S:
            return self._tokens
        with self._lock:
            self._checked = now
            try:
                stamp = self._stat()
            except OSError:
                stamp = None
            if stamp == self._stamp or (stamp is not None and stamp == self._bad_stamp):
                return self._tokens
            try:
                self._tokens = self._load()
                self._bad_stamp = None
                log.info("query_token_file re-read: %d token(s) (%s)", len(self._tokens),
                         ", ".join(sorted(self._tokens)))
            except ConfigError as exc:
                if stamp != self._bad_stamp:
                    log.warning("%s; the previous %d token(s) stay valid", exc, len(self._tokens))
                self._bad_stamp = stamp
        return self._tokens

    def identify(self, presented: bytes) -> str | None:
        """The name of the token ``presented`` equals (compared in constant time, against
        every token), or None."""
        found = None
        for name, tok in self.tokens().items():
            if hmac.compare_digest(tok, presented):
                found = name
        return found

    def own_token(self) -> bytes:
        """The token this worker presents when it forwards (the file's first)."""
        return next(iter(self.tokens().values()))


class QueryBudget:
    """Token buckets per client: ``rate`` units a second, at most ``burst`` banked."""

    def __init__(self, rate_per_s: float, burst: float, max_clients: int = MAX_CLIENTS) -> None:
        self.rate = float(rate_per_s)
        self.burst = float(burst)
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def charge(self, client: str, cost: float, now: float | None = None) -> float:
        """0 when ``client`` may spend ``cost`` (and it is spent), else the seconds until it may.

        A request larger than the burst passes when the bucket is full and leaves a debt."""
        now = time.monotonic() if now is None else now
        with self._lock:
            level, last = self._buckets.pop(client, (self.burst, now))
            level = min(self.burst, level + (now - last) * self.rate)
            need = min(cost, self.burst)
            if level >= need:
                self._buckets[client] = (level - cost, now)
                wait = 0.0
            else:
                self._buckets[client] = (level, now)
                wait = (need - level) / self.rate if self.rate > 0 else math.inf
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        return wait


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class QueryAccess:
    """The access rules of a worker's query API: tokens (or none), the budget, refusals
    counted in ``grudge_query_refused_total{reason}``."""

    def __init__(self, tokens: TokenFile | None, budget: QueryBudget | None, metrics: Any = None) -> None:
        self.tokens = tokens
        self.budget = budget
        self.metrics = metrics

    @classmethod
    def from_settings(cls, settings: Any, metrics: Any = None) -> "QueryAccess":
        """The rules of a ``Serving`` section (or of the ``Settings`` it is read from).
        Checks the bind address against the tokens (ConfigError: one line, exit 2)."""
        from grudge_stream.sections import Serving, as_section

        serving = as_section(Serving, settings)
        path = serving.query_token_file
        host = serving.web_host
        tokens = TokenFile(path) if path else None
        if tokens is None and not is_loopback(host):
            if not serving.insecure_open_queries:
                raise ConfigError(
                    f"the score query API would answer anyone who reaches {host}:{serving.web_port} "
                    "without a token: set query_token_file (a file of bearer tokens, docs/security.md), "
                    "bind web_host to a loopback address, or set insecure_open_queries=true")
            log.warning("insecure_open_queries=true: /v1/score answers anyone who reaches %s without a token "
                        "(an oracle for abusers who watch their own score). Set query_token_file for any real "
                        "deployment.", host)
        rate = serving.query_rate_per_s
        budget = QueryBudget(rate, serving.query_burst) if rate else None
        return cls(tokens, budget, metrics)

    def _refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.query_refused.labels(reason).inc()

    def authorize(self, headers: Mapping[str, str], peer: str) -> tuple[str, None] | tuple[None, tuple]:
        """``(client, None)`` or ``(None, (status, body, headers))`` for a 401 / 403."""
        if self.tokens is None:
            return f"addr:{peer}", None
        value = headers.get("Authorization") or ""
        scheme, _, cred = value.strip().partition(" ")
        cred = cred.strip()
        if scheme.lower() != "bearer" or not cred:
            self._refused("unauthenticated")
            return None, (401, {"error": "unauthenticated", "message": "send Authorization: Bearer <token>"},
                          {"WWW-Authenticate": REALM})
        try:
            presented = cred.encode("ascii")
        except UnicodeEncodeError:
            presented = b""
        name = self.tokens.identify(presented) if presented and len(presented) <= TOKEN_MAX else None
        if name is None:
            self._refused("forbidden")
            return None, (403, {"error": "forbidden", "message": "the token is not valid here"}, {})
        return name, None

    def charge(self, client: str, cost: int, forwarded: bool) -> tuple | None:
        """None, or a 429 answer when ``client`` is past its budget."""
        if self.budget is None or (forwarded and (self.tokens is None or client == self.worker_name())):
            return None
        wait = self.budget.charge(client, cost)
        if not wait:
            return None
        self._refused("budget")
        retry = max(1, math.ceil(wait)) if wait != math.inf else 3600
        return 429, {"error": "too_many_requests", "message": f"query budget spent: {self.budget.rate:g} keys/s, "
                     f"{self.budget.burst:g} at once; retry in {retry}s", "retry_after_s": retry}, \
            {"Retry-After": str(retry)}

    def worker_name(self) -> str | None:
        """The name of the workers' own token (the file's first): its forwards pass the budget."""
        return next(iter(self.tokens.tokens())) if self.tokens is not None else None

    def forward_headers(self) -> dict[str, str]:
        return {"Authorization": "Bearer " + self.tokens.own_token().decode()} if self.tokens is not None else {}


def server_tls(settings: Any) -> ssl.SSLContext | None:
    """The HTTPS context of the worker's web port (a ``Serving`` section, or the ``Settings``
    it is read from), or None (plain HTTP)."""
    from grudge_stream.sections import Serving, as_section

    serving = as_section(Serving, settings)
    cert, key = serving.web_tls_cert_file, serving.web_tls_key_file
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigError("set both web_tls_cert_file and web_tls_key_file (PEM), or neither")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"web_tls_cert_file {cert!r} / web_tls_key_file {key!r} cannot be loaded: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    return ctx


def client_tls(settings: Any) -> ssl.SSLContext:
    """The context forwards and ``grudge-stream score`` verify an HTTPS worker with (a
    ``Serving`` section, or the ``Settings`` it is read from)."""
    from grudge_stream.sections import Serving, as_section

    ca = as_section(Serving, settings).web_tls_ca_file
    try:
        return ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"web_tls_ca_file {ca!r} cannot be loaded: {getattr(exc, 'strerror', None) or exc}") \
            from None
