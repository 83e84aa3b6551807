"""Live score queries against the real broker: two workers of abuse_scores on a 4-partition
topic, traffic keyed with Kafka's murmur2 partitioner. Any worker answers any key: the owner
from its own state, the other by forwarding once; both answers equal a reference replay of
the records. A worker asked not to forward answers 503 not_owner for a partition it does not
hold, and while a rebalance runs (one worker killed) every answer is right or a clear 503."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from grudge_stream.serving import partition_for

PARTITIONS = 4
RETRYABLE = {"not_owner", "owner_unknown", "owner_unreachable", "not_ready"}


def ask(port: int, keys: list[bytes], forward: bool = True, path: str = "/v1/scores") -> tuple[int, object, dict]:
    q = urllib.parse.urlencode([("key", k.decode()) for k in keys] + ([] if forward else [("forward", "0")]))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}?{q}", timeout=10) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)


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
    p = Producer({"bootstrap.servers": h.bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
    for key, value, ts in events:
        while True:
            try:
                p.produce(h.topology.source_topic, key=key, value=value, timestamp=ts)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0


def read_members(bootstrap: str, topic: str) -> dict[str, bytes | None]:
    """The last value per member id on the (one-partition) members topic."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"members-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    try:
        end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
        c.assign([TopicPartition(topic, 0, 0)])
        out: dict[str, bytes | None] = {}
        deadline = time.monotonic() + 30
        pos = 0
        while pos < end:
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            m = c.poll(0.5)
            if m is not None and not m.error():
                out[m.key().decode()] = m.value()
                pos = m.offset() + 1
        return out
    finally:
        c.close()


def expected(ref: dict, key: bytes) -> dict:
    p = partition_for(key, PARTITIONS, "murmur2")
    op = ref[p]["op"]
    # The kernel's own read (it writes the decay back: harmless here, every read is at the
    # same watermark, and this reference operator is thrown away).
    d = op.sketch.query_detailed(key, op.watermark)
    return {"partition": p, "score": d["score"], "punishment": d["punishment"],
            "forgiveness": d["forgiveness"], "raised": key in op.latch, "watermark_ms": op.watermark}


def check(ans: dict, want: dict) -> None:
    assert ans["partition"] == want["partition"]
    assert ans["score"] == want["score"]
    assert ans["raised"] == want["raised"]
    assert ans["watermark_ms"] == want["watermark_ms"]
    # The default answer: the score and its verdict, no per-level reads, cells or offsets.
    assert "detail" not in ans and "next_offset" not in ans


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_any_worker_answers_from_the_owner_and_rebalances_fail_clearly(harness, runtime) -> None:
    h = harness(partitions=PARTITIONS, session_timeout_s=6, heartbeat_interval_s=1)
    workers = [h.start_worker(runtime=runtime), h.start_worker(runtime=runtime)]
    events = h.make_events(12_000, seed=13, abusers=6, users=300)
    produce_murmur2(h, events)
    keys = [f"abuser-{i}".encode() for i in range(6)] + [f"user-{i}".encode() for i in range(0, 300, 15)]
    keys.append(b"never-seen")

    # Both workers hold partitions, together all of them.
    def split():
        r = [ready(w.web_port) for w in workers]
        if not all(x and x["ready"] for x in r):
            return None
        held = [set(x["restored"]) for x in r]
        return held if all(held) and set().union(*held) == set(range(PARTITIONS)) else None
    held = wait_for(split, 90, "two ready workers sharing the partitions")
    h.wait_caught_up()
    records = h.source_records()
    ends = h.end_offsets()
    ref = h.reference(records)
    for k in keys[:-1]:  # the producer's murmur2_random put each key where partition_for says
        p = partition_for(k, PARTITIONS, "murmur2")
        assert any(r.key == k for r in records[p])
    want = {k: expected(ref, k) for k in keys}
    assert any(w["raised"] for w in want.values()) and any(w["score"] > 0 for w in want.values())

    # Every worker answers every key (the directory may need a moment to list both).
    def all_answered(port):
        status, doc, _ = ask(port, keys)
        return doc["results"] if status == 200 and not any(r.get("error") for r in doc["results"]) else None
    answers = [wait_for(lambda w=w: all_answered(w.web_port), 30, "answers") for w in workers]
    for i, k in enumerate(keys):
        a, b = answers[0][i], answers[1][i]
        p = want[k]["partition"]
        check(a, want[k])
        check(b, want[k])
        owner = 0 if p in held[0] else 1
        # The owner answered itself; the other forwarded once, to the owner, and got its answer.
        assert "forwarded_by" not in answers[owner][i]
        assert answers[1 - owner][i]["served_by"].endswith(f":{workers[owner].web_port}")
        assert answers[1 - owner][i]["forwarded_by"].endswith(f":{workers[1 - owner].web_port}")
        assert {x: y for x, y in a.items() if x != "forwarded_by"} == {
            x: y for x, y in b.items() if x != "forwarded_by"}

    # A single key: the answer itself. Asked not to forward: 503 not_owner with Retry-After.
    status, doc, _ = ask(workers[0].web_port, [keys[0]], path="/v1/score")
    assert status == 200 and doc["key"] == keys[0].decode() and doc["score"] == want[keys[0]]["score"]
    foreign = next(k for k in keys if want[k]["partition"] not in held[0])
    status, doc, headers = ask(workers[0].web_port, [foreign], forward=False, path="/v1/score")
    assert status == 503 and doc["error"] == "not_owner" and doc["partition"] == want[foreign]["partition"]
    assert int(headers["Retry-After"]) >= 1

    # The CLI prints the same answers (JSON lines), asked through either worker.
    if runtime == "batch":
        out = subprocess.run([sys.executable, "-m", "grudge_stream.cli", "score", "abuse_scores",
                              keys[0].decode(), foreign.decode(), "--url", f"http://127.0.0.1:{workers[0].web_port}",
                              "--json"], capture_output=True, text=True, timeout=60,
                             cwd=str(h.tmp_path))  # not the checkout: the installed package
        assert out.returncode == 0, out.stderr
        got = [json.loads(line) for line in out.stdout.splitlines()]
        assert [g["score"] for g in got] == [want[keys[0]]["score"], want[foreign]["score"]]

    # kill -9 one worker and ask the other at once, until it owns everything: every answer
    # is the right partition's right state, or a clear 503.
    workers[1].kill9()
    errors: set[str] = set()
    deadline = time.monotonic() + 90
    while True:
        status, doc, headers = ask(workers[0].web_port, keys)
        assert status in (200, 503), doc
        results = doc["results"]
        for k, ans in zip(keys, results):
            if ans.get("error"):
                assert ans["error"] in RETRYABLE, ans
                errors.add(ans["error"])
            else:
                check(ans, want[k])
        if status == 503:
            assert int(headers["Retry-After"]) >= 1
        if not any(r.get("error") for r in results):
            break
        assert time.monotonic() < deadline, f"worker 0 never took over: {errors}\n{workers[0].log()[-3000:]}"
        time.sleep(0.05)
    assert errors, "the killed worker's partitions were answered before anyone held them"

    # A clean shutdown leaves a tombstone on the members topic: nobody forwards there any more.
    if runtime == "batch":
        assert workers[0].stop() == 0
        members = read_members(h.bootstrap, f"{h.topology.app_id}-members")
        assert members[f"http://127.0.0.1:{workers[0].web_port}"] is None
        assert members[f"http://127.0.0.1:{workers[1].web_port}"] is not None  # killed: no tombstone
