"""The query API over TLS against the real broker: two workers of abuse_scores with a
certificate from a throw-away CA (openssl) and bearer tokens. Any worker answers any key over
HTTPS (forwards verify the owner's certificate and present the workers' token); a plain HTTP
request on the TLS port and a client that does not trust the CA are refused, and the workers
keep processing."""
from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Producer

from grudge_stream.serving import partition_for

PARTITIONS = 2
TOKEN = "tls-worker-token-" + "t" * 20


def make_cert(d) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=grudge-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "web.key", "-out", "web.csr", "-subj", "/CN=localhost")
    (d / "web.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "web.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "web.pem", "-days", "2", "-extfile", "web.ext")


def get(url: str, ctx: ssl.SSLContext | None, token: str | None = TOKEN) -> tuple[int, dict]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = pred()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_forwarding_over_tls_and_refusals(harness, tmp_path, runtime) -> None:
    if runtime == "faust":
        pytest.importorskip("faust")
    make_cert(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"worker:{TOKEN}\n")
    h = harness(partitions=PARTITIONS, query_token_file=str(tokens), web_tls_cert_file=str(tmp_path / "web.pem"),
                web_tls_key_file=str(tmp_path / "web.key"), web_tls_ca_file=str(tmp_path / "ca.pem"))
    workers = [h.start_worker(runtime=runtime), h.start_worker(runtime=runtime)]
    p = Producer({"bootstrap.servers": h.bootstrap, "partitioner": "murmur2_random"})
    now = int(time.time() * 1000)
    keys = [f"user-{i}" for i in range(20)]
    for i in range(400):
        p.produce(h.topology.source_topic, key=keys[i % 20].encode(), value=b'{"outcome":"bad"}',
                  timestamp=now - 2000 + i)
    assert p.flush(30) == 0
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))

    def split():
        r = [get(f"https://127.0.0.1:{w.web_port}/ready", ctx, None)[1] for w in workers]
        if not all(x and x.get("ready") for x in r):
            return None
        held = [set(x["restored"]) for x in r]
        return held if all(held) and set().union(*held) == set(range(PARTITIONS)) else None
    held = wait_for(split, 90, "two ready workers over https")
    base = f"https://127.0.0.1:{workers[0].web_port}"
    foreign = next(k for k in keys if partition_for(k.encode(), PARTITIONS) not in held[0])
    local = next(k for k in keys if partition_for(k.encode(), PARTITIONS) in held[0])

    def answered(k):
        status, doc = get(f"{base}/v1/score?key={k}", ctx)
        return doc if status == 200 else None
    fwd = wait_for(lambda: answered(foreign), 30, "a forwarded answer over https")
    assert fwd["served_by"] == f"https://127.0.0.1:{workers[1].web_port}" and fwd["score"] > 0
    assert "forwarded_by" in fwd and "forwarded_by" not in answered(local)
    assert get(f"{base}/v1/score?key={local}", ctx, None)[0] == 401

    # Refusals: a client that does not trust the CA, plain HTTP on the TLS port.
    with pytest.raises(urllib.error.URLError):
        get(f"{base}/live", ssl.create_default_context(), None)
    with socket.create_connection(("127.0.0.1", workers[0].web_port), timeout=5) as s:
        s.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            reply = s.recv(4096)
        except OSError:
            reply = b""
    assert b"200" not in reply.split(b"\r\n")[0]  # a TLS alert, a 400 or a closed connection
    assert get(f"{base}/live", ctx, None)[0] == 200
    for w in workers:
        assert w.proc.poll() is None, w.log()[-3000:]
