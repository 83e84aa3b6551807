"""Live queries ahead of the batch runtime's consume loop (``serving.QueryGate``), and forwards
on kept connections (``serving.PeerConnections``), against a real HTTP server on loopback."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grudge_stream.exceptions import ConfigError
from grudge_stream.serving import PeerConnections, QueryGate, ScoreQueries


def test_the_loop_waits_for_a_query_in_flight_and_not_without_one() -> None:
    gate = QueryGate(0.5)
    assert gate.yield_to_queries() == 0.0  # nothing in flight: no wait, no lock taken
    done = threading.Event()

    def request() -> None:
        with gate.serving():
            time.sleep(0.02)
        done.set()
    t = threading.Thread(target=request)
    t.start()
    time.sleep(0.005)
    waited = gate.yield_to_queries()
    assert done.is_set(), "the loop went on while the query was in flight"
    assert 0.005 < waited < QueryGate.MAX_PAUSE_S + 0.01
    t.join()
    assert gate.yield_to_queries() == 0.0 and gate.paused_s == pytest.approx(waited)


def test_a_flood_of_queries_holds_the_loop_for_at_most_its_share() -> None:
    gate = QueryGate(0.2)
    release = threading.Event()

    def request() -> None:
        with gate.serving():
            release.wait()
    t = threading.Thread(target=request)
    t.start()
    time.sleep(0.01)
    t0 = time.monotonic()
    steps, held = 0, 0.0
    while time.monotonic() - t0 < 1.0:  # the loop: a step of work, then the gate
        time.sleep(0.002)
        g0 = time.monotonic()
        gate.yield_to_queries()
        held += time.monotonic() - g0
        steps += 1
    elapsed = time.monotonic() - t0
    release.set()
    t.join()
    # The bucket starts full (MAX_PAUSE_S) and refills at 0.2 s a second.
    assert gate.paused_s <= QueryGate.MAX_PAUSE_S + 0.2 * elapsed + 0.02, gate.paused_s
    assert gate.paused_s >= 0.1, gate.paused_s  # and it did give the query its share
    # What the loop itself saw (its own clock around the gate, not the gate's count): held
    # for its share, and it kept stepping. A loaded machine stretches the 2 ms steps, so the
    # step count is not the measure; the time held is.
    assert held <= QueryGate.MAX_PAUSE_S + 0.2 * elapsed + 0.1, held
    assert steps >= 20


def test_share_zero_never_waits_and_a_share_out_of_range_is_refused() -> None:
    gate = QueryGate(0.0)
    with gate.serving():
        t = time.monotonic()
        assert gate.yield_to_queries() == 0.0
        assert time.monotonic() - t < 0.005
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="query_priority_share"):
            QueryGate(bad)


class _Owner(BaseHTTPRequestHandler):
    """A stand-in owner: answers /v1/scores with one result per key; ``drop`` closes the
    connection after the answer without saying so (as an owner's idle timeout does)."""

    protocol_version = "HTTP/1.1"
    drop = False
    connections: list = []

    def setup(self) -> None:
        super().setup()
        _Owner.connections.append(self.client_address)

    def do_POST(self) -> None:  # noqa: N802
        keys = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["keys_b64"]
        body = json.dumps({"results": [{"key_b64": k, "score": 1.0} for k in keys]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if _Owner.drop:
            self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def owner():
    _Owner.drop, _Owner.connections = False, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Owner)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _forward(q: ScoreQueries, url: str, keys: list[bytes]) -> dict:
    return q.remote_part(keys, {url: list(range(len(keys)))})


def test_forwards_reuse_one_connection_and_survive_an_owner_that_closed_it(owner) -> None:
    q = ScoreQueries(lambda p: None, lambda: 2, url="http://me:1")
    keys = [b"a", b"b", b"c"]
    for _ in range(5):
        out = _forward(q, owner, keys)
        assert [out[i]["forwarded_by"] for i in range(3)] == ["http://me:1"] * 3
    assert len(_Owner.connections) == 1  # five forwards, one connection
    # The owner closes the kept connection after its next answer (an idle timeout, a restart):
    # the forward after it finds the connection dead, and is sent again once on a new one.
    _Owner.drop = True
    _forward(q, owner, keys)
    _Owner.drop = False
    time.sleep(0.05)
    out = _forward(q, owner, keys)
    assert all("error" not in a and a["score"] == 1.0 for a in out.values()), out
    assert len(_Owner.connections) == 2  # the kept one, then the one the forward was sent again on


def test_an_owner_that_is_gone_is_an_error_per_key_not_an_exception(owner) -> None:
    q = ScoreQueries(lambda p: None, lambda: 2, url="http://me:1", forward_timeout_s=0.5)
    dead = "http://127.0.0.1:1"
    out = _forward(q, dead, [b"x", b"y"])
    assert [a["error"] for a in out.values()] == ["owner_unreachable"] * 2 and out[0]["owner"] == dead
    # Several owners at once: each request is sent before any answer is read.
    out = q.remote_part([b"x", b"y", b"z"], {owner: [0, 2], dead: [1]})
    assert out[0]["score"] == 1.0 and out[2]["score"] == 1.0 and out[1]["error"] == "owner_unreachable"


def test_the_pool_keeps_a_few_idle_connections_per_owner_and_drops_old_ones(owner) -> None:
    peers = PeerConnections(1.0)
    conns = [peers.get(owner) for _ in range(PeerConnections.IDLE_PER_PEER + 2)]
    assert not any(reused for _, reused in conns)
    for c, _ in conns:
        peers.put(owner, c)
    assert len(peers._idle[owner]) == PeerConnections.IDLE_PER_PEER
    c, reused = peers.get(owner)
    assert reused
    peers.put(owner, c)
    peers._idle[owner] = [(time.monotonic() - PeerConnections.IDLE_S - 1, c) for _, c in peers._idle[owner]]
    assert peers.get(owner)[1] is False and peers._idle[owner] == []
    peers.close()


def test_idle_connections_to_owners_no_longer_asked_are_closed(owner) -> None:
    peers = PeerConnections(1.0)
    gone = "http://127.0.0.1:9"  # an owner that left: never asked again
    old, _ = peers.get(gone)
    peers.put(gone, old)
    peers._idle[gone] = [(time.monotonic() - PeerConnections.IDLE_S - 1, old)]
    c, _ = peers.get(owner)
    peers.put(owner, c)
    assert list(peers._idle) == [owner]
    peers.close()
