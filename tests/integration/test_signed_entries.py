"""Signed members records and overrides against the real broker (``signing_keys_file``): two
workers of abuse_scores sign their members records; a forged record claiming every partition
(unsigned, or signed under a key the workers do not hold) does not redirect a query, and is
counted. A forged deny written straight to the overrides topic has no effect on the workers
or a verifying AlertView, and is counted; a deny signed by ``grudge-stream override`` applies,
its ``by`` the signer's key name."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from confluent_kafka import Producer

from grudge_stream.client import AlertView
from grudge_stream.overrides import encode_override
from grudge_stream.serving import partition_for
from grudge_stream.signing import SigningKeys

PARTITIONS = 2


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def get_json(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except OSError:
        return 0, {}


def rejected(port: int, topic: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f'grudge_entries_rejected_total{{topic="{topic}"}}'):
                return float(line.split()[-1])
    return 0.0


def produce_raw(bootstrap: str, topic: str, key: bytes, value: bytes | None) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, key=key, value=value)
    assert p.flush(30) == 0


def test_forged_members_and_overrides_are_ignored_and_counted(harness, tmp_path) -> None:
    keys = tmp_path / "signing-keys"
    keys.write_text("workers:" + "w" * 40 + "\nalice:" + "a" * 40 + "\n")
    alice = tmp_path / "alice-key"
    alice.write_text("alice:" + "a" * 40 + "\n")
    h = harness(partitions=PARTITIONS, signing_keys_file=str(keys))
    workers = [h.start_worker(runtime="batch"), h.start_worker(runtime="batch")]
    now = int(time.time() * 1000)
    users = [f"user-{i}".encode() for i in range(40)]
    h.produce([(users[i % 40], b'{"outcome":"good"}', now - 5000 + i) for i in range(400)])

    def split():
        r = [get_json(w.web_port, "/ready")[1] for w in workers]
        if not all(x and x.get("ready") for x in r):
            return None
        held = [set(x["restored"]) for x in r]
        return held if all(held) and set().union(*held) == set(range(PARTITIONS)) else None
    held = wait_for(split, 90, "two ready workers sharing the partitions")
    port = workers[0].web_port
    foreign = next(k for k in users if partition_for(k, PARTITIONS) not in held[0]).decode()

    def asked():
        status, doc = get_json(port, "/v1/score?" + urllib.parse.urlencode({"key": foreign}))
        return doc if status == 200 else None
    assert wait_for(asked, 30, "a forwarded answer")["served_by"].endswith(f":{workers[1].web_port}")

    # Forged members records: unsigned, and signed under a key the workers do not hold, each
    # newer than the real ones and claiming every partition for an address nobody serves.
    members = f"{h.topology.app_id}-members"
    forged = {"member": "evil", "url": "http://127.0.0.1:9", "partitions": list(range(PARTITIONS)),
              "partition_count": PARTITIONS, "timestamp_ms": now + 3_600_000}
    produce_raw(h.bootstrap, members, b"evil", json.dumps(forged).encode())
    mallory = SigningKeys.parse("workers:" + "m" * 40 + "\n", "mallory")
    produce_raw(h.bootstrap, members, b"evil2", mallory.sign("members", b"evil2", {**forged, "member": "evil2"}))
    for w in workers:
        wait_for(lambda w=w: rejected(w.web_port, "members") >= 2, 30, "forged members records counted")
    doc = asked()
    assert doc is not None and doc["served_by"].endswith(f":{workers[1].web_port}"), doc

    # A forged deny straight on the overrides topic, and a signed one from the CLI.
    topic = h.topology.overrides_topic
    produce_raw(h.bootstrap, topic, b"user-1", encode_override("deny", by="alice"))
    cmd = [sys.executable, "-m", "grudge_stream.cli", "override", "abuse_scores", "deny", "user-2",
           "--bootstrap-servers", h.bootstrap, "--reason", "test"]
    for k, v in {**h.overrides, "signing_keys_file": str(alice)}.items():
        if k not in ("bootstrap_servers", "seed"):
            cmd += ["--set", f"{k}={v}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 0 and "signed by alice" in out.stdout, out.stderr
    view = AlertView(h.bootstrap, h.topology.outputs["alert_state"], topic,
                     signing=SigningKeys.from_file(str(keys))).start(30)
    try:
        wait_for(lambda: view.is_raised("user-2"), 10, "the signed deny in the view")
        assert view.get("user-2").override.by == "alice"
        assert not view.is_raised("user-1") and view.overrides_rejected >= 1
    finally:
        view.stop()
    # The workers: the forged entry counted, the signed one applied at the keys' next events.
    owner_of = {k: workers[0] if partition_for(k.encode(), PARTITIONS) in held[0] else workers[1]
                for k in ("user-1", "user-2")}
    wait_for(lambda: rejected(owner_of["user-1"].web_port, "overrides") >= 1, 30, "the forged deny counted")

    def judged():
        t = int(time.time() * 1000)
        h.produce([(b"user-1", b'{"outcome":"good"}', t), (b"user-2", b'{"outcome":"good"}', t)])
        time.sleep(0.3)
        a1 = get_json(port, "/v1/score?key=user-1")[1]
        a2 = get_json(port, "/v1/score?key=user-2")[1]
        return (a1, a2) if a2.get("override") == "deny" else None
    a1, a2 = wait_for(judged, 30, "the signed deny applied by the worker")
    assert a1.get("override") is None and a2["raised"] is True and a1["raised"] is False
