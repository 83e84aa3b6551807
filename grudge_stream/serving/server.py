"""The threaded web server of ``WorkerHTTP``: the batch worker's web port, and the live
reads server an embedded state starts where its app has no web server (Quix Streams).

``WebServer(address, route, tls)``: a thread per connection (keep-alive, so forwards and
clients that keep their connection skip a handshake and a thread start per request), with
``tls`` HTTPS only. ``route(path)`` names the API a request is for: ``(api, rel)``, the
``WorkerHTTP`` and the path below its mount point (``/ready``, ``/v1/score?key=K``), or
None (404). The request itself goes through ``WorkerHTTP`` as on every runtime: the access
rules from the headers before a body is read, then the answer.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from grudge_stream.serving.http import WorkerHTTP

__all__ = ["Route", "WebServer", "make_handler"]

log = logging.getLogger("grudge_stream.serving")

Route = Callable[[str], "tuple[WorkerHTTP, str] | None"]

MAX_BODY = 1 << 20


def make_handler(route: Route) -> type[BaseHTTPRequestHandler]:
    """The request handler class of a server whose requests ``route`` sends to their API."""

    class Handler(BaseHTTPRequestHandler):
        # Keep-alive: the other workers' forwards (serving.PeerConnections) and clients that
        # keep their connection skip a handshake and a thread start per request.
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            # A GET never reads a body: one sent anyway ends the connection after the answer.
            self._unread = 1 if (self.headers.get("Content-Length") or "0").strip() != "0" or \
                self.headers.get("Transfer-Encoding") else 0
            routed = route(self.path)
            if routed is None:
                self._send(404, b"not found\n", "text/plain")
                return
            api, rel = routed
            health = api.health(rel)
            if health is not None:
                self._send(health.status, health.body, health.content_type)
            elif api.is_score(rel):
                self._score(api, rel, b"")
            else:
                self._send(404, b"not found\n", "text/plain")

        def do_POST(self) -> None:  # noqa: N802
            routed = route(self.path)
            if routed is None or not routed[1].startswith("/v1/scores"):
                self._send(404, b"not found\n", "text/plain", close=True)
                return
            api, rel = routed
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or self.headers.get("Transfer-Encoding"):
                self._send(400, b'{"error": "bad_request", "message": "a body needs a valid '
                           b'Content-Length (no chunked encoding)"}', "application/json", close=True)
                return
            self._unread = length

            def body() -> bytes:
                self._unread = max(0, length - MAX_BODY)
                return self.rfile.read(min(length, MAX_BODY))

            # Read only once the token is checked (serving.ScoreQueries.prepare).
            self._score(api, rel, body)

        def _score(self, api: WorkerHTTP, rel: str, body: Any) -> None:
            t0 = time.perf_counter()
            path, _, query = rel.partition("?")
            peer = self.client_address[0]
            client, answer = api.admit(self.headers, peer)
            if client is not None:
                # The body is read only once the token is checked, and before the request
                # holds the query gate; so is the answer written: a slow client holds no
                # one up. The work in between runs ahead of the consume loop.
                data = body() if callable(body) else body
                answer = api.score(self.command, path, query, data, self.headers, peer, client)
            assert answer is not None
            self._send(answer.status, answer.body, answer.content_type, dict(answer.headers))
            api.answered(answer, t0)

        def _send(self, status: int, body: bytes, ctype: str, headers: dict | None = None,
                  close: bool = False) -> None:
            if close or getattr(self, "_unread", 0):
                # A request body left unread (a refusal before it, or past 1 MiB) ends the
                # connection: its bytes are not the next request.
                self.close_connection = True
            self.send_response(status)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.send_header("Content-Type", ctype)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            # Head and body in one write: one wait for the interpreter lock, not two.
            self._headers_buffer.append(b"\r\n" + body)  # type: ignore[attr-defined]
            self.flush_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


class WebServer(ThreadingHTTPServer):
    """The web port: a thread per connection; with ``tls`` HTTPS only, the handshake done in
    the connection's thread (a slow or plain-text client holds up no one else)."""

    daemon_threads = True
    CONNECTION_TIMEOUT_S = 30.0

    def __init__(self, address: tuple[str, int], route: Route, tls: Any) -> None:
        self.tls = tls
        super().__init__(address, make_handler(route))

    def get_request(self):  # type: ignore[no-untyped-def]
        conn, addr = super().get_request()
        conn.settimeout(self.CONNECTION_TIMEOUT_S)
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A failed handshake, a plain request on the TLS port, a client gone: one debug line.
        log.debug("web connection from %s ended: %s", client_address[0], sys.exc_info()[1])

    @property
    def port(self) -> int:
        """The port bound (the one asked for, or the one the system chose for port 0)."""
        return int(self.server_address[1])

    def start(self, name: str = "grudge-http") -> "WebServer":
        """Serve from a daemon thread."""
        threading.Thread(target=self.serve_forever, name=name, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port (the connections in flight finish on their threads)."""
        self.shutdown()
        self.server_close()
