"""A confident wrong answer made visible, against the real broker: events produced with a
plain confluent-kafka producer (librdkafka's default crc32 partitioner) to a worker left at
key_partitioner=murmur2. The worker counts the mismatches, warns once with the fix, and
``/ready`` and every score answer say ``mismatched``; with key_partitioner=crc32 the same
records are ``verified``."""
from __future__ import annotations

import json
import re
import time
import urllib.request


def get(port: int, path: str) -> dict | str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        body = resp.read().decode()
    return body if path == "/metrics" else json.loads(body)


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
        time.sleep(0.2)


def test_a_producer_on_another_partitioner_is_counted_and_said(harness) -> None:
    h = harness(partitions=4)
    now = int(time.time() * 1000)
    h.produce([(f"user-{i % 50}".encode(), b'{"outcome":"bad"}', now - 3000 + i) for i in range(600)])  # crc32
    wrong = h.start_worker(runtime="batch")
    right = h.start_worker(runtime="batch", key_partitioner="crc32", app_name=f"{h.overrides['app_name']}-crc",
                           operator_id=f"{h.overrides['operator_id']}-crc")
    rep = wait_for(lambda: (r := get(wrong.web_port, "/ready")["key_partitioner"])["checked"] and r, 60,
                   "keys checked")
    assert rep["name"] == "murmur2" and rep["status"] == "mismatched" and rep["mismatched"] > 0
    metrics = get(wrong.web_port, "/metrics")
    assert sum(float(x) for x in re.findall(r'^grudge_partitioner_mismatches_total\{[^}]*\} (\S+)$', metrics, re.M)) > 0
    ans = wait_for(lambda: (a := get(wrong.web_port, "/v1/score?key=user-1")) and "score" in a and a, 30, "an answer")
    assert ans["partitioner_check"] == "mismatched"
    log = wrong.log()
    assert log.count("not where key_partitioner=murmur2 puts") == 1 and "key_partitioner=crc32" in log
    rep = wait_for(lambda: (r := get(right.web_port, "/ready")["key_partitioner"])["checked"] and r, 60,
                   "keys checked (crc32)")
    assert rep["status"] == "verified" and rep["mismatched"] == 0
    # The partition's records applied (its watermark moved), not only its slot restored: an
    # answer before that is an honest 0 with no watermark.
    ans = wait_for(lambda: (a := get(right.web_port, "/v1/score?key=user-1")) and a.get("watermark_ms") and a,
                   30, "an answer from a partition that has applied its records")
    assert "partitioner_check" not in ans and ans["score"] > 0
