"""docs/embedding.md's Faust example, taken from the page and run as a user runs it.

The app is the page's ``python`` block after "In a Faust app", written to a file and
started with ``python shop_guard.py worker``: no ``KAFKA_BOOTSTRAP_SERVERS`` and no
``GRUDGE_*`` setting in its environment, only what the page's first hour exports
(``BROKER``, ``GRUDGE_SEED``), against the test broker on its non-default port. So the
state finds its cluster through the app (``broker="kafka://..."``) or not at all. The
names of the app, its topics and its state get a per-test suffix (the broker is shared
by the session); nothing else of the text is changed.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from grudge_devkafka import free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "embedding.md"


def example(section: str = "## In a Faust app") -> str:
    text = DOC.read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(section):], re.S).group(1)


def faust_example() -> str:
    return example()


def cli() -> str:
    return str(Path(sys.executable).with_name("grudge-stream"))


class DocApp:
    def __init__(self, bootstrap: str, tmp: Path, edit=None) -> None:
        self.run = uuid.uuid4().hex[:6]
        code = faust_example()
        for name in ('"shop-guard"', '"shop-guard-abuse"', '"logins"'):
            assert name in code, f"{name} no longer in the example: update this test"
            code = code.replace(name, name[:-1] + f'-{self.run}"')
        if edit is not None:
            code = edit(code)
        self.app_id, self.source = f"shop-guard-{self.run}", f"logins-{self.run}"
        self.state = f"shop-guard-abuse-{self.run}"
        self.tmp = tmp
        self.script = tmp / "shop_guard.py"
        self.script.write_text(code)
        self.env = {k: v for k, v in os.environ.items()
                    if k != "KAFKA_BOOTSTRAP_SERVERS" and not k.startswith("GRUDGE_") and k != "PYTHONPATH"}
        self.env.update({"BROKER": bootstrap, "GRUDGE_SEED": secrets.token_hex(16)})
        self.bootstrap = bootstrap
        self.proc: subprocess.Popen | None = None
        self.log_path = tmp / "app.log"

    def create_source(self, partitions: int = 4) -> subprocess.CompletedProcess:
        return subprocess.run([cli(), "create-topic", self.source, "--partitions", str(partitions),
                               "--bootstrap-servers", self.bootstrap], env=self.env, cwd=self.tmp,
                              capture_output=True, text=True, timeout=60)

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, str(self.script), "worker", "-l", "info",
                                          "--web-host", "127.0.0.1", "--web-port", str(free_port())],
                                         env=self.env, cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT)

    def log(self) -> str:
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines()
                 if not ln.startswith(("+", "|"))]
        return "\n".join(lines)[-5000:]

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("app ignored SIGTERM:\n" + self.log())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def doc_app(kafka_bootstrap, tmp_path):
    made: list[DocApp] = []

    def make(edit=None) -> DocApp:
        app = DocApp(kafka_bootstrap, tmp_path, edit)
        made.append(app)
        return app

    yield make
    for app in made:
        app.kill()


def read_alerts(bootstrap: str, topic: str, want: int, timeout: float = 90) -> list[dict]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"doc-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            for m in c.consume(100, timeout=0.5):
                if not m.error():
                    got.append(json.loads(m.value()))
    finally:
        c.close()
    return got


def test_docs_faust_example_runs_on_the_apps_own_broker(doc_app, kafka_bootstrap):
    assert not kafka_bootstrap.endswith(":9092")  # the point: not the clients' default address
    app = doc_app()
    made = app.create_source(4)
    assert made.returncode == 0, made.stderr
    assert "created" in made.stdout
    again = app.create_source(8)  # another partition count: refused in one line
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr
    app.start()
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for value in [b"good"] * 5 + [b"bad"] * 20:  # the page's first hour
        p.produce(app.source, key=b"mallory", value=value)
    for i in range(200):
        p.produce(app.source, key=f"user-{i}".encode(), value=b"good")
    assert p.flush(30) == 0
    alerts = read_alerts(kafka_bootstrap, f"{app.state}-alerts", want=1)
    assert [(a["key"], a["state"]) for a in alerts] == [("mallory", "raised")], app.log()
    # The page's next line: the ban list of the state, by its name.
    shown = subprocess.run([cli(), "alerts", "--state", app.state, "--bootstrap-servers", kafka_bootstrap],
                           env=app.env, cwd=app.tmp, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[:2] == ["raised", "mallory"], shown.stdout
    assert app.stop() == 0, app.log()
    # Started again: the state restores from its snapshots, the Table from its changelog.
    app.start()
    for value in [b"bad"] * 20:
        p.produce(app.source, key=b"trudy", value=value)
    assert p.flush(30) == 0
    alerts = read_alerts(kafka_bootstrap, f"{app.state}-alerts", want=2)
    assert sorted((a["key"], a["state"]) for a in alerts) == [("mallory", "raised"), ("trudy", "raised")], app.log()
    assert app.stop() == 0, app.log()
    log = app.log()
    for bad in ("Traceback", "PartitionsMismatch", "Error in recovery"):
        assert bad not in log, log
    assert "restored" in log


def test_a_state_that_cannot_reach_its_cluster_stops_the_app_with_status_2(doc_app):
    port = free_port()
    app = doc_app(edit=lambda code: code.replace(
        "source=logins,", f'source=logins, bootstrap_servers="127.0.0.1:{port}",', 1))
    assert app.create_source(4).returncode == 0
    app.env["GRUDGE_BROKER_WAIT_S"] = "3"
    app.start()
    assert app.proc is not None
    try:
        rc = app.proc.wait(120)
    except subprocess.TimeoutExpired:
        raise AssertionError("the app did not stop:\n" + app.log()) from None
    log = app.log()
    assert rc == 2, log
    assert f"Kafka at 127.0.0.1:{port} did not answer" in log, log
    assert "Traceback" not in log, log


def test_client_commands_fail_in_one_line_on_an_unreachable_broker_or_a_missing_topic(kafka_bootstrap, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS" and not k.startswith("GRUDGE_")}
    nowhere = f"127.0.0.1:{free_port()}"
    for args in (["alerts", "abuse_scores"], ["alerts", "--state", "nobody"],
                 ["override", "--state", "nobody", "deny", "mallory"],
                 ["create-topic", "t", "--partitions", "1"]):
        t0 = time.monotonic()
        res = subprocess.run([cli(), *args, "--bootstrap-servers", nowhere], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and nowhere in res.stderr, (args, res.stderr)
        assert time.monotonic() - t0 < 20, args
    res = subprocess.run([cli(), "score", "abuse_scores", "mallory", "--url", f"http://{nowhere}"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and nowhere in res.stderr, res.stderr
    missing = subprocess.run([cli(), "alerts", "--state", f"nobody-{uuid.uuid4().hex[:6]}",
                              "--bootstrap-servers", kafka_bootstrap], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2, missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1 and "no topic" in missing.stderr, missing.stderr


def test_docs_own_loop_runs_as_written(kafka_bootstrap, tmp_path):
    """The page's confluent-kafka loop (``update_messages``), as the first hour runs it."""
    run = uuid.uuid4().hex[:6]
    code = example("## In a loop of your own")
    for name in ('"shop-guard-loop-abuse"', '"shop-guard-loop"', '"logins"'):
        assert name in code, f"{name} no longer in the example: update this test"
        code = code.replace(name, name[:-1] + f'-{run}"')
    source, state = f"logins-{run}", f"shop-guard-loop-abuse-{run}"
    script = tmp_path / "shop_guard_loop.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items()
           if k != "KAFKA_BOOTSTRAP_SERVERS" and not k.startswith("GRUDGE_") and k != "PYTHONPATH"}
    env.update({"BROKER": kafka_bootstrap, "GRUDGE_SEED": secrets.token_hex(16)})
    made = subprocess.run([cli(), "create-topic", source, "--partitions", "4", "--bootstrap-servers",
                           kafka_bootstrap], env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    log = tmp_path / "loop.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        p = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
        for value in [b"good"] * 5 + [b"bad"] * 20:
            p.produce(source, key=b"mallory", value=value)
        for i in range(300):
            p.produce(source, key=f"user-{i}".encode(), value=b"good")
        assert p.flush(30) == 0
        alerts = read_alerts(kafka_bootstrap, f"{state}-alerts", want=1)
        assert [(a["key"], a["state"]) for a in alerts] == [("mallory", "raised")], log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "Traceback" not in log.read_text()
    # Committed to the end: every record done with, snapshots covering them.
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"shop-guard-loop-{run}"})
    try:
        committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition(source, q) for q in range(4)],
                                                                  timeout=30)}
        ends = {q: c.get_watermark_offsets(TopicPartition(source, q), timeout=10)[1] for q in range(4)}
    finally:
        c.close()
    assert {q: o for q, o in committed.items() if ends[q]} == {q: e for q, e in ends.items() if e}
