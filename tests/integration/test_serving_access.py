"""The query API's door, against the real broker: two workers of abuse_scores sharing a token
file. Without a token 401, with a wrong one 403, probes open; forwarding between the workers
presents the workers' token and returns the owner's answer; a rotated file takes effect
without a restart; a client past its budget gets 429 with Retry-After; refusals are counted.
The default answer's JSON holds no cell index or per-level read, and a framing search run
through the API finds nothing. Garbage on the port (a TLS handshake, an oversize header, a
non-ASCII token) gets a clean refusal and the worker keeps processing. A worker bound to a
non-loopback address without tokens, or given a bad token file, refuses to start (one line,
exit 2)."""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from confluent_kafka import Producer

from grudge_stream.serving import partition_for

PARTITIONS = 2
TOKENS = {name: (name[0] * 8 + "-token-" + "x" * 20) for name in ("worker", "gateway", "scanner", "greedy")}
ALLOWED = {"key", "key_b64", "partition", "watermark_ms", "kind", "score", "raised", "raise_at", "clear_at",
           "override", "served_by", "forwarded_by", "partitioner_check"}


def ready(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def produce_murmur2(h, events) -> None:
    """Keyed the way the workers' key_partitioner (murmur2) expects."""
    p = Producer({"bootstrap.servers": h.bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
    for key, value, ts in events:
        while True:
            try:
                p.produce(h.topology.source_topic, key=key, value=value, timestamp=ts)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0


def write_tokens(path, names) -> None:
    path.write_text("".join(f"{n}:{TOKENS[n]}\n" for n in names))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def ask(port: int, keys: list[str], token: str | None, path: str = "/v1/scores") -> tuple[int, object, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(keys).encode(),
                                 method="POST", headers=headers)
    if path == "/v1/score":
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}?" + urllib.parse.urlencode({"key": keys[0]}),
                                     headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def raw(port: int, data: bytes) -> bytes:
    """What the server sends back to ``data`` (until it closes or 3 s pass)."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        try:
            s.sendall(data)  # a server that gave up on an oversize header may close meanwhile
        except OSError:
            pass
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
    return out


def refused(port: int, reason: str) -> float:
    body = get(port, "/metrics")[1].decode()
    for line in body.splitlines():
        if line.startswith(f'grudge_query_refused_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def fields(doc) -> set[str]:
    if isinstance(doc, dict):
        return set(doc) | {n for v in doc.values() for n in fields(v)}
    if isinstance(doc, list):
        return {n for v in doc for n in fields(v)}
    return set()


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_tokens_forwarding_rotation_budget_and_no_leaks(harness, runtime, tmp_path) -> None:
    tokens = tmp_path / "tokens"
    write_tokens(tokens, ["worker", "gateway", "scanner", "greedy"])
    h = harness(partitions=PARTITIONS, query_token_file=str(tokens), query_rate_per_s="2",
                query_burst="1100", cells_per_level="2000")
    workers = [h.start_worker(runtime=runtime), h.start_worker(runtime=runtime)]
    events = h.make_events(6000, seed=5, abusers=4, users=200)
    produce_murmur2(h, events)

    def split():
        r = [ready(w.web_port) for w in workers]
        if not all(x and x["ready"] for x in r):
            return None
        held = [set(x["restored"]) for x in r]
        return held if all(held) and set().union(*held) == set(range(PARTITIONS)) else None
    held = wait_for(split, 90, "two ready workers sharing the partitions")
    h.wait_caught_up()
    port = workers[0].web_port

    # Probes and scrapes stay open; the query API does not.
    assert get(port, "/live")[0] == 200 and get(port, "/ready")[0] == 200 and get(port, "/metrics")[0] == 200
    status, doc, headers = ask(port, ["abuser-0"], None, "/v1/score")
    assert status == 401 and doc["error"] == "unauthenticated" and "Bearer" in headers["WWW-Authenticate"]
    assert ask(port, ["abuser-0"], "Zz" * 16)[0] == 403
    assert ask(port, ["abuser-0"], "Zz" * 16, "/v1/score")[0] == 403

    # A key of each worker's partitions, asked of worker 0: one local, one forwarded with the
    # workers' token (the owner would answer 401 to a forward without it).
    keys = [f"abuser-{i}" for i in range(4)] + [f"user-{i}" for i in range(0, 200, 20)]
    assert {partition_for(k.encode(), PARTITIONS) for k in keys} == set(range(PARTITIONS))

    def answered():
        status, doc, _ = ask(port, keys, TOKENS["gateway"])
        return doc["results"] if status == 200 and not any(r.get("error") for r in doc["results"]) else None
    answers = wait_for(answered, 30, "answers through both workers")
    ref = h.reference()
    for k, a in zip(keys, answers):
        p = partition_for(k.encode(), PARTITIONS)
        op = ref[p]["op"]
        assert a["score"] == op.sketch.query_detailed(k.encode(), op.watermark)["score"]
        assert ("forwarded_by" in a) == (p not in held[0])
    assert any("forwarded_by" in a for a in answers) and any("forwarded_by" not in a for a in answers)

    # The default answer: no cell indexes, no per-level reads (the JSON is scanned), and a
    # framing search through the API (keep candidates sharing a cell with the victim) finds nothing.
    assert fields(answers) <= ALLOWED, fields(answers) - ALLOWED
    # (A worker that restored a partition and saw no record of it since says "unverified".)
    assert all(a.get("partitioner_check", "verified") != "mismatched" for a in answers)
    status, victim, _ = ask(port, ["abuser-0"], TOKENS["scanner"], "/v1/score")
    candidates = [f"cand-{i}" for i in range(999)]
    status, doc, _ = ask(port, candidates, TOKENS["scanner"])
    assert status == 200 and len(doc["results"]) == len(candidates)
    text = json.dumps(doc) + json.dumps(victim)
    assert "cell" not in text and "punishment" not in text and "levels" not in text
    assert fields(doc["results"]) <= ALLOWED
    victim_cells = {str(v) for v in victim.values() if isinstance(v, list)}
    assert [c for c, a in zip(candidates, doc["results"])
            if victim_cells & {str(v) for v in a.values() if isinstance(v, list)}] == []

    # The budget: 1100 keys at once, 2 a second; past it 429 with Retry-After, counted.
    assert ask(port, [f"g-{i}" for i in range(1000)], TOKENS["greedy"])[0] == 200
    status, doc, headers = ask(port, [f"g-{i}" for i in range(200)], TOKENS["greedy"])
    assert status == 429 and doc["error"] == "too_many_requests" and int(headers["Retry-After"]) >= 1
    assert refused(port, "budget") >= 1 and refused(port, "unauthenticated") >= 1 and refused(port, "forbidden") >= 2

    # Rotation without a restart: the gateway's token is dropped, a new client added.
    write_tokens(tokens, ["worker", "scanner"])
    wait_for(lambda: ask(port, ["abuser-1"], TOKENS["gateway"], "/v1/score")[0] == 403, 10, "the old token refused")
    assert ask(port, ["abuser-1"], TOKENS["scanner"], "/v1/score")[0] == 200

    # Garbage on the plain port: clean refusals, and the worker keeps processing.
    hello = bytes.fromhex("16030100a5010000a10303") + os.urandom(32) + b"\x00" * 100
    reply = raw(port, hello)
    # A refusal: a 400, or, when the random bytes end the request line early, the HTTP/0.9-style
    # bare error page http.server sends to a request line without a version.
    assert (reply == b"" or reply.startswith(b"HTTP/1.") and b" 400 " in reply.split(b"\r\n")[0]
            or not reply.startswith(b"HTTP/") and b"Error code: 400" in reply), reply[:300]
    big = (b"GET /v1/score?key=a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"a" * 200_000 + b"\r\n\r\n")
    reply = raw(port, big)
    assert reply == b"" or reply.split(b"\r\n")[0].split(b" ")[1] in (b"400", b"403", b"431")
    reply = raw(port, "GET /v1/score?key=a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ééééééééééééééééé"
                      "\r\nConnection: close\r\n\r\n".encode("utf-8"))
    assert reply.split(b"\r\n")[0].split(b" ")[1] in (b"400", b"403")
    # A POST announcing 1 MB it never sends: refused at once from the headers, never waited for.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /v1/scores HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000000\r\nConnection: close\r\n\r\n[")
        first = s.recv(65536)  # a server reading the body first would time out here
    assert first.split(b"\r\n")[0].split(b" ")[1] == b"401", first[:200]
    # Kept connections: answers one after another on one connection. A refused POST whose
    # body is left unread ends its connection: a request hidden in the body is never answered.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    auth = {"Authorization": f"Bearer {TOKENS['scanner']}", "Content-Type": "application/json"}
    socks = []
    for _ in range(3):
        conn.request("POST", "/v1/scores", json.dumps(["abuser-1", "user-3"]), auth)
        resp = conn.getresponse()
        assert resp.status == 200 and len(json.loads(resp.read())["results"]) == 2
        socks.append(conn.sock)
    assert socks[0] is not None and socks.count(socks[0]) == 3
    conn.close()
    hidden = b"GET /v1/score?key=abuser-0 HTTP/1.1\r\nHost: x\r\n\r\n"
    reply = raw(port, b"POST /v1/scores HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(hidden) + hidden)
    assert reply.startswith(b"HTTP/1.1 401") and reply.count(b"HTTP/1.1 ") == 1, reply[:500]
    end_before = sum(h.end_offsets().values())
    produce_murmur2(h, h.make_events(500, seed=6, abusers=2, users=50))
    assert get(port, "/live")[0] == 200
    h.wait_caught_up()
    assert sum(h.end_offsets().values()) == end_before + 500
    for w in workers:
        assert w.proc.poll() is None, w.log()[-3000:]


def test_a_non_loopback_bind_without_tokens_and_a_bad_token_file_refuse_to_start(harness, tmp_path) -> None:
    h = harness(partitions=1)
    bad = tmp_path / "bad-tokens"
    bad.write_text("gateway:short\n")
    for extra, needle in (({"web_host": "0.0.0.0"}, "query_token_file"),
                          ({"query_token_file": str(bad)}, "line 1"),
                          ({"query_token_file": str(tmp_path / "missing")}, "cannot be read")):
        w = h.start_worker(runtime="batch", **extra)
        assert w.proc.wait(60) == 2, w.log()[-2000:]
        lines = [x for x in w.log().splitlines() if x.strip()]
        assert any(needle in x for x in lines) and "Traceback" not in w.log(), w.log()[-2000:]
    # The CLI client presents its token file; without one the worker's 401 is an error line.
    tokens = tmp_path / "tokens"
    write_tokens(tokens, ["worker", "gateway"])
    w = h.start_worker(runtime="batch", query_token_file=str(tokens))
    wait_for(lambda: (ready(w.web_port) or {}).get("ready"), 60, "a ready worker")
    url = f"http://127.0.0.1:{w.web_port}"
    base = [sys.executable, "-m", "grudge_stream.cli", "score", "abuse_scores", "never-seen", "--url", url, "--json"]
    out = subprocess.run(base, capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 1 and "unauthenticated" in out.stderr
    out = subprocess.run(base + ["--token-file", str(tokens)], capture_output=True, text=True, timeout=60,
                         cwd=str(tmp_path))
    assert out.returncode == 0 and json.loads(out.stdout)["score"] == 0.0, out.stderr
