"""`grudge-stream replay` against the real broker: it reproduces the live worker exactly."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from grudge_stream.replay.ranges import Position
from grudge_stream.replay.runner import JsonlSink, replay
from grudge_stream.runtime import native

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

# replay on each ingest path (the setting ingest, grudge_stream.runtime.native)
NATIVE = pytest.mark.skipif(native.unavailable() is not None, reason=f"native ingest: {native.unavailable()}")
INGEST = [pytest.param("python", id="python-ingest"), pytest.param("native", id="native-ingest", marks=NATIVE)]


def test_replay_reproduces_the_live_worker_snapshots_and_alert_ids(harness) -> None:
    h = harness(partitions=3)
    h.produce(h.make_events(15_000, seed=21))
    w = h.start_worker()
    h.wait_caught_up()
    assert w.stop() == 0
    live_alerts = h.alert_ids()
    assert live_alerts
    store = h.store()
    outs, snaps = {}, {}
    for ingest in ("python", "native") if native.unavailable() is None else ("python",):
        out = io.StringIO()
        report = replay(h.topology, h.bootstrap, start=Position("earliest"), end=Position("now"),
                        sink=JsonlSink(out), progress=False, ingest=ingest)
        assert report.records == 15_000 and report.ingest == ingest
        for p, op in report.operators.items():
            live = store.restore(h.topology.operator_id, p)
            assert live.blob == op.snapshot(), f"partition {p}: replay snapshot ({ingest}) differs from the live one"
        replayed = {json.loads(line)["value"]["alert_id"] for line in out.getvalue().splitlines()
                    if json.loads(line)["role"] == "alerts"}
        assert replayed == live_alerts
        outs[ingest] = out.getvalue()
        snaps[ingest] = {p: op.snapshot() for p, op in report.operators.items()}
    # Both ingest paths: the same outputs, line for line, and the same snapshot bytes.
    assert len(set(outs.values())) == 1 and all(s == snaps["python"] for s in snaps.values())


def test_live_worker_adopts_a_replay_written_snapshot(harness) -> None:
    h = harness(partitions=2)
    events = h.make_events(12_000, seed=22)
    part = lambda i, key: sum(key) % 2  # noqa: E731
    h.produce(events[:6000], partition_of=part)
    report = replay(h.topology, h.bootstrap, start=Position("earliest"), end=Position("now"), sink=None,
                    write_snapshots=True, progress=False)
    assert set(report.snapshots) == {0, 1}
    h.produce(events[6000:], partition_of=part)
    w = h.start_worker()
    h.wait_caught_up()
    assert w.stop() == 0
    assert "mode=snapshot" in w.log()
    ref = h.reference()
    state = h.final_state()
    for p in range(2):
        assert state[p] == ref[p]["sketch"]


@pytest.mark.parametrize("ingest", INGEST)
def test_from_and_to_by_timestamp_select_exactly_the_right_records(harness, ingest) -> None:
    h = harness(partitions=3)
    events = h.make_events(9000, seed=23)
    h.produce(events)
    recs = [r for rs in h.source_records().values() for r in rs]
    ts = sorted(r.timestamp_ms for r in recs)
    lo, hi = ts[2000], ts[7000]
    want: dict[int, list[int]] = {}
    for r in recs:
        if lo <= r.timestamp_ms < hi:
            want.setdefault(r.partition, []).append(r.offset)
    report = replay(h.topology, h.bootstrap, start=Position("time", lo), end=Position("time", hi),
                    sink=None, progress=False, ingest=ingest)
    assert report.ingest == ingest
    assert report.records == sum(len(v) for v in want.values())
    for p, offs in want.items():
        assert report.start[p] == min(offs) and report.end[p] == max(offs) + 1
    iso = replay(h.topology, h.bootstrap, start=Position("offset", 100), end=Position("now"), sink=None,
                 progress=False, ingest=ingest)
    assert iso.records == 9000 - 300


def _cli(h, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "grudge_stream.cli", "replay", "abuse_scores", "--bootstrap-servers",
           h.bootstrap, "--quiet"]
    for k, v in h.overrides.items():
        if k != "bootstrap_servers":
            cmd += ["--set", f"{k}={v}"]
    # Not from the checkout: `python -m` would import the uncompiled source tree.
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, cwd=h.tmp_path)


def test_bad_ranges_and_unknown_topics_fail_clearly(harness) -> None:
    h = harness(partitions=2)
    events = h.make_events(3000, seed=24)
    h.produce(events + [(b"user-1", b"{junk", events[-1][2])])
    r = _cli(h, "--from", "now", "--to", "earliest", "--output", "none")
    assert r.returncode == 2 and "inverted range" in r.stderr
    r = _cli(h, "--from", "yesterday-ish", "--output", "none")
    assert r.returncode == 2 and "bad position" in r.stderr
    r = _cli(h, "--set", "source_topic=no-such-topic-xyz", "--output", "none")
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = _cli(h, "--from", "100", "--write-snapshots", "--output", "none")
    assert r.returncode == 2 and "--write-snapshots" in r.stderr
    r = _cli(h, "--output", "stdout")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert {x["role"] for x in lines} >= {"alerts", "alert_state", "dead_letters"}
    assert all(x["role"] in ("alerts", "alert_state", "scores", "dead_letters") for x in lines)
    # Every alert is mirrored on the alert state topic: the raise itself, or a tombstone.
    alerts = [x for x in lines if x["role"] == "alerts"]
    states = [x for x in lines if x["role"] == "alert_state"]
    assert [a["value"]["alert_id"] for a in alerts if a["value"]["state"] == "raised"] == \
        [s["value"]["alert_id"] for s in states if s["value"] is not None]
    assert json.loads(r.stderr.strip().splitlines()[-1])["records"] == 3001


def _live_ends(h) -> dict[str, dict[int, int]]:
    return {topic: h.end_offsets(topic) for topic in h.topology.outputs.values()}


def test_a_what_if_backfill_leaves_the_live_topics_byte_identical(harness) -> None:
    from grudge_stream.topics import create_topics

    h = harness(partitions=2)
    h.produce(h.make_events(6000, seed=31))
    live = _live_ends(h)
    # Without a redirection, or with only the alerts moved, a what-if is refused before reading.
    r = _cli(h, "--output", "topology", "--set", "raise_at=0.05", "--set", "clear_at=0.01")
    assert r.returncode == 2 and "live deployment's topics" in r.stderr, r.stderr
    r = _cli(h, "--output", "topology", "--output-topic", "alerts=whatif-x-alerts")
    assert r.returncode == 2 and "scores -> " in r.stderr and "alert_state" not in r.stderr, r.stderr
    # Into topics that do not exist: one line, exit 2, and nothing is written or created.
    r = _cli(h, "--output", "topology", "--topic-prefix", "whatif-")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "missing topics" in lines[0], r.stderr
    assert _live_ends(h) == live
    from confluent_kafka.admin import AdminClient

    known = set(AdminClient({"bootstrap.servers": h.bootstrap}).list_topics(timeout=10).topics)
    assert not any(t.startswith("whatif-") for t in known), "a refused replay must create nothing"
    # With the what-if topics in place: the alerts land there, the live topics stay as they were.
    create_topics(h.bootstrap, {"whatif-" + t: (2, {}) for t in h.topology.outputs.values()})
    r = _cli(h, "--output", "topology", "--topic-prefix", "whatif-", "--set", "raise_at=0.05",
             "--set", "clear_at=0.01")
    assert r.returncode == 0, r.stderr
    assert _live_ends(h) == live
    assert sum(h.end_offsets("whatif-" + h.topology.outputs["alerts"]).values()) > 0
    assert sum(h.end_offsets("whatif-" + h.topology.outputs["alert_state"]).values()) > 0
