"""Deployments that own their names, on the real broker: a second deployment that changes only
``source_topic`` is refused in one line (exit 2) by ``topics`` and by ``worker`` in both
runtimes, before it touches the first deployment's state."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grudge_devkafka import free_port
from grudge_stream.topics import create_topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _cli(h, command: str, overrides: dict, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "grudge_stream.cli", command, "abuse_scores", "--bootstrap-servers", h.bootstrap,
           *extra]
    for k, v in {**h.overrides, "state_dir": str(h.tmp_path / "state"), **overrides}.items():
        if k != "bootstrap_servers":
            cmd += ["--set", f"{k}={v}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=h.tmp_path)


def test_a_second_deployment_on_another_source_topic_is_refused_in_one_line(harness) -> None:
    h = harness(partitions=2, runtime="batch")
    h.produce(h.make_events(3000, seed=41))
    w = h.start_worker()
    h.wait_caught_up()
    assert w.stop() == 0
    snapshots_before = h.end_offsets(h.topology.snapshot_topic)
    other = h.topology.source_topic + "-2"
    create_topics(h.bootstrap, {other: (2, {})})
    for command, extra in (("topics", ()), ("worker", ("--runtime", "batch", "--web-port", str(free_port()))),
                           ("worker", ("--runtime", "faust", "--web-port", str(free_port())))):
        r = _cli(h, command, {"source_topic": other}, *extra)
        lines = [line for line in r.stderr.splitlines() if line.strip() and "INFO" not in line]
        assert r.returncode == 2, r.stderr[-3000:]
        assert len(lines) == 1 and "belong to another one" in lines[0], r.stderr[-3000:]
        assert h.topology.source_topic in lines[0] and "snapshot_topic" in lines[0], lines[0]
        assert "Traceback" not in r.stderr
    assert h.end_offsets(h.topology.snapshot_topic) == snapshots_before, "the first deployment's state is untouched"
    # With topics of its own, the second deployment starts.
    own = {k: f"{v}-2" for k, v in h.overrides.items() if k.endswith("_topic")}
    r = _cli(h, "topics", own)
    assert r.returncode == 0, r.stderr[-3000:]
