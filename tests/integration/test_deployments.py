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


def test_topics_states_the_source_time_bounds_the_broker_enforces(harness) -> None:
    """A source topic created by `topics` refuses records stamped outside the operator's
    event-time bounds; `topics` says so, naming the error producers will see."""
    import time

    from confluent_kafka import KafkaError, Producer

    h = harness(partitions=2, runtime="batch")
    own = {k: f"{v}-tb" for k, v in h.overrides.items() if k.endswith("_topic")}
    r = _cli(h, "topics", own, "--partitions", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    line = next((x for x in r.stdout.splitlines() if "takes event times" in x), None)
    assert line is not None, r.stdout
    assert own["source_topic"] in line and "INVALID_TIMESTAMP" in line and " old" in line, line
    # The broker enforces it: a record ten days old is refused, one stamped now is taken.
    # (Each in a batch of its own: the broker refuses a whole batch holding one such record.)
    results: dict[str, object] = {}
    p = Producer({"bootstrap.servers": h.bootstrap, "partitioner": "murmur2_random"})
    now = int(time.time() * 1000)
    for name, ts in (("old", now - 10 * 86_400_000), ("now", now)):
        p.produce(own["source_topic"], key=b"k", value=b'{"outcome":"bad"}', timestamp=ts,
                  on_delivery=lambda err, _msg, name=name: results.__setitem__(name, err))
        assert p.flush(30) == 0
    assert results["now"] is None, (line, results)
    assert isinstance(results["old"], KafkaError) and results["old"].code() == KafkaError.INVALID_TIMESTAMP
    # Run again, the topic exists: no claim about bounds it did not set.
    r = _cli(h, "topics", own)
    assert r.returncode == 0 and "takes event times" not in r.stdout, r.stdout


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_sigterm_during_a_slow_checkpoint_says_so_at_once_and_while_it_lasts(harness, runtime) -> None:
    """Final snapshots slowed (as a broker quota would) log the stop at once and their
    progress every 10 s, instead of a silent minute."""
    import re
    import time

    h = harness(partitions=2, runtime=runtime)
    h.produce(h.make_events(20_000, seed=43, users=20_000))
    # 16 KiB chunks, 1.5 s apart: each partition's snapshot takes tens of seconds to write.
    w = h.start_worker(snapshot_chunk_bytes=16384, snapshot_chunk_delay_s=1.5, checkpoint_interval_s=3600,
                       snapshot_replay_budget_s=0)
    w.wait_ready()
    time.sleep(5)  # the events applied (the partitions changed since their restore)
    t0 = time.monotonic()
    w.proc.send_signal(__import__("signal").SIGTERM)
    deadline = t0 + 30
    while time.monotonic() < deadline and "still running after" not in w.log():
        time.sleep(0.5)
    log = w.log()
    assert "stopping: final snapshots for partitions [0, 1]" in log, log[-3000:]
    assert re.search(r"final snapshots still running after 1\d s", log), log[-3000:]
    w.kill9()  # no need to wait for the rest


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_another_deployment_under_a_running_app_id_is_refused_before_it_joins(harness, runtime) -> None:
    """Topics of its own but the app_id (consumer group) of a running deployment on another
    source: one line, exit 2, and the running workers are not rebalanced."""
    import time

    h = harness(partitions=2, runtime="batch")
    h.produce(h.make_events(2000, seed=47))
    w = h.start_worker()
    try:
        w.wait_ready()
        time.sleep(2)
        restores_before = w.log().count("restored ")
        own = {k: f"{v}-3" for k, v in h.overrides.items() if k.endswith("_topic")}
        r = _cli(h, "topics", own, "--partitions", "2")
        assert r.returncode == 0, r.stderr[-3000:]
        r = _cli(h, "worker", {**own, "app_id": h.topology.app_id}, "--runtime", runtime,
                 "--web-port", str(free_port()))
        lines = [line for line in r.stderr.splitlines() if line.strip() and "INFO" not in line]
        assert r.returncode == 2, r.stderr[-3000:]
        assert len(lines) == 1 and "is used by 1 worker(s) of source topic(s)" in lines[0], r.stderr[-3000:]
        assert h.topology.source_topic in lines[0] and "app_id of its own" in lines[0], lines[0]
        time.sleep(3)
        assert w.log().count("restored ") == restores_before, "the running worker was not rebalanced"
    finally:
        assert w.stop() == 0, w.log()[-3000:]


def test_restoring_another_source_topics_snapshot_names_its_deployment(harness) -> None:
    """Past the start-up check (which reads partition 0's manifest), a restore meeting a
    snapshot of another source topic names the deployment that wrote it, not a partition
    count to restore."""
    from grudge_stream.checkpoint import CheckpointStore
    from grudge_stream.exceptions import ForeignDeployment
    from grudge_stream.partitions import restore_partition
    from grudge_stream.topology import Settings, load_topology

    h = harness(partitions=2, runtime="batch")
    h.produce(h.make_events(2000, seed=53))
    w = h.start_worker()
    h.wait_caught_up()
    assert w.stop() == 0
    other = load_topology("abuse_scores", Settings({**h.overrides, "source_topic": h.overrides["source_topic"] + "-4"},
                                                   environ={}))
    store = CheckpointStore(h.bootstrap, other.snapshot_topic)
    try:
        with pytest.raises(ForeignDeployment) as exc:
            restore_partition(other, store, 1, 4, lambda: 0)
    finally:
        store.close()
    message = str(exc.value)
    assert f"app_id {h.topology.app_id!r}, source topic {h.topology.source_topic!r}" in message, message
    assert "partition count" not in message and "Give it topics of its own" in message


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_a_foreign_snapshot_met_at_restore_is_one_line_and_exit_2(harness, runtime) -> None:
    """Past the start-up check: partition 0 has no snapshot, partition 1 has one of another
    source topic. Both runtimes stop with one line naming that deployment, exit 2, and write
    no snapshot."""
    import time

    from grudge_stream.checkpoint import CheckpointStore

    h = harness(partitions=2, runtime="batch")
    h.produce(h.make_events(2000, seed=59), partition_of=lambda i, key: 1)
    w = h.start_worker()
    store = CheckpointStore(h.bootstrap, h.topology.snapshot_topic)
    try:
        deadline = time.monotonic() + 60
        while store.read_manifest(h.topology.operator_id, 1) is None:
            assert time.monotonic() < deadline, w.log()[-3000:]
            time.sleep(0.5)
        assert w.stop() == 0
        assert store.read_manifest(h.topology.operator_id, 0) is None
    finally:
        store.close()
    snapshots_before = h.end_offsets(h.topology.snapshot_topic)
    other = h.topology.source_topic + "-5"
    create_topics(h.bootstrap, {other: (2, {})})
    r = _cli(h, "worker", {"source_topic": other, "app_id": "another-group-" + other},
             "--runtime", runtime, "--web-port", str(free_port()))
    errors = [line for line in r.stderr.splitlines() if "ERROR" in line or "Traceback" in line]
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(errors) == 1 and "belong to another one" in errors[0], r.stderr[-3000:]
    assert f"source topic {h.topology.source_topic!r}" in errors[0] and "partition count" not in errors[0]
    assert h.end_offsets(h.topology.snapshot_topic) == snapshots_before, "no snapshot written"
