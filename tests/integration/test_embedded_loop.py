"""grudge-stream state in a confluent-kafka loop of one's own (examples/own_loop.py), on the real broker.

The loop is killed with SIGKILL mid-stream and restarted, and separately run as two
members of one group that rebalance; afterwards its alerts equal those of an
uninterrupted in-process replay alert by alert (0 lost, 0 divergent), every
partition's final snapshot is byte-identical to the replay's state, and the group's
offsets are committed to the end of the topic.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_loop.py"


@pytest.fixture
def scenario(embedded):
    return embedded(EXAMPLE, [])


def assert_exact(res: dict) -> None:
    assert res["raised"] >= 3, res  # the planted abusers were raised: the test means something
    assert not res["lost"], f"alerts lost: {sorted(res['lost'])[:5]}"
    assert not res["extra"], f"alerts no replay emits: {sorted(res['extra'])[:5]}"
    assert not res["differing"], res["differing"][:5]
    assert not res["divergent_state"], (f"snapshots differ from the replay on partitions {res['divergent_state']}; "
                                        f"their snapshots in order: {res['history']}")
    assert res["committed"] == res["ends"], res


def test_own_loop_kill9_and_restart(scenario):
    events = scenario.events(30_000, seed=31, abusers=6, users=2000)
    scenario.produce(events[:10_000])
    loop = scenario.start("first")
    feeder = scenario.produce_slowly(events[10_000:20_000], seconds=6)
    scenario.wait_snapshot_progress()
    time.sleep(1.0)
    loop.kill9()
    feeder.join(60)
    scenario.produce(events[20_000:])
    loop = scenario.start("second")
    scenario.wait_done()
    assert loop.stop() == 0, loop.log()[-3000:]
    res = scenario.check()
    print(f"own loop kill -9: {res['alerts']} alerts, 0 lost, 0 divergent, "
          f"{len(res['ref_raised'])} keys raised at the end")
    assert_exact(res)
    # The ban list a subscriber reads (the state's <alerts>-state topic) is the restarted
    # state's raised set: that of the uninterrupted replay.
    assert scenario.view_raised() == res["ref_raised"], (sorted(scenario.view_raised()), sorted(res["ref_raised"]))


def test_own_loop_two_members_rebalance(scenario):
    events = scenario.events(30_000, seed=37, abusers=6, users=2000)
    scenario.produce(events[:10_000])
    a = scenario.start("a")
    scenario.wait_snapshot_progress()
    feeder = scenario.produce_slowly(events[10_000:20_000], seconds=8)
    b = scenario.start("b")
    time.sleep(8)
    assert a.stop() == 0, a.log()[-3000:]
    feeder.join(60)
    scenario.produce(events[20_000:])
    scenario.wait_done()
    assert b.stop() == 0, b.log()[-3000:]
    res = scenario.check()
    assert_exact(res)
    assert "restored" in a.log() and "restored" in b.log()


def test_state_api_on_the_broker(kafka_bootstrap, make_topic):
    """start / assign / update / checkpoint / close by hand; a restart restores exactly; a
    source whose partition count changed since the snapshot is refused, naming it."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    from grudge_stream.exceptions import PartitionCountChanged
    from grudge_stream.hashkey import HashKey
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
    from grudge_stream.state import ScoreState

    topic = make_topic(2)
    name = f"{topic}-abuse"
    key = HashKey.parse("00112233445566778899aabbccddeeff")

    def state():
        return ScoreState(name, source_topic=topic, bootstrap_servers=kafka_bootstrap, hash_key=key,
                          sketch=ScoreSketchConfig(levels=2, cells_per_level=500, decay=Exponential(0.01),
                                                   lo=0.0, hi=1.0, hasher="siphash"),
                          raise_at=0.5, clear_at=0.25)

    s = state().start()
    assert s.assign([0, 1]) == {0: None, 1: None}
    for i in range(20):
        s.update(b"eve", 0.05, partition=1, offset=i, timestamp_ms=1_000_000 + i)
    assert s.checkpoint() == {1: 20}  # partition 0 never changed: nothing to write, nothing to commit
    before = s.operator(1).snapshot()
    s.close(snapshot=False)

    again = state().start()
    assert again.assign([1]) == {1: 20}
    assert again.operator(1).snapshot() == before
    assert again.update(b"eve", 0.05, partition=1, offset=19, timestamp_ms=1_000_019) is None  # covered
    again.close(snapshot=False)

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) != 3:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    moved = state().start()
    with pytest.raises(PartitionCountChanged, match="2 partitions; it now has 3"):
        moved.assign([1])
    assert moved.partitions() == []
    moved.close(snapshot=False)


def test_overrides_reach_embedded_state(kafka_bootstrap, make_topic):
    """A deny entry on ``<alerts>-overrides`` raises the key at its next event; an allow entry
    keeps a key down whatever its score (the topologies' rules, docs/serving.md)."""
    import json

    from confluent_kafka import Producer

    from grudge_stream.hashkey import HashKey
    from grudge_stream.overrides import encode_override
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
    from grudge_stream.state import ScoreState

    topic = make_topic(1)
    state = ScoreState(f"{topic}-abuse", source_topic=topic, bootstrap_servers=kafka_bootstrap, overrides=True,
                       hash_key=HashKey.parse("00112233445566778899aabbccddeeff"),
                       sketch=ScoreSketchConfig(levels=2, cells_per_level=500, decay=Exponential(0.01),
                                                lo=0.0, hi=1.0, hasher="siphash"),
                       raise_at=0.5, clear_at=0.25)
    overrides_topic = state.topology.overrides_topic
    assert overrides_topic == f"{topic}-abuse-alerts-overrides"
    state.start()
    try:
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        p.produce(overrides_topic, key=b"mallory", value=encode_override("deny", by="test"))
        p.produce(overrides_topic, key=b"alice", value=encode_override("allow", by="test"))
        p.flush(10)
        state.assign([0])
        deadline = time.monotonic() + 20
        while state.operator(0).overrides is None or len(state.operator(0).overrides) < 2:
            assert time.monotonic() < deadline, "overrides not followed"
            time.sleep(0.1)
        now = int(time.time() * 1000)
        state.update(b"mallory", 0.001, partition=0, offset=0, timestamp_ms=now)
        for i in range(1, 30):
            state.update(b"alice", 0.2, partition=0, offset=i, timestamp_ms=now + i)
        assert state.raised(b"mallory", 0) and not state.raised(b"alice", 0)
        assert state.score(b"alice", 0) >= 0.5
        state.checkpoint()
        alerts = [json.loads(m) for m in _values(kafka_bootstrap, state.outputs["alerts"])]
        assert [(a["key"], a["state"], a.get("override")) for a in alerts] == [("mallory", "raised", "deny")]
    finally:
        state.close(snapshot=False)


def _values(bootstrap: str, topic: str) -> list[bytes]:
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    try:
        end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(out) < end and time.monotonic() < deadline:
            out.extend(m.value() for m in c.consume(100, timeout=0.5) if not m.error())
        return out
    finally:
        c.close()


def test_ban_list_of_an_embedded_state_by_its_name(kafka_bootstrap, make_topic):
    """``grudge-stream alerts --state`` and ``AlertView.for_state`` show the state's raised set;
    ``grudge-stream override --state NAME deny KEY`` raises the key in the view at once and in
    the state (``overrides=True``) at its next event, with an alert."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from grudge_stream.client import AlertView
    from grudge_stream.hashkey import HashKey
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
    from grudge_stream.state import ScoreState

    topic = make_topic(1)
    name = f"{topic}-abuse"
    cli = [str(Path(sys.executable).with_name("grudge-stream"))]
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS" and not k.startswith("GRUDGE_")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *args, "--bootstrap-servers", kafka_bootstrap], env=env,
                              capture_output=True, text=True, timeout=60)

    state = ScoreState(name, source_topic=topic, bootstrap_servers=kafka_bootstrap, overrides=True,
                       hash_key=HashKey.parse("00112233445566778899aabbccddeeff"),
                       sketch=ScoreSketchConfig(levels=2, cells_per_level=500, decay=Exponential(0.01),
                                                lo=0.0, hi=1.0, hasher="siphash"),
                       raise_at=0.5, clear_at=0.25).start()
    try:
        state.assign([0])
        now = int(time.time() * 1000)
        for i in range(20):
            state.update(b"eve", 0.05, partition=0, offset=i, timestamp_ms=now + i)
        state.checkpoint()
        assert state.raised(b"eve", 0)
        shown = run("alerts", "--state", name)
        assert shown.returncode == 0, shown.stderr
        assert [ln.split()[:2] for ln in shown.stdout.splitlines()] == [["raised", "eve"]], shown.stdout

        denied = run("override", "--state", name, "deny", "mallory", "--reason", "test")
        assert denied.returncode == 0, denied.stderr
        assert f"{name}-alerts-overrides" in denied.stdout
        with AlertView.for_state(state) as view:
            assert set(view.raised()) == {b"eve", b"mallory"}  # the view applies the entry at once
            assert view.get("mallory").reason == "override:deny"
        deadline = time.monotonic() + 20
        while state.operator(0).overrides is None or not len(state.operator(0).overrides):
            assert time.monotonic() < deadline, "the state did not follow the override"
            time.sleep(0.1)
        # An entry is in force from when it was written, on the event-time clock.
        state.update(b"mallory", 0.0, partition=0, offset=20, timestamp_ms=int(time.time() * 1000))
        assert state.raised(b"mallory", 0)
        state.checkpoint()
        alerts = [json.loads(v) for v in _values(kafka_bootstrap, state.outputs["alerts"])]
        assert [(a["key"], a["state"], a.get("override")) for a in alerts] == [
            ("eve", "raised", None), ("mallory", "raised", "deny")]
        # By name, from anywhere: the same raised set as the state's.
        with AlertView.for_state(name, bootstrap_servers=kafka_bootstrap) as view:
            assert set(view.raised()) == set(state.operator(0).latch.keys()) == {b"eve", b"mallory"}
        assert run("override", "--state", name, "clear", "mallory").returncode == 0
    finally:
        state.close(snapshot=False)
