"""Upgrades keep state, on the real broker.

1. The 0.2.0 fixture (tests/data/upgrade-0.2.0: every record 0.2.0 batch workers left in the
   snapshot, alert and alert-state topics, and the source records) produced into fresh topics
   at the very offsets 0.2.0 wrote them: ``CheckpointStore.restore`` and the worker's restore
   path (``restore_partition``) pick the same generation and get 0.2.0's bytes, which a
   current-code replay reaches too; ``AlertView`` reads 0.2.0's raised set; a current worker
   started on them resumes from the 0.2.0 snapshots (the source records below them are
   deleted, so a rebuild from scratch could not pass) and ends where a full replay does.
2. A rolling upgrade under load: two 0.2.0 batch workers (the released package, built from its
   release commit into .cache/grudge-0.2.0-venv by tools/release_venv.py) replaced one at a
   time by current ones, while traffic flows: 0 lost alerts, 0 divergent partitions against
   an uninterrupted replay.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from grudge_devkafka import free_port
from grudge_stream.checkpoint import CheckpointStore
from grudge_stream.client import AlertView
from grudge_stream.operators.records import SourceRecord
from grudge_stream.partitions import restore_partition
from grudge_stream.topics import create_topics, ensure_topology_topics
from grudge_stream.topology import Settings, load_topology

pytestmark = [pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


uf = _load("grudge_tests_upgrade_fixture", ROOT / "tests" / "upgrade_fixture.py")
GAP_KEY = b"\x00upgrade-fixture-gap"  # fills an offset 0.2.0's log had no record at (a marker)
ALERTING = ["abuse_scores", "heavy_hitters"]


# -- the fixture in a broker ------------------------------------------------------------------

def _delete_topics(bootstrap: str, topics: list[str]) -> None:
    """A broker someone else runs may hold the fixture's topics from an earlier run."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    present = [t for t in topics if t in admin.list_topics(timeout=30).topics]
    if not present:
        return
    for fut in admin.delete_topics(present).values():
        fut.result(60)
    deadline = time.monotonic() + 60
    while any(t in admin.list_topics(timeout=30).topics for t in present):
        assert time.monotonic() < deadline, f"topics {present} not deleted"
        time.sleep(0.5)


def _produce_at_offsets(bootstrap: str, topic: str, records: list) -> None:
    """Each record at its own partition and offset (any offset 0.2.0's log skipped gets a
    record of GAP_KEY, which every reader ignores); checked against the delivery reports."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    landed: dict[tuple[int, int], tuple] = {}

    def delivered(want):
        def cb(err, msg) -> None:
            landed[want] = (err, msg.offset() if err is None else None)
        return cb

    for p, recs in sorted(uf.by_partition(records).items()):
        nxt = 0
        for r in sorted(recs, key=lambda r: r.offset):
            while nxt < r.offset:
                producer.produce(topic, key=GAP_KEY, value=b"", partition=p, on_delivery=delivered((p, nxt)))
                nxt += 1
            producer.produce(topic, key=r.key, value=r.value, partition=p, timestamp=r.timestamp,
                             headers=list(r.headers) or None, on_delivery=delivered((p, r.offset)))
            nxt += 1
            producer.poll(0)
    assert producer.flush(60) == 0
    wrong = {want: got for want, got in landed.items() if got != (None, want[1])}
    assert not wrong, f"{topic}: records not at their 0.2.0 offsets: {sorted(wrong.items())[:5]}"


def load_into_broker(fx, bootstrap: str):
    """Fresh topics named as 0.2.0's were, holding the fixture's records; the topology."""
    topology = fx.topology(bootstrap_servers=bootstrap)
    every = sorted({topology.source_topic, topology.snapshot_topic, *topology.outputs.values(),
                    *([topology.overrides_topic] if topology.overrides_topic else [])})
    _delete_topics(bootstrap, every)
    # The fixture's event times are fixed, in the past: kept whatever their age.
    create_topics(bootstrap, {t: (fx.partitions, {"retention.ms": "-1"}) for t in
                              {topology.source_topic, *(t for r, t in topology.outputs.items() if r != "alert_state")}})
    ensure_topology_topics(topology, bootstrap, partitions=fx.partitions)
    for role, topic in fx.topics.items():
        _produce_at_offsets(bootstrap, topic, fx.records[role])
    return topology


def _generation(fx, p: int, generation: int) -> dict:
    return next(g for g in fx.generations(p) if g["generation"] == generation)


# -- 1. restores --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", uf.NAMES)
def test_0_2_0_snapshots_restore_through_the_broker(kafka_bootstrap: str, name: str) -> None:
    fx = uf.Fixture(name)
    topology = load_into_broker(fx, kafka_bootstrap)
    store = CheckpointStore(kafka_bootstrap, topology.snapshot_topic)
    try:
        for p in range(fx.partitions):
            want = fx.expected["partitions"][str(p)]
            res = store.restore(topology.operator_id, p,
                                accept=lambda ref, blob, p=p: topology.make_operator(p).restore(blob))
            assert res.refused == [], res.refused
            assert res.ref is not None and res.ref.generation == want["restored_generation"]
            assert uf.sha(res.blob) == want["restored_sha256"]
            # The worker's own restore: its checks of source topic, partition count, settings.
            outcome = restore_partition(topology, CheckpointStore(kafka_bootstrap, topology.snapshot_topic), p,
                                        fx.partitions, low_watermark=lambda: 0)
            assert outcome.mode == "snapshot" and outcome.start_offset == res.ref.next_offset
            op = outcome.operator
            assert op.snapshot() == res.blob, f"{name}[{p}]: re-snapshot differs from 0.2.0's"
            gen = _generation(fx, p, res.ref.generation)
            replay = topology.make_operator(p)
            replay.process(fx.source_records(p, below=res.ref.next_offset))
            assert replay.snapshot() == op.snapshot(), f"{name}[{p}]: differs from a replay"
            if gen["sketch_sha256"] is not None:
                assert uf.sha(op.sketch_bytes()) == gen["sketch_sha256"]
                assert replay.sketch_bytes() == op.sketch_bytes()
    finally:
        store.close()


@pytest.mark.parametrize("name", ALERTING)
def test_alert_view_reads_the_0_2_0_alert_state(kafka_bootstrap: str, name: str) -> None:
    fx = uf.Fixture(name)
    load_into_broker(fx, kafka_bootstrap)
    settings = Settings({**fx.settings, "bootstrap_servers": kafka_bootstrap}, environ={})
    with AlertView.for_topology(name, settings) as view:
        raised = set(view.raised())
        # Every key 0.2.0 ever raised is in the view exactly when 0.2.0's view had it.
        ever = {r.key for r in fx.records["alert_state"]}
        assert {k for k in ever if view.is_raised(k)} == fx.raised()
    assert raised == fx.raised()
    if name == "abuse_scores":
        assert raised, "the fixture's abusers are raised at its end"
    else:
        assert not raised and any(r.value is None for r in fx.records["alert_state"]), "raised, then cleared"


# -- resuming from 0.2.0 snapshots ------------------------------------------------------------

def _worker_cmd(python_or_script: list[str], name: str, bootstrap: str, port: int, settings: dict,
                state_dir: Path) -> list[str]:
    cmd = [*python_or_script, "worker", name, "--runtime", "batch", "--bootstrap-servers", bootstrap,
           "--web-port", str(port), "--loglevel", "info", "--no-create-topics"]
    for k, v in {**settings, "state_dir": str(state_dir)}.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def _more_events(fx, p: int, end: int) -> list[SourceRecord]:
    """The last quarter of partition ``p``'s records again, later in event time, at ``end``..."""
    recs = fx.source_records(p)
    span = recs[-1].timestamp_ms - recs[0].timestamp_ms + 1000
    again = recs[len(recs) * 3 // 4:]
    return [SourceRecord(r.topic, p, end + i, r.timestamp_ms + span, r.key, r.value) for i, r in enumerate(again)]


def _read(bootstrap: str, topic: str, partitions: int) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"upgrade-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in range(partitions)}
        tps = [TopicPartition(topic, p, 0) for p in range(partitions) if ends[p]]
        got: list = []
        if not tps:
            return got
        c.assign(tps)
        deadline = time.monotonic() + 60
        while True:
            got += [m for m in c.consume(1000, timeout=0.5) if not m.error()]
            pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, tp.partition) for tp in tps])}
            if all(pos[p] >= ends[p] for p in pos):
                return got
            assert time.monotonic() < deadline, f"timed out reading {topic}"
    finally:
        c.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", uf.NAMES)
def test_a_current_worker_resumes_from_0_2_0_snapshots(kafka_bootstrap: str, tmp_path: Path, name: str) -> None:
    fx = uf.Fixture(name)
    bs = kafka_bootstrap
    topology = load_into_broker(fx, bs)
    src = topology.source_topic
    resume = {p: fx.expected["partitions"][str(p)] for p in range(fx.partitions)}
    starts: dict[int, int] = {}
    for p in range(fx.partitions):
        ref = fx.refs(p)[resume[p]["restored_generation"]]
        starts[p] = ref.next_offset
    ends = {p: max(r.offset for r in fx.source_records(p)) + 1 for p in range(fx.partitions)}
    # 0.2.0's group had committed up to its snapshots (they covered the whole stream).
    assert starts == ends
    group = Consumer({"bootstrap.servers": bs, "group.id": topology.app_id, "enable.auto.commit": False})
    group.commit(offsets=[TopicPartition(src, p, starts[p]) for p in starts], asynchronous=False)
    group.close()
    # The records the snapshots cover are gone: only a resume from them can end right.
    admin = AdminClient({"bootstrap.servers": bs})
    for fut in admin.delete_records([TopicPartition(src, p, starts[p]) for p in starts]).values():
        fut.result(30)
    more = {p: _more_events(fx, p, ends[p]) for p in range(fx.partitions)}
    producer = Producer({"bootstrap.servers": bs, "enable.idempotence": True})
    for p, recs in more.items():
        for r in recs:
            producer.produce(src, key=r.key, value=r.value, partition=p, timestamp=r.timestamp_ms)
    assert producer.flush(30) == 0
    outputs_before = {role: Counter((m.key(), m.value()) for m in _read(bs, t, fx.partitions))
                      for role, t in topology.outputs.items() if role != "alert_state"}

    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    cmd = _worker_cmd([sys.executable, "-m", "grudge_stream.cli"], name, bs, free_port(), fx.settings,
                      tmp_path / "state")
    with open(log, "wb") as f:
        worker = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path))
    store = CheckpointStore(bs, topology.snapshot_topic)
    try:
        deadline = time.monotonic() + 120
        while True:
            got = {p: store.read_manifest(topology.operator_id, p) for p in range(fx.partitions)}
            if all(m is not None and m.current.next_offset == ends[p] + len(more[p]) for p, m in got.items()):
                break
            assert worker.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, f"not caught up: {got}\n{log.read_text()[-4000:]}"
            time.sleep(0.3)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        rc = worker.wait(60)
    text = log.read_text(errors="replace")
    assert rc == 0, text[-4000:]
    for p in range(fx.partitions):
        assert f"{src}[{p}] mode=snapshot next_offset={starts[p]} " in text, text[-4000:]
    assert "mode=replay" not in text and "mode=fresh" not in text

    for p in range(fx.partitions):
        full = topology.make_operator(p)
        full.process(fx.source_records(p) + more[p])
        res = store.restore(topology.operator_id, p, accept=lambda ref, blob: None)
        op = topology.make_operator(p)
        op.restore(res.blob)
        assert op.snapshot() == full.snapshot(), f"{name}[{p}] differs from a full replay"
    store.close()
    # What the resumed worker published is what a full replay publishes for the new records.
    want: dict[str, Counter] = {role: Counter() for role in outputs_before}
    for p in range(fx.partitions):
        # As a runtime builds it: reports that merge over partitions carry the partition count.
        replay = topology.operator(p, partition_count=fx.partitions)
        replay.process(fx.source_records(p))
        for o in replay.process(more[p]):
            if o.role in want:
                want[o.role][(o.key, o.value)] += 1
    for role, before in outputs_before.items():
        after = Counter((m.key(), m.value()) for m in _read(bs, topology.outputs[role], fx.partitions))
        assert after - before == want[role], f"{name}: {role} differs from a replay"


# -- 2. a rolling upgrade from 0.2.0 ----------------------------------------------------------

@pytest.fixture(scope="session")
def release_0_2_0() -> Path:
    """The bin directory of a venv holding the released 0.2.0 (tools/release_venv.py: kept under
    .cache/ and built on first use: pip compiles its Cython kernels, 8 minutes on a busy 2-core
    machine; ``make test`` builds it beforehand, and later sessions find it in 0.3 s)."""
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(ROOT / "tools" / "release_venv.py"), "0.2.0"],
                              capture_output=True, text=True, timeout=1200, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        pytest.fail("building the 0.2.0 release venv took more than 1200 s")
    if done.returncode == 3:
        pytest.skip(f"the 0.2.0 release commit is not in this repository: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr[-3000:]
    took = time.monotonic() - t0
    if took > 5:
        print(f"built the 0.2.0 release venv in {took:.0f} s")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_rolling_upgrade_from_0_2_0_under_load(harness, release_0_2_0: Path) -> None:
    h = harness(runtime="batch", session_timeout_s=10, heartbeat_interval_s=1)
    events = h.make_events(60_000, seed=20, abusers=40)
    h.produce(events[:6_000])

    def start_old():
        port = free_port()
        log_path = h.tmp_path / f"worker-0.2.0-{len(h.workers)}.log"
        settings = {k: v for k, v in h.overrides.items() if k != "bootstrap_servers"}
        cmd = _worker_cmd([str(release_0_2_0 / "grudge-stream")], "abuse_scores", h.bootstrap, port, settings,
                          h.tmp_path / "state")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
        with open(log_path, "wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd="/")
        return h.track(proc, log_path, port)

    old = [start_old(), start_old()]
    for w in old:
        w.wait_ready()
    traffic = h.produce_in_background(events[6_000:], seconds=40)
    time.sleep(8)
    new = []
    mixed = 0
    for w in old:  # one at a time, as a Deployment's rolling update does
        if new:  # a current worker and a 0.2.0 one in one group, each holding partitions
            mixed = new[0].log().count("mode=snapshot")
        assert w.stop() == 0, w.log()[-3000:]
        new.append(h.start_worker())
        new[-1].wait_ready()
        time.sleep(8)
    traffic.join(120)
    assert not traffic.is_alive()
    h.wait_caught_up(timeout=180)
    for w in new:
        assert w.proc.poll() is None, w.log()[-3000:]

    # The deployment keeps the one index scheme 0.2.0 knew (Kirsch-Mitzenmacher): the current
    # workers, left at the default, adopt it from the snapshots they restore. The replay and
    # the final state are read under it.
    h.topology = load_topology("abuse_scores", Settings({**h.overrides, "index_scheme": "km"}, environ={}))
    for w in new:
        assert "index_scheme" in w.log(), "a current worker did not say it adopted the snapshots' scheme"
    ref = h.reference()
    final = h.final_state()
    divergent = [p for p in ref if final[p] != ref[p]["sketch"]]
    want = set().union(*(r["alerts"] for r in ref.values()))
    got = h.alert_ids()
    lost, extra = want - got, got - want
    # The current workers took over partitions from 0.2.0 snapshots.
    adopted = sum(w.log().count("mode=snapshot") for w in new)
    print(f"rolling upgrade: {len(events)} events, {len(want)} alerts, lost {len(lost)}, extra {len(extra)}, "
          f"divergent partitions {divergent}, restores from snapshots by the new workers {adopted} "
          f"({mixed} beside a 0.2.0 worker)")
    assert mixed > 0 and adopted > mixed
    assert not lost and not extra and not divergent, (sorted(lost)[:5], sorted(extra)[:5], divergent)
