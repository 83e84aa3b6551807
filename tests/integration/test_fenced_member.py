"""A static member fenced by another consumer with its ``group_instance_id`` (a pod replaced
while its old incarnation still runs) never stays behind as a zombie: the worker replaces its
consumer in place and rejoins (or ends with the fault code, and catches up once restarted),
``/ready`` and ``/live`` tell the truth at every step, and the outputs match an uninterrupted
in-process replay (docs/operations.md, "A fenced static member")."""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest
from confluent_kafka import Consumer

from grudge_stream.exceptions import EXIT_FAULT

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def http(port: int, path: str) -> tuple[int | None, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except OSError:
        return None, {}


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def intrude(bootstrap: str, group: str, instance_id: str, topic: str, seconds: float) -> list[str]:
    """A plain consumer joins ``group`` as ``instance_id`` for ``seconds``, then leaves; the
    errors it met (it is fenced in turn once the worker rejoins)."""
    errors: list[str] = []
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": instance_id,
                  "enable.auto.commit": False, "session.timeout.ms": 10_000, "log_level": 0,
                  "error_cb": lambda err: errors.append(err.str())})
    c.subscribe([topic])
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error():
                errors.append(m.error().str())
    finally:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - fenced by the worker's new consumer
            pass
    return errors


@pytest.mark.parametrize("ingest", ["python", "native"], ids=["python-ingest", "native-ingest"])
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_batch_worker_replaces_a_fenced_consumer(harness, exactly_once: bool, ingest: str) -> None:
    h = harness(partitions=2, session_timeout_s=10, heartbeat_interval_s=1, commit_interval_s=1,
                exactly_once=str(exactly_once).lower())
    first = h.make_events(3000, seed=11)
    h.produce(first)
    w = h.start_worker(runtime="batch", group_instance_id="w0", ingest=ingest)
    w.wait_ready()
    h.wait_caught_up()
    assert http(w.web_port, "/live")[0] == 200
    # The path asked for is the path that runs, and the worker says so.
    assert http(w.web_port, "/ready")[1]["ingest"] == ingest
    assert metric(w.web_port, "grudge_ingest_native") == (1.0 if ingest == "native" else 0.0)

    # Another consumer joins the group as w0 for 8 s: the worker's consumer is fenced.
    seen: list[tuple[int | None, int | None]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append((http(w.web_port, "/ready")[0], http(w.web_port, "/live")[0]))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    intrude(h.bootstrap, h.topology.app_id, "w0", h.topology.source_topic, 8.0)

    # Records produced after the fencing are processed by the worker's new consumer.
    second = h.make_events(3000, seed=12, start_ms=first[-1][2] + 1)
    h.produce(second)
    deadline = time.monotonic() + 120
    while http(w.web_port, "/ready")[0] != 200:
        assert w.proc.poll() is None, f"worker exited {w.proc.returncode}: {w.log()[-3000:]}"
        assert time.monotonic() < deadline, f"not ready again: {w.log()[-3000:]}"
        time.sleep(0.5)
    h.wait_caught_up(timeout=120)
    stop.set()
    watcher.join(5)

    log = w.log()
    assert "failed for good" in log, log[-3000:]
    assert metric(w.web_port, "grudge_consumers_renewed_total") >= 1
    assert http(w.web_port, "/ready")[1]["ingest"] == ingest  # the renewed consumer reads the same way
    assert metric(w.web_port, "grudge_consumer_fatal_errors_total") >= 1
    # The worker never stopped making progress: /live answered 200 throughout.
    assert all(live == 200 for _, live in seen), seen
    # (The replacement and the rejoin take well under the watch's half-second between
    # samples here, so /ready's 503 while the new consumer has no assignment is seldom seen.)
    assert seen and seen[-1] == (200, 200), seen
    assert w.proc.poll() is None
    assert w.stop() == 0, w.log()[-3000:]

    ref = h.reference()
    assert h.final_state() == {p: ref[p]["sketch"] for p in ref}, "state diverged from the replay"
    alerts = [json.loads(m.value())["alert_id"]
              for m in h.read_all(h.topology.outputs["alerts"], read_committed=exactly_once)]
    want = set().union(*(ref[p]["alerts"] for p in ref))
    assert want, "the workload raised nothing: the check would be empty"
    assert set(alerts) == want, (len(set(alerts) - want), len(want - set(alerts)))
    if exactly_once:
        dup = [a for a, n in Counter(alerts).items() if n > 1]
        assert not dup, f"{len(dup)} alerts duplicated under exactly_once"


def test_batch_worker_fenced_again_and_again_ends_with_the_fault_code(harness, monkeypatch) -> None:
    """Two live incarnations that keep fencing each other: past the renewal limit the worker
    ends with EXIT_FAULT (never 2, the user-error code) for its orchestrator to restart."""
    h = harness(partitions=1, session_timeout_s=10, heartbeat_interval_s=1)
    h.produce(h.make_events(500, seed=5))
    w = h.start_worker(runtime="batch", group_instance_id="w1")
    w.wait_ready()
    deadline = time.monotonic() + 180
    while w.proc.poll() is None and time.monotonic() < deadline:
        intrude(h.bootstrap, h.topology.app_id, "w1", h.topology.source_topic, 4.0)
    assert w.proc.poll() is not None, f"worker still running after repeated fencing: {w.log()[-3000:]}"
    assert w.proc.returncode == EXIT_FAULT, w.log()[-3000:]
    assert "ending the worker for a restart" in w.log()


def test_faust_worker_fenced_ends_with_the_fault_code(harness) -> None:
    """The Faust runtime (aiokafka) cannot replace its consumer in place. Two incarnations
    under one group_instance_id (a replaced pod whose predecessor still runs) fence each
    other: aiokafka rejoins one in place, and the other's group coordination ends. That one
    ends with EXIT_FAULT (never 2, never alive and idle); the survivor goes on, and the
    outputs equal the replay's."""
    h = harness(partitions=2, session_timeout_s=10, heartbeat_interval_s=1)
    first = h.make_events(3000, seed=21)
    h.produce(first)
    a = h.start_worker(group_instance_id="f0")
    a.wait_ready()
    h.wait_caught_up()
    b = h.start_worker(group_instance_id="f0")
    started = time.monotonic()
    deadline = started + 90
    samples: list[tuple[float, tuple, tuple]] = []
    while a.proc.poll() is None and b.proc.poll() is None and time.monotonic() < deadline:
        samples.append((time.monotonic() - started, (http(a.web_port, "/ready")[0], http(a.web_port, "/live")[0]),
                        (http(b.web_port, "/ready")[0], http(b.web_port, "/live")[0])))
        time.sleep(0.5)
    ended_after = time.monotonic() - started
    ended = [w for w in (a, b) if w.proc.poll() is not None]
    assert len(ended) == 1, f"expected one fenced incarnation to end: {a.log()[-3000:]}\n{b.log()[-3000:]}"
    gone = ended[0]
    survivor = b if gone is a else a
    assert gone.proc.returncode == EXIT_FAULT, gone.log()[-4000:]
    assert "group coordination ended" in gone.log()
    # Never a member in name only for long: it ended within the liveness bound (60 s) of
    # the other incarnation's start, and /live answered 200 on both until then.
    assert ended_after < 60, (ended_after, samples[-5:])
    assert all(sa[1] in (200, None) and sb[1] in (200, None) for _, sa, sb in samples), samples
    second = h.make_events(3000, seed=22, start_ms=first[-1][2] + 1)
    h.produce(second)
    survivor.wait_ready(timeout=120)
    h.wait_caught_up(timeout=120)
    assert http(survivor.web_port, "/live")[0] == 200
    assert survivor.stop() == 0, survivor.log()[-3000:]
    ref = h.reference()
    assert h.final_state() == {p: ref[p]["sketch"] for p in ref}
    want = set().union(*(ref[p]["alerts"] for p in ref))
    assert want and h.alert_ids() == want


def test_a_fenced_faust_app_with_embedded_state_crashes_for_a_restart(kafka_bootstrap, make_topic,
                                                                      tmp_path) -> None:
    """A user's Faust app holding grudge state, fenced the same way: the app whose group
    coordination ended stops with one line and exit status 3 (a fault an orchestrator
    restarts), instead of running on as a member in name only; its states write no snapshot."""
    import os
    import secrets
    import subprocess
    import sys
    from pathlib import Path

    from confluent_kafka import Producer
    from grudge_devkafka import free_port

    source = make_topic(2)
    app_id = f"fenced-{secrets.token_hex(4)}"
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(200):
        p.produce(source, key=f"user-{i % 20}".encode(), value=b"bad" if i % 7 == 0 else b"good")
    assert p.flush(30) == 0
    script = Path(__file__).with_name("embedded_fenced_app.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRUDGE_", "KAFKA_"))}
    seed = secrets.token_hex(16)

    def start(name: str):
        log = tmp_path / f"{name}.log"
        args = [sys.executable, str(script), kafka_bootstrap, source, app_id, "e0", seed,
                str(tmp_path / f"{name}-data"), "worker", "-l", "info", "--web-port", str(free_port())]
        with open(log, "wb") as f:
            proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path))
        return proc, log

    a, a_log = start("a")
    try:
        deadline = time.monotonic() + 90
        while "Worker]: Ready" not in a_log.read_text(errors="replace"):
            assert a.poll() is None and time.monotonic() < deadline, a_log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        b, b_log = start("b")
        try:
            deadline = time.monotonic() + 90
            while a.poll() is None and b.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            logs = a_log.read_text(errors="replace")[-3000:] + b_log.read_text(errors="replace")[-3000:]
            ended = [(proc, log) for proc, log in ((a, a_log), (b, b_log)) if proc.poll() is not None]
            assert len(ended) == 1, logs
            proc, log = ended[0]
            text = log.read_text(errors="replace")
            logs = "\n".join(line for line in text.splitlines()
                             if "ERROR" in line or "rash" in line or "coordination" in line)[-4000:]
            assert proc.returncode == EXIT_FAULT, (proc.returncode, logs)
            assert "group coordination ended" in log.read_text(errors="replace"), logs
        finally:
            if b.poll() is None:
                b.terminate()
                b.wait(60)
    finally:
        if a.poll() is None:
            a.terminate()
            a.wait(60)
