"""The deploy story against the real broker: what deploy/ promises, run here.

- Each runtime (faust, batch) runs ``python -m grudge_stream.cli worker abuse_scores`` as an
  unprivileged user (uid 65534, as a container or a systemd DynamicUser would) from a
  read-only working directory, with ``GRUDGE_STATE_DIR`` the only place it may write: it
  processes the events (its snapshots cover the topic), ``/ready`` and ``/live`` answer 200,
  SIGTERM stops it with status 0, nothing appears in the working directory, and Faust's data
  directory is under the state directory.
- Without a usable state directory the worker exits 2 with one line.
- ``/live`` turns 503 when a real worker's processing loop is wedged (its checkpoint blocks,
  tests/integration/wedge_worker.py) while ``/metrics`` and ``/ready`` still answer 200, and 200
  again once it moves on.

Switching users needs root and ``setpriv`` (util-linux); the tests skip with the reason
otherwise. When the interpreter lives where uid 65534 cannot read it (a pyenv Python under
/root, mode 0700), the worker keeps one capability, CAP_DAC_READ_SEARCH: it may read and
traverse root's files, never write them, so the read-only directory stays read-only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from grudge_devkafka import free_port

pytestmark = pytest.mark.slow

UID = GID = 65534  # nobody
HERE = Path(__file__).resolve().parent


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def _wait_status(worker, path: str, want: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        status, body = _get(worker.web_port, path)
        if status == want:
            return body
        assert worker.proc.poll() is None, f"worker exited ({worker.proc.returncode}): {worker.log()[-3000:]}"
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} answered {status} {body[:300]!r}, not {want}, after {timeout}s; "
                                 f"log: {worker.log()[-3000:]}")
        time.sleep(0.2)


def _start(h, cmd_prefix: list[str], runtime: str, env: dict, cwd: Path, tag: str,
           **extra: object):
    port = free_port()
    cmd = cmd_prefix + ["worker", "abuse_scores", "--runtime", runtime, "--bootstrap-servers", h.bootstrap,
                        "--web-port", str(port), "--loglevel", "info", "--no-create-topics"]
    for k, v in {**h.overrides, **{k: str(v) for k, v in extra.items()}}.items():
        if k != "bootstrap_servers":
            cmd += ["--set", f"{k}={v}"]
    log_path = h.tmp_path / f"{tag}-{runtime}.log"
    with open(log_path, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(cwd))
    return h.track(proc, log_path, port)


@pytest.mark.parametrize("runtime", ["faust", "batch"])
def test_worker_runs_unprivileged_from_a_read_only_cwd(harness, sandbox, runtime: str) -> None:
    prefix, env, cwd, state = sandbox
    h = harness(partitions=2)
    h.produce(h.make_events(3000, seed=11))
    env = {**env, "GRUDGE_STATE_DIR": str(state)}
    w = _start(h, prefix + [sys.executable, "-m", "grudge_stream.cli"], runtime, env, cwd, "unprivileged")

    ready = json.loads(_wait_status(w, "/ready", 200, timeout=90))
    assert ready["ready"] is True and sorted(ready["restored"]) == [0, 1]
    h.wait_caught_up(timeout=120)  # every partition's snapshot covers the whole topic
    live = json.loads(_wait_status(w, "/live", 200, timeout=10))
    assert live["live"] is True
    assert _get(w.web_port, "/metrics")[0] == 200
    assert w.stop(timeout=90) == 0, w.log()[-3000:]

    assert list(cwd.iterdir()) == [], "nothing is written to the working directory"
    assert not any(p.name.endswith("-data") for p in cwd.parent.iterdir())
    assert "PermissionError" not in w.log() and "Traceback" not in w.log(), w.log()[-3000:]
    written = sorted(p.relative_to(state) for p in state.rglob("*"))
    assert all(p.stat().st_uid == UID for p in state.rglob("*"))
    if runtime == "faust":
        app_dir = state / h.topology.app_id
        assert (app_dir / "v1" / "tables").is_dir(), f"no Faust data directory in the state dir: {written}"
    else:
        assert written == [], f"the batch runtime keeps no local files: {written}"


def test_faust_worker_without_a_home_takes_a_private_temporary_directory(harness, sandbox) -> None:
    """uid 65534 with no writable home and no GRUDGE_STATE_DIR: the Faust runtime's local files
    are rebuilt from Kafka anyway, so it runs from a private temporary directory, said in one
    INFO line (it refused to start before)."""
    prefix, env, cwd, _ = sandbox
    if Path("/var/lib/grudge-stream").exists():
        pytest.skip("/var/lib/grudge-stream exists here: the default could be usable")
    h = harness(partitions=2)
    h.produce(h.make_events(1000, seed=13))
    w = _start(h, prefix + [sys.executable, "-m", "grudge_stream.cli"], "faust", env, cwd, "nohome")
    ready = json.loads(_wait_status(w, "/ready", 200, timeout=90))
    assert sorted(ready["restored"]) == [0, 1]
    assert w.stop(timeout=90) == 0, w.log()[-3000:]
    assert "private temporary directory" in w.log() and "Traceback" not in w.log(), w.log()[-3000:]
    assert list(cwd.iterdir()) == [], "nothing is written to the working directory"


def test_worker_with_an_unusable_state_dir_exits_2_with_one_line(sandbox) -> None:
    prefix, env, cwd, _ = sandbox
    cmd = prefix + [sys.executable, "-m", "grudge_stream.cli", "worker", "abuse_scores", "--no-create-topics",
                    "--bootstrap-servers", "127.0.0.1:1", "--set", "seed=" + "cd" * 16,
                    "--set", "state_dir=/proc/grudge-stream"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=str(cwd))
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "GRUDGE_STATE_DIR" in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("runtime", ["faust", "batch"])
def test_live_fails_while_the_loop_is_wedged(harness, tmp_path: Path, runtime: str) -> None:
    """Run as root from a writable, empty working directory: still nothing written there."""
    h = harness(partitions=2)
    h.produce(h.make_events(2000, seed=12))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    flag = tmp_path / "wedge"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    w = _start(h, [sys.executable, str(HERE / "wedge_worker.py"), str(flag)], runtime, env, cwd, "wedge",
               state_dir=tmp_path / "state", liveness_timeout_s=3)
    _wait_status(w, "/ready", 200, timeout=90)
    h.wait_caught_up(timeout=120)
    _wait_status(w, "/live", 200, timeout=10)

    flag.touch()  # the next checkpoint round blocks; traffic makes it due and stops the loop
    traffic = h.produce_in_background(h.make_events(4000, seed=13), seconds=12)
    body = json.loads(_wait_status(w, "/live", 503, timeout=30))
    assert body["live"] is False and body["last_progress_s"] > 3
    assert _get(w.web_port, "/metrics")[0] == 200, "/metrics answers while wedged: no liveness signal"
    assert _get(w.web_port, "/ready")[0] == 200, "/ready answers while wedged: no liveness signal"

    flag.unlink()
    _wait_status(w, "/live", 200, timeout=30)
    traffic.join(60)
    h.wait_caught_up(timeout=120)
    assert w.stop(timeout=90) == 0, w.log()[-3000:]
    assert list(cwd.iterdir()) == [], "nothing is written to the working directory, even a writable one"
