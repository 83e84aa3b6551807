"""Live reads of embedded state on the Faust app's own web server (``grudge.serve``), on the real broker.

The example app (examples/faust_app) runs as two instances of one group; each holds
some partitions of ``logins``. A score read of a key on either instance's web server
(``/grudge/<state>/v1/score``) is answered by the instance that holds the key's
partition: both answers name the same ``served_by``, carry the same score, and that
score is the one an uninterrupted replay of the partition computes. The token of the
query token file is required: without it 401, with another one 403, on both instances.
Once records of keys placed by another partitioner (crc32) reach the agents, the answers
say ``partitioner_check: mismatched``.
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Producer

from grudge_stream.serving import partition_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "faust_app" / "app.py"
ARGS = ["worker", "-l", "info", "--web-host", "127.0.0.1", "--web-port", "{port}"]


@pytest.fixture
def scenario(embedded):
    s = embedded(EXAMPLE, ARGS, table="logins-per-user")
    # Keys placed as the app's producers place them: Kafka's default partitioner (murmur2),
    # that of Faust's own producer and Java clients; the state's key_partitioner default.
    s.producer = Producer({"bootstrap.servers": s.bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
    return s


def get(port: int, path: str, token: str | None, **params: str) -> tuple[int, dict, dict]:
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


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


def test_a_score_read_on_either_instance_is_the_owners(scenario):
    events = scenario.events(12_000, seed=37, abusers=6, users=400)
    scenario.produce(events)
    a = scenario.start("a")
    b = scenario.start("b")
    scenario.wait_done()
    path = f"/grudge/{scenario.state.name}/v1/score"
    keys = [f"abuser-{i}".encode() for i in range(6)] + [f"user-{i}".encode() for i in range(0, 400, 25)]
    ports = {"a": a.web_port, "b": b.web_port}
    urls = {name: f"http://127.0.0.1:{port}/grudge/{scenario.state.name}" for name, port in ports.items()}

    # Until each instance has published what it holds and both answer every key.
    deadline = time.monotonic() + 90
    while True:
        answers = {(k, name): get(port, path, scenario.token, key=k.decode()) for k in keys
                   for name, port in ports.items()}
        if all(status == 200 for status, _, _ in answers.values()):
            break
        assert time.monotonic() < deadline, (
            [(k, n, s, body) for (k, n), (s, body, _) in answers.items() if s != 200][:4], scenario.logs())
        time.sleep(1.0)

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
    many = "/grudge/{}/v1/scores".format(scenario.state.name)
    status, body, _ = get(a.web_port, many, scenario.token, key=keys[0].decode())
    assert status == 200 and body["results"][0]["score"] == ref[keys[0]]["score"], body

    # The access rules of a worker's /v1/score: no token 401, another token 403.
    for port in ports.values():
        status, body, headers = get(port, path, None, key="abuser-0")
        assert status == 401 and body["error"] == "unauthenticated", body
        assert headers.get("WWW-Authenticate", "").startswith("Bearer"), headers
        status, body, _ = get(port, path, "x" * 32, key="abuser-0")
        assert status == 403 and body["error"] == "forbidden", body
        assert "score" not in body

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
        checks = {name: get(port, path, scenario.token, key=k.decode())[1].get("partitioner_check")
                  for name, port in ports.items() for k in keys[:1]}
        if set(checks.values()) == {"mismatched"}:
            break
        assert time.monotonic() < deadline, (checks, scenario.logs())
        time.sleep(0.5)

    assert a.stop() == 0, a.log_text()
    assert b.stop() == 0, b.log_text()
    assert any("not where key_partitioner=murmur2 puts" in app.log() for app in (a, b))
    for app in (a, b):
        assert "Traceback" not in app.log(), app.log_text()
        assert "live reads at" in app.log()
    print(f"embedded live reads: {len(keys)} keys asked on both instances, "
          f"{len(served[urls['a']])} served by a, {len(served[urls['b']])} by b, every answer the owner's")


def test_without_a_token_file_on_every_address_the_app_stops_with_status_2(scenario):
    """The example app bound as Faust binds by default (every address) and no token file: it
    refuses to start in one line, as a worker does, before any record reaches an agent."""
    scenario.env.pop("GRUDGE_QUERY_TOKEN_FILE")
    app = scenario.start("open")
    try:
        rc = app.proc.wait(120)
    except subprocess.TimeoutExpired:
        raise AssertionError("the app did not stop:\n" + app.log_text()) from None
    log = app.log_text()
    assert rc == 2, log
    assert "live reads on the app's web server cannot start: the app's web server binds 0.0.0.0" in log, log
    assert "Traceback" not in log, log
