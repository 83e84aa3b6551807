"""Live reads of the state of a Quix Streams application (``grudge.serve`` of
``grudge_stream.quix``), on the real broker.

The example app (examples/quix_app.py) runs as two instances of one consumer group; each
holds some partitions of ``logins`` and serves the state's reads on a port of its own (Quix
has no web server: the binding starts one). A score read of a key on either instance
(``/grudge/<state>/v1/score``) is answered by the instance that holds the key's partition:
both answers name the same ``served_by``, carry the same score, and that score is the one
an uninterrupted replay of the partition computes, whose state each partition's final
snapshot equals byte for byte. The token of the query token file is required: without it
401, with another one 403, on both instances. Once records of keys placed by another
partitioner (crc32) are applied, the answers say ``partitioner_check: mismatched``. The ban
list of the state (``grudge-stream alerts --state NAME``) holds the replay's raised set.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("quixstreams", reason="Quix Streams is not installed: pip install 'grudge-stream[quix]' "
                                          "(make test installs it with the test extras)")

from confluent_kafka import Producer  # noqa: E402

from grudge_stream.serving import partition_for  # noqa: E402
from tests.integration.test_embedded_quix import EXAMPLE, QuixScenario, assert_exact  # noqa: E402

ARGS = ["--web-port", "{port}"]


@pytest.fixture
def scenario(kafka_bootstrap, tmp_path):
    s = QuixScenario(kafka_bootstrap, tmp_path, EXAMPLE, ARGS, table=None)
    # Keys placed as Quix's own producers place them: murmur2 (the reads' default).
    s.producer = Producer({"bootstrap.servers": s.bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
    yield s
    s.close()


def get(port: int, path: str, token: str | None, **params: str) -> tuple[int, dict, dict]:
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)
    except OSError as e:  # not listening yet
        return 0, {"error": str(e)}, {}


def reference_scores(scenario, keys: list[bytes]) -> dict[bytes, dict]:
    """Each key's ``describe_key`` in an uninterrupted replay of its partition's records."""
    records = defaultdict(list)
    for m in scenario.read_all(scenario.source):
        records[m.partition()].append(m)
    out = {}
    for p, msgs in records.items():
        op = scenario.state.topology.make_operator(p)
        for m in sorted(msgs, key=lambda m: m.offset()):
            outcome = scenario.example.outcome_of(m.value())
            if outcome is not None and m.key():
                op.apply_event(m.key(), scenario.example.DELTAS[outcome], offset=m.offset(),
                               timestamp_ms=m.timestamp()[1])
        for k in keys:
            if partition_for(k, scenario.PARTITIONS) == p:
                out[k] = op.describe_key(k)
    return out


def test_a_score_read_on_either_quix_instance_is_the_owners(scenario):
    t0 = time.monotonic()
    events = scenario.events(12_000, seed=53, abusers=6, users=400)
    scenario.produce(events[:8_000])
    a = scenario.start("a")
    b = scenario.start("b")
    scenario.wait_done()
    name = scenario.state.name
    path = f"/grudge/{name}/v1/score"
    keys = [f"abuser-{i}".encode() for i in range(6)] + [f"user-{i}".encode() for i in range(0, 400, 25)]
    ports = {"a": a.web_port, "b": b.web_port}
    urls = {n: f"http://127.0.0.1:{port}/grudge/{name}" for n, port in ports.items()}

    def ask_all() -> dict:
        """Every key on both instances, once each has published what it holds and both answer."""
        deadline = time.monotonic() + 90
        while True:
            got = {(k, n): get(port, path, scenario.token, key=k.decode()) for k in keys for n, port in ports.items()}
            if all(status == 200 for status, _, _ in got.values()):
                return got
            assert time.monotonic() < deadline, (
                [(k, n, s, body) for (k, n), (s, body, _) in got.items() if s != 200][:4], scenario.logs())
            time.sleep(1.0)

    ask_all()
    # The rest of the traffic while both instances hold their partitions: the keys they
    # apply are sampled against the partitioner (an instance that restored its partitions
    # at their end has checked none, and says "unverified" until it has).
    scenario.produce(events[8_000:])
    scenario.wait_done()
    answers = ask_all()

    ref = reference_scores(scenario, keys)
    served = defaultdict(set)
    for k in keys:
        on_a, on_b = answers[(k, "a")][1], answers[(k, "b")][1]
        # The owner's answer on both: the same instance read it, at the same state.
        assert on_a["served_by"] == on_b["served_by"] in urls.values(), (on_a, on_b)
        served[on_a["served_by"]].add(k)
        for body in (on_a, on_b):
            assert body["partition"] == partition_for(k, scenario.PARTITIONS)
            assert body["score"] == ref[k]["score"] and body["raised"] == ref[k]["raised"], (k, body, ref[k])
            # The score only: no cell indexes or per-level reads, and a verified partitioner.
            assert "detail" not in body and "cell_indexes" not in json.dumps(body), body
            assert "partitioner_check" not in body, body
        reader = "a" if on_a["served_by"] == urls["a"] else "b"
        other = "b" if reader == "a" else "a"
        assert "forwarded_by" not in answers[(k, reader)][1]
        assert answers[(k, other)][1]["forwarded_by"] == urls[other]
    assert set(served) == set(urls.values()), served  # each instance owns some of the keys
    assert any(ref[k]["raised"] for k in keys), "no planted abuser raised: the test means nothing"

    # Several keys at once on either instance: /v1/scores, split between the owners.
    many = f"/grudge/{name}/v1/scores"
    status, body, _ = get(a.web_port, many, scenario.token, key=keys[0].decode())
    assert status == 200 and body["results"][0]["score"] == ref[keys[0]]["score"], body
    req = urllib.request.Request(f"http://127.0.0.1:{b.web_port}{many}", method="POST",
                                 data=json.dumps([k.decode() for k in keys]).encode(),
                                 headers={"Authorization": f"Bearer {scenario.token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        results = json.loads(r.read())["results"]
    assert [(x["key"], x["score"], x["served_by"]) for x in results] == [
        (k.decode(), ref[k]["score"], answers[(k, "a")][1]["served_by"]) for k in keys]

    # The access rules of a worker's /v1/score: no token 401, another token 403.
    for port in ports.values():
        status, body, headers = get(port, path, None, key="abuser-0")
        assert status == 401 and body["error"] == "unauthenticated", body
        assert headers.get("WWW-Authenticate", "").startswith("Bearer"), headers
        status, body, _ = get(port, path, "x" * 32, key="abuser-0")
        assert status == 403 and body["error"] == "forbidden", body
        assert "score" not in body

    # The ban list of the state, by its name, from the state's topics.
    cli = str(Path(sys.executable).with_name("grudge-stream"))
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS" and not k.startswith("GRUDGE_")}
    shown = subprocess.run([cli, "alerts", "--state", name, "--bootstrap-servers", scenario.bootstrap], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    listed = {ln.split()[1].encode() for ln in shown.stdout.splitlines() if ln.startswith("raised ")}
    want = scenario.expected_raised()
    assert want and listed == want, (shown.stdout, want)
    assert listed & set(keys) == {k for k in keys if ref[k]["raised"]}  # as the reads say

    # Keys placed by another partitioner (librdkafka's default, crc32): once the instances
    # have sampled some, every answer says the partitioner does not match.
    crc = Producer({"bootstrap.servers": scenario.bootstrap, "linger.ms": 5})  # consistent_random: crc32
    placed: dict[int, list[bytes]] = defaultdict(list)
    i = 0
    while min((len(placed[p]) for p in range(scenario.PARTITIONS)), default=0) < 2:
        k = f"elsewhere-{i}".encode()
        i += 1
        if partition_for(k, scenario.PARTITIONS, "crc32") != partition_for(k, scenario.PARTITIONS):
            placed[partition_for(k, scenario.PARTITIONS, "crc32")].append(k)
    for p_keys in placed.values():
        for j in range(100):  # 100 consecutive offsets of each partition: one at least is sampled
            crc.produce(scenario.source, key=p_keys[j % 2], value=b'{"outcome":"good"}')
    assert crc.flush(30) == 0
    deadline = time.monotonic() + 60
    while True:
        checks = {n: get(port, path, scenario.token, key=keys[0].decode())[1].get("partitioner_check")
                  for n, port in ports.items()}
        if set(checks.values()) == {"mismatched"}:
            break
        assert time.monotonic() < deadline, (checks, scenario.logs())
        time.sleep(0.5)

    scenario.wait_done()
    assert a.stop() == 0, a.log_text()
    assert b.stop() == 0, b.log_text()
    assert any("not where key_partitioner=murmur2 puts" in app.log() for app in (a, b))
    for app in (a, b):
        assert "Traceback" not in app.log(), app.log_text()
        assert "live reads at" in app.log()
    # The owners' state: every partition's final snapshot equals the replay's, alert by alert.
    assert_exact(scenario.check())
    print(f"quix live reads: {len(keys)} keys asked on both instances, {len(served[urls['a']])} served by a, "
          f"{len(served[urls['b']])} by b, every answer the owner's; {len(listed)} raised listed; "
          f"{time.monotonic() - t0:.1f}s")


def test_without_a_token_file_on_every_address_the_app_does_not_start(scenario):
    """The example app served on every address without a token file: serve() refuses in one
    line naming the argument, before the app joins its group."""
    scenario.env.pop("GRUDGE_QUERY_TOKEN_FILE")
    scenario.args = ["--web-host", "0.0.0.0", "--web-port", "{port}"]
    app = scenario.start("open")
    try:
        rc = app.proc.wait(120)
    except subprocess.TimeoutExpired:
        raise AssertionError("the app did not stop:\n" + app.log_text()) from None
    log = app.log_text()
    assert rc == 2, log
    assert "live reads cannot be served: host: live reads served on 0.0.0.0 would answer anyone" in log, log
    assert "Traceback" not in log, log
