"""/live (grudge_stream.liveness) and the state directory (grudge_stream.statedir), no broker.

The end-to-end checks — both runtimes as an unprivileged user from a read-only working
directory, and /live turning 503 when a real worker's loop is wedged — are in
tests/integration/test_deploy.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from grudge_stream import statedir
from grudge_stream.exceptions import ConfigError
from grudge_stream.liveness import Liveness
from grudge_stream.topology import Settings


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# -- liveness ---------------------------------------------------------------------------------------


def test_live_until_no_progress_for_the_timeout() -> None:
    clock = FakeClock()
    live = Liveness(10.0, clock=clock)
    assert live.alive and live.status()[0] == 200
    clock.t += 9.5
    assert live.alive
    live.beat()
    clock.t += 10.0
    assert live.alive, "exactly the timeout is still alive"
    clock.t += 0.5
    status, body = live.status()
    assert status == 503 and body == {"live": False, "last_progress_s": 10.5, "timeout_s": 10.0}
    live.beat()
    assert live.status()[0] == 200, "progress again: alive again"


def test_a_waiting_flush_counts_as_progress() -> None:
    clock = FakeClock()
    live = Liveness(5.0, clock=clock)
    stop = {"now": False}
    should_stop = live.beating(lambda: stop["now"])
    clock.t += 60
    assert not live.alive
    assert should_stop() is False and live.alive  # the flush loop asks about once a second
    stop["now"] = True
    assert should_stop() is True


def test_liveness_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        Liveness(0)
    assert Liveness.from_settings(Settings({"liveness_timeout_s": "7.5"}, environ={})).timeout_s == 7.5


def test_beats_from_another_thread_are_seen() -> None:
    live = Liveness(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            live.beat()
            time.sleep(0.01)

    th = threading.Thread(target=loop)
    th.start()
    try:
        time.sleep(0.4)
        assert live.alive
    finally:
        stop.set()
        th.join()
    time.sleep(0.3)
    assert not live.alive


def _get(url: str) -> tuple[int, dict | bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read()
            return r.status, json.loads(body) if r.headers.get_content_type() == "application/json" else body
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_batch_worker_http_serves_live_from_the_loop_heartbeat() -> None:
    """The batch runtime's HTTP thread answers whatever the main loop does: /metrics stays 200
    while the loop is wedged, /live turns 503 (and back to 200 once the loop beats again)."""
    from grudge_devkafka import free_port
    from grudge_stream.metrics import Metrics
    from grudge_stream.runtime.batch import BatchWorker
    from grudge_stream.runtime.checkpointer import SnapshotBudget
    from grudge_stream.runtime.core import WorkerCore
    from grudge_stream.runtime.slots import PartitionSlots
    from grudge_stream.sections import sections
    from grudge_stream.serving import PartitionerCheck

    clock = FakeClock()
    worker = object.__new__(BatchWorker)  # no Kafka clients: only what the HTTP handler reads
    core = worker.core = object.__new__(WorkerCore)
    port = free_port()
    worker.settings = Settings({"web_port": str(port)}, environ={})
    core.sections = sections(worker.settings)  # what the core reads once from them
    core.liveness = Liveness(60.0, clock=clock)
    core.metrics = Metrics()
    core.in_group = False
    # A restored partition: what /ready reports of its restore replay (the core's slots and
    # snapshot budget parts).
    core.partition_slots = PartitionSlots(None, core.metrics, partition_count=lambda: 1,
                                          low_watermark=lambda p: 0)
    core.budget = SnapshotBudget(10.0, 3600.0, core.partition_slots)
    core.partition_slots.assigned = {0}
    core.partition_slots.slots = {0: SimpleNamespace(unsnapshotted=5000, last_snapshot_wall=0.0)}
    core.partitioner_check = PartitionerCheck("murmur2")

    class Reachable:  # the broker probe: the cluster answers
        reachable, error = True, None

        def ok(self) -> bool:
            return True

    core.broker = Reachable()
    worker.native = None  # today's ingest path
    worker._http = None
    worker._start_http()
    try:
        base = f"http://127.0.0.1:{port}"
        assert _get(base + "/live") == (200, {"live": True, "last_progress_s": 0.0, "timeout_s": 60.0})
        clock.t += 61  # the main loop is stuck: nothing beats
        status, body = _get(base + "/live")
        assert status == 503 and body["live"] is False and body["last_progress_s"] == 61.0
        assert _get(base + "/metrics")[0] == 200
        status, ready = _get(base + "/ready")
        assert status == 200, "readiness cannot tell: that is what /live is for"
        assert ready["replay"]["0"]["replay_records"] == 5000 and ready["restore_budget_exceeded"] == []
        core.liveness.beat()
        assert _get(base + "/live")[0] == 200
        core.broker.ok = lambda: False  # the cluster stopped answering
        core.broker.reachable, core.broker.error = False, "all brokers down"
        status, body = _get(base + "/ready")
        assert status == 503 and body["broker"] is False and body["broker_error"] == "all brokers down"
    finally:
        worker._http.shutdown()
        worker._http.server_close()


# -- state directory -------------------------------------------------------------------------------


def test_state_dir_setting_wins_and_is_created(tmp_path: Path) -> None:
    settings = Settings({"state_dir": str(tmp_path / "a" / "b")}, environ={})
    path = statedir.app_state_dir(settings, "grudge-abuse-scores-events")
    assert path == tmp_path / "a" / "b" / "grudge-abuse-scores-events" and path.is_dir()
    env = Settings({}, environ={"GRUDGE_STATE_DIR": str(tmp_path / "env")})
    assert statedir.state_dir(env) == tmp_path / "env"


def test_default_state_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert statedir.default_state_dir({"XDG_STATE_HOME": str(tmp_path / "xdg"), "HOME": str(home)}) \
        == tmp_path / "xdg" / "grudge-stream"
    # a relative XDG_STATE_HOME is ignored (XDG base directory spec)
    assert statedir.default_state_dir({"XDG_STATE_HOME": "rel", "HOME": str(home)}) \
        == home / ".local" / "state" / "grudge-stream"
    system = tmp_path / "var-lib" / "grudge-stream"
    system.parent.mkdir()
    monkeypatch.setattr(statedir, "SYSTEM_STATE_DIR", system)
    assert statedir.default_state_dir({"HOME": str(tmp_path / "missing")}) == system
    # nothing writable (a home that does not exist, a system directory under a file): one clear line
    monkeypatch.setattr(statedir, "SYSTEM_STATE_DIR", Path(os.devnull) / "grudge-stream")
    with pytest.raises(ConfigError, match="GRUDGE_STATE_DIR") as err:
        statedir.default_state_dir({"HOME": "/nonexistent"})
    assert "\n" not in str(err.value)


def test_never_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    got = statedir.default_state_dir({"HOME": str(home)})
    assert Path.cwd() not in (got, got.parent)
    assert list(tmp_path.iterdir()) == [home]


def test_an_unusable_state_dir_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        statedir.app_state_dir(Settings({"state_dir": f"{os.devnull}/state"}, environ={}), "app")
    msg = str(err.value)
    assert "\n" not in msg and "GRUDGE_STATE_DIR" in msg and f"{os.devnull}/state" in msg


def test_faust_worker_with_an_unusable_state_dir_exits_2_with_one_line(tmp_path: Path) -> None:
    """The CLI maps the ConfigError to one line on stderr and exit status 2, before any broker
    is contacted (--no-create-topics; the bootstrap address answers nothing)."""
    cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", "abuse_scores", "--no-create-topics",
           "--bootstrap-servers", "127.0.0.1:1", "--set", "seed=" + "ab" * 16,
           "--set", f"state_dir={os.devnull}/state"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "state directory" in lines[0] and "GRUDGE_STATE_DIR" in lines[0], res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_a_second_worker_on_a_taken_web_port_exits_2_with_one_line(tmp_path: Path, runtime: str) -> None:
    """Two workers on one machine without --web-port: the second says so in one line, exit 2,
    before any broker is contacted (the bootstrap address answers nothing)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", "abuse_scores", "--no-create-topics",
               "--runtime", runtime, "--bootstrap-servers", "127.0.0.1:1", "--web-port", str(port),
               "--set", "seed=" + "ab" * 16, "--set", f"state_dir={tmp_path / 'state'}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"web port 127.0.0.1:{port} is not free" in lines[0], res.stderr[-3000:]
    assert "--web-port" in lines[0]
