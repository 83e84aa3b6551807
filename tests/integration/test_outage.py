"""A broker outage on the real broker, both runtimes and both ingest paths at once: each worker
rides it out, says so in a few lines, /ready turns 503 and back, and it catches up afterwards."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Producer

from grudge_devkafka import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def devkafka(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "grudge_devkafka", *args], capture_output=True, text=True,
                         timeout=180, cwd="/")
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""


def http(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


KINDS = [("batch", "python"), ("batch", "native"), ("faust", "python")]


def test_workers_ride_out_a_broker_outage(harness, tmp_path, kafka_bootstrap) -> None:
    """One outage, ridden out by a worker of each kind at once (the batch runtime on both ingest
    paths, the Faust runtime), each with a topology and group of its own on the stopped broker."""
    if kafka_bootstrap and not kafka_bootstrap.startswith("127.0.0.1"):
        pytest.skip("needs a local broker it can stop")
    port = free_port()
    state = tmp_path / "broker"
    bs = devkafka("start", "--dir", str(state), "--port", str(port))
    try:
        from grudge_stream.topics import ensure_topology_topics

        runs = []
        for runtime, ingest in KINDS:
            h = harness(partitions=2)  # topics on the session broker are not used below
            h.tmp_path = tmp_path / f"{runtime}-{ingest}"  # each its own logs and state directory
            h.tmp_path.mkdir()
            h.bootstrap = bs
            ensure_topology_topics(h.topology, bs, partitions=2, create_source=True)
            h.producer = Producer({"bootstrap.servers": bs, "linger.ms": 5})
            h.overrides["bootstrap_servers"] = bs
            h.produce(h.make_events(3000, seed=61))
            runs.append((f"{runtime}-{ingest}", h, h.start_worker(runtime=runtime, ingest=ingest)))
        lines_before = {}
        for name, h, w in runs:
            h.wait_caught_up()
            wait_for(lambda: http(w.web_port, "/ready")[0] == 200, 30, f"{name}: never ready")
            lines_before[name] = len(w.log().splitlines())
        devkafka("stop", "--dir", str(state))
        for name, h, w in runs:
            wait_for(lambda: http(w.web_port, "/ready")[0] == 503, 30,
                     f"{name}: /ready stayed 200 with the broker down")
            assert http(w.web_port, "/ready")[1]["broker"] is False, name
        time.sleep(30)
        outage_lines = {}
        for name, h, w in runs:
            assert w.proc.poll() is None, (name, w.log()[-3000:])
            assert http(w.web_port, "/live")[0] == 200, name
            outage_lines[name] = len(w.log().splitlines()) - lines_before[name]
        devkafka("start", "--dir", str(state), "--port", str(port), "--keep-data")
        for name, h, w in runs:
            h.producer = Producer({"bootstrap.servers": bs, "linger.ms": 5})
            h.produce(h.make_events(2000, seed=62))
        for name, h, w in runs:
            h.wait_caught_up(timeout=180)
            wait_for(lambda: http(w.web_port, "/ready")[0] == 200, 30, f"{name}: not ready again after the outage")
            body = urllib.request.urlopen(f"http://127.0.0.1:{w.web_port}/metrics", timeout=5).read().decode()
            assert "grudge_consumer_lag_records{" in body and "process_resident_memory_bytes" in body, name
        for name, h, w in runs:
            assert w.stop() == 0, (name, w.log()[-3000:])
            # A 30+ s outage is a few dozen lines, not thousands (repeats are collapsed).
            lines = w.log().splitlines()
            assert outage_lines[name] < 200, (name, "\n".join(lines[lines_before[name]:lines_before[name] + 60]))
    finally:
        subprocess.run([sys.executable, "-m", "grudge_devkafka", "stop", "--dir", str(state)],
                       capture_output=True, timeout=120, cwd="/")
