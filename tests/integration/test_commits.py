"""Commits apart from snapshots (both runtimes, default snapshot budget), on the real broker.

Offsets are committed every ``commit_interval_s`` while no periodic snapshot is written
(the replay budget is far from spent); a worker killed with kill -9 restores the last
snapshot — none here — replays up to the committed offset with its outputs dropped, and
goes on: the state is byte-identical to an uninterrupted run and no alert is published
twice.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer, TopicPartition

from grudge_devkafka import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BUDGET = {"snapshot_replay_budget_s": "10", "snapshot_max_age_s": "3600", "commit_interval_s": "0.2"}


def committed(h) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": h.bootstrap, "group.id": h.topology.app_id, "enable.auto.commit": False})
    try:
        tps = c.committed([TopicPartition(h.topology.source_topic, p) for p in range(h.partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def wait_committed(h, timeout: float = 90.0) -> None:
    ends = h.end_offsets()
    deadline = time.monotonic() + timeout
    while True:
        got = committed(h)
        if all(got[p] >= ends[p] for p in ends if ends[p]):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"offsets not committed: {got} / {ends}\n" + "\n".join(w.log()[-3000:] for w in h.workers))
        time.sleep(0.2)


def metric(worker, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name + "{"))


@pytest.mark.parametrize("runtime,exactly_once", [("batch", "false"), ("batch", "true"), ("faust", "false")])
def test_offsets_commit_without_snapshots_and_a_restore_replays_silently(harness, runtime: str,
                                                                         exactly_once: str) -> None:
    h = harness(partitions=3, runtime=runtime, exactly_once=exactly_once, **BUDGET)
    events = h.make_events(40_000, seed=21)
    h.produce(events[:25_000])
    port = free_port()
    worker = h.start_worker(port, group_instance_id="commits-test")
    wait_committed(h)
    # Every offset is committed, and no periodic snapshot was written: commits do not wait
    # for snapshots any more.
    assert sum(h.end_offsets(h.topology.snapshot_topic).values()) == 0
    worker.kill9()
    worker = h.start_worker(port, group_instance_id="commits-test")
    h.produce(events[25_000:])
    wait_committed(h)
    # The restart replayed the partitions from the start (no snapshot), silently up to the
    # committed offsets.
    assert metric(worker, "grudge_replayed_silently_total") >= 25_000
    assert metric(worker, "grudge_outputs_suppressed_total") > 0
    assert worker.stop() == 0  # writes the final snapshots
    ref = h.reference()
    state = h.final_state()
    for p in range(h.partitions):
        assert state[p] == ref[p]["sketch"], f"partition {p} differs from an uninterrupted run"
    seen = [json.loads(m.value())["alert_id"]
            for m in h.read_all(h.topology.outputs["alerts"], read_committed=exactly_once == "true")]
    expected = set().union(*(r["alerts"] for r in ref.values()))
    assert expected, "the traffic should raise alerts"
    assert len(seen) == len(set(seen)), "an alert was published twice"
    assert set(seen) == expected


def set_topic_config(h, topic: str, name: str, value: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": h.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def ready(worker) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/ready", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_snapshot_topic_that_refuses_writes_stops_neither_processing_nor_commits(harness) -> None:
    # A tiny budget (1 ms of work: about a thousand records) so that it is spent at once.
    h = harness(partitions=2, runtime="batch", snapshot_replay_budget_s="0.001", commit_interval_s="0.2",
                checkpoint_interval_s="0.5", snapshot_max_age_s="3600")
    snapshots = h.topology.snapshot_topic
    events = h.make_events(60_000, seed=23)
    h.produce(events[:20_000])
    worker = h.start_worker()
    h.wait_caught_up()  # snapshots land while the topic takes them
    # The snapshot topic now refuses every chunk (larger than its max.message.bytes).
    set_topic_config(h, snapshots, "max.message.bytes", "1024")
    snap_end = sum(h.end_offsets(snapshots).values())
    h.produce(events[20_000:])
    wait_committed(h)  # processing and commits go on
    deadline = time.monotonic() + 30
    while True:
        status, body = ready(worker)
        if body.get("restore_budget_exceeded") or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert status == 200 and body["restore_budget_exceeded"], body
    deadline = time.monotonic() + 10  # the gauges are recorded once a second
    while metric(worker, "grudge_restore_budget_exceeded") < 1:
        assert time.monotonic() < deadline, "grudge_restore_budget_exceeded never said so"
        time.sleep(0.2)
    assert sum(h.end_offsets(snapshots).values()) == snap_end, "no snapshot record should have landed"
    # The topic takes writes again: the next round's snapshots land and cover everything.
    set_topic_config(h, snapshots, "max.message.bytes", str(8 * 1024 * 1024))
    h.wait_caught_up()
    deadline = time.monotonic() + 30
    while ready(worker)[1]["restore_budget_exceeded"] and time.monotonic() < deadline:
        time.sleep(0.3)
    assert ready(worker)[1]["restore_budget_exceeded"] == []
    assert worker.stop() == 0
    ref = h.reference()
    state = h.final_state()
    for p in range(h.partitions):
        assert state[p] == ref[p]["sketch"], f"partition {p} differs from an uninterrupted run"
    expected = set().union(*(r["alerts"] for r in ref.values()))
    assert expected and expected <= h.alert_ids()
