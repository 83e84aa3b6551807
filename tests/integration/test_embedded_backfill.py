"""Backfill for embedded state, on the real broker (docs/embedding.md, "Backfill").

The app of examples/faust_app runs first as it was before its grudge-stream state was
added (its Table agent counting logins, tests/integration/embedded_app_before_state.py),
over a topic that already holds history and goes on growing. The state is then added
the documented way: ``grudge-stream backfill`` (a first pass while the old app runs, a
second one with it stopped), then the example app, which has the state, starts, and more
traffic comes. Afterwards:

- every partition's snapshot is byte for byte that of an uninterrupted in-process replay
  of the whole topic, and the state's alerts (the backfill's, published on the state's
  own topics with ``--to-live``, and the app's) are the replay's, alert by alert;
- the Table agent counted every record exactly once: no record was handed to the app's
  agents again, and the group's offsets reached the end of the topic.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "faust_app" / "app.py"
BEFORE = Path(__file__).resolve().parent / "embedded_app_before_state.py"
ARGS = ["worker", "-l", "info", "--web-host", "127.0.0.1", "--web-port", "{port}"]


@pytest.fixture
def scenario(embedded):
    return embedded(EXAMPLE, ARGS, table="logins-per-user")


def run_backfill(scenario, *extra: str) -> subprocess.CompletedProcess:
    env = {**scenario.env, "EXAMPLE_DATADIR": str(scenario.tmp / "backfill-data")}
    return subprocess.run([sys.executable, "-m", "grudge_stream.cli", "backfill", str(EXAMPLE),
                           "--state", scenario.state.name, "--value-of", "delta_of", "--quiet", *extra],
                          env=env, cwd=str(scenario.tmp), capture_output=True, text=True, timeout=300)


def wait_committed(scenario, app, timeout: float = 120) -> None:
    """Until the group's offsets reach the end of the source topic."""
    deadline = time.monotonic() + timeout
    while True:
        ends = scenario.end_offsets(scenario.source)
        committed = scenario.committed()
        if all(committed.get(p) == ends[p] for p in ends):
            return
        assert time.monotonic() < deadline, f"not committed: {committed} of {ends}\n{app.log_text()}"
        time.sleep(0.5)


def test_backfill_a_state_added_to_a_running_app(scenario):
    events = scenario.events(30_000, seed=31, abusers=6, users=2000)
    scenario.produce(events[:12_000])
    before = scenario.start("before", BEFORE)  # the app without the state
    wait_committed(scenario, before)

    # While the app runs, a backfill is refused unless it is said to be a first pass.
    refused = run_backfill(scenario)
    assert refused.returncode == 2, refused.stderr
    assert "active member" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr

    feeder = scenario.produce_slowly(events[12_000:18_000], seconds=6)
    first = run_backfill(scenario, "--while-live", "--output", "state", "--to-live")
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert not report["complete"] and report["live_members"] >= 1 and not report["continued"], report
    assert "run it again" in first.stderr
    feeder.join(60)
    wait_committed(scenario, before)
    assert before.stop() == 0, before.log()[-3000:]

    second = run_backfill(scenario, "--output", "state", "--to-live")
    assert second.returncode == 0, second.stderr
    report2 = json.loads(second.stdout)
    assert report2["complete"] and report2["continued"], report2
    assert report2["end"] == {str(p): o for p, o in scenario.committed().items()}, (report2, scenario.committed())
    assert report["records"] + report2["records"] == 18_000, (report, report2)

    after = scenario.start("after")  # the example app: the same app with the state added
    scenario.produce(events[18_000:])
    scenario.wait_done()
    assert after.stop() == 0, after.log()[-3000:]
    res = scenario.check()
    print(f"embedded backfill: {report['records']} + {report2['records']} records backfilled in "
          f"{report['seconds']} + {report2['seconds']} s; {res['alerts']} alerts, "
          f"table counted {res['table_excess']} records twice")
    assert res["raised"] >= 3, res
    assert not res["divergent_state"], (f"snapshots differ from the replay on partitions {res['divergent_state']}; "
                                        f"their snapshots in order: {res['history']}")
    assert not res["lost"], f"alerts lost: {sorted(res['lost'])[:5]}"
    assert not res["extra"], f"alerts no replay emits: {sorted(res['extra'])[:5]}"
    assert not res["differing"], res["differing"][:5]
    # The app's other agent saw each record once: no loss, and no re-delivery.
    assert not res["dropped"], f"the Table agent lost records: {list(res['dropped'].items())[:5]}"
    assert res["table_excess"] == 0, f"the Table agent counted {res['table_excess']} records twice"
    assert res["committed"] == res["ends"], res
    log = after.log()
    assert "restored" in log and "were not applied to the state" not in log, after.log_text()
    assert scenario.view_raised() == res["ref_raised"]


def test_backfill_from_python_publishes_nothing_unless_asked(kafka_bootstrap, make_topic):
    """``state.backfill`` up to a group's offsets (a loop of one's own: its ``group.id``):
    the snapshots equal the per-event calls byte for byte and ``assign`` returns the group's
    offsets; nothing reaches a topic by default; ``output={"alerts": TOPIC}`` sends the
    alerts and the raised set there only; a second run continues up to the new offsets."""
    import uuid

    from confluent_kafka import Consumer, Producer, TopicPartition

    from grudge_stream.checkpoint import CheckpointStore
    from grudge_stream.hashkey import HashKey
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
    from grudge_stream.state import ScoreState
    from grudge_stream.topics import create_topics

    topic = make_topic(2)
    group = f"loop-{uuid.uuid4().hex[:8]}"
    key = HashKey.parse("00112233445566778899aabbccddeeff")

    def state(name):
        return ScoreState(name, source_topic=topic, bootstrap_servers=kafka_bootstrap, hash_key=key,
                          sketch=ScoreSketchConfig(levels=2, cells_per_level=500, decay=Exponential(0.01),
                                                   lo=0.0, hi=1.0, hasher="siphash"),
                          raise_at=0.5, clear_at=0.25)

    def value_of(k, v):
        return None if v == b"skip" else json.loads(v)["d"]

    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(600):
        k = b"eve" if i % 4 == 0 else f"user-{i % 23}".encode()
        v = b"skip" if i % 17 == 0 else json.dumps({"d": 0.06 if k == b"eve" else -0.001}).encode()
        producer.produce(topic, key=k, value=v, partition=i % 2, timestamp=1_000_000 + 10 * i)
    producer.flush(30)
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False})
    records: dict[int, list] = {0: [], 1: []}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        while sum(map(len, records.values())) < 600:
            for m in c.consume(500, timeout=1):
                if not m.error():
                    records[m.partition()].append(m)

        def commit(offsets):
            c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)

        commit({0: 200, 1: 300})
    except BaseException:
        c.close()
        raise

    def reference(name, upto):
        ops = {}
        for p in (0, 1):
            op = state(name).topology.make_operator(p)
            for m in records[p][:upto[p]]:
                d = value_of(m.key(), m.value())
                if d is not None:
                    op.apply_event(m.key(), d, offset=m.offset(), timestamp_ms=m.timestamp()[1])
            op.next_offset = upto[p]
            ops[p] = op
        return ops

    def snapshots(s):
        store = CheckpointStore(kafka_bootstrap, s.snapshot_topic)
        try:
            return {p: store.restore(s.operator_id, p, accept=lambda ref, blob: None).blob for p in (0, 1)}
        finally:
            store.close()

    def ends(t):
        return sum(c.get_watermark_offsets(TopicPartition(t, p), timeout=10, cached=False)[1] for p in (0, 1))

    try:
        quiet = state(f"{topic}-quiet")
        report = quiet.backfill(value_of, group=group)
        assert report.complete and not report.continued and report.end == {0: 200, 1: 300}, report
        assert report.records == 500 and report.outputs == {}, report
        ref = reference(quiet.name, {0: 200, 1: 300})
        for p, blob in snapshots(quiet).items():
            op = quiet.topology.make_operator(p)
            op.restore(blob)
            assert op.snapshot() == ref[p].snapshot(), p
        assert any(ref[p].latch for p in (0, 1))  # the history raised eve: there were alerts to publish
        assert all(ends(t) == 0 for t in quiet.outputs.values()), "a backfill published without being asked"
        live = state(quiet.name).start()
        assert live.assign([0, 1]) == {0: 200, 1: 300}  # a loop seeks there: where its group stands
        live.close(snapshot=False)

        # Alerts elsewhere when asked; a second run continues up to the group's new offsets.
        whatif = f"{topic}-whatif"
        create_topics(kafka_bootstrap, {whatif: (2, {}), f"{whatif}-state": (2, {})})
        asked = state(f"{topic}-asked")
        first = asked.backfill(value_of, group=group, output={"alerts": whatif})
        assert first.outputs.get("alerts", 0) > 0 and first.outputs.get("alert_state", 0) > 0, first
        commit({0: 300, 1: 300})
        second = asked.backfill(value_of, group=group, output={"alerts": whatif})
        assert second.continued and second.records == 100 and second.end == {0: 300, 1: 300}, second
        ref = reference(asked.name, {0: 300, 1: 300})
        for p, blob in snapshots(asked).items():
            op = asked.topology.make_operator(p)
            op.restore(blob)
            assert op.snapshot() == ref[p].snapshot(), p
        assert ends(whatif) == first.outputs["alerts"] + second.outputs.get("alerts", 0)
        assert all(ends(t) == 0 for t in asked.outputs.values()), "the state's own topics were written"
    finally:
        c.close()


def test_records_deleted_under_a_backfill_stop_it_in_one_line(kafka_bootstrap, make_topic):
    """Retention deletes the oldest records while they are to be read: a second pass whose
    snapshot stops below the retained history is refused before reading, and a reader whose
    position falls below the log's start stops with one line instead of jumping over the hole
    (or waiting for ever for offsets that are gone)."""
    import threading
    import uuid

    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from grudge_stream.backfill import record_applier
    from grudge_stream.exceptions import ConfigError
    from grudge_stream.hashkey import HashKey
    from grudge_stream.replay.ranges import Position
    from grudge_stream.replay.runner import replay
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
    from grudge_stream.state import ScoreState

    topic = make_topic(1)
    group = f"loop-{uuid.uuid4().hex[:8]}"
    state = ScoreState(f"{topic}-abuse", source_topic=topic, bootstrap_servers=kafka_bootstrap,
                       hash_key=HashKey.parse("00112233445566778899aabbccddeeff"),
                       sketch=ScoreSketchConfig(levels=2, cells_per_level=500, decay=Exponential(0.01),
                                                lo=0.0, hi=1.0, hasher="siphash"),
                       raise_at=0.5, clear_at=0.25)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(300):
        producer.produce(topic, key=f"user-{i % 7}".encode(), value=b"0.01", timestamp=1_000_000 + i)
    producer.flush(30)
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 100)], asynchronous=False)
        assert state.backfill(lambda k, v: float(v), group=group).end == {0: 100}
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.delete_records([TopicPartition(topic, 0, 200)])[TopicPartition(topic, 0, 200)].result(30)
        c.commit(offsets=[TopicPartition(topic, 0, 300)], asynchronous=False)
    finally:
        c.close()
    with pytest.raises(ConfigError, match=r"snapshots stop before the history .* \{0: \(100, 200\)\}"):
        state.backfill(lambda k, v: float(v), group=group)

    # The reader itself, positioned below the log's start (as when retention deletes under it),
    # on each ingest path: the error comes from the partition's own queue on the native one.
    for ingest in ("python", "native"):
        got: list = []

        def read() -> None:
            try:
                replay(state.topology, kafka_bootstrap, start=Position("earliest"), end=Position("now"),
                       from_snapshot=True, progress=False, consumer_config={"auto.offset.reset": "error"},
                       apply=record_applier(state, lambda k, v: float(v), {"records": 0, "applied": 0}),
                       ingest=ingest)
                got.append(None)
            except Exception as exc:  # noqa: BLE001 - what it raised is the test
                got.append(exc)

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(60)
        assert got, f"the reader waited for deleted records ({ingest})"
        assert isinstance(got[0], ConfigError) and "deleted (retention) before they were read" in str(got[0]), got
