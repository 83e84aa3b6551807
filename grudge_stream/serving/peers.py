"""Connections to the other workers: kept connections for forwarded score queries."""
from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from typing import Any

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
