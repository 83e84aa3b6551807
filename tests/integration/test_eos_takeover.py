"""Exactly-once takeover against the real broker: restores behind another producer's open transaction.

A ``read_committed`` reader stops at a partition's last stable offset (LSO), before the oldest
transaction still open there. A snapshot manifest committed *after* such a transaction is
invisible to it until the transaction ends; restoring the older manifest below the LSO would
make a worker re-process (and, exactly-once, re-commit the outputs of) everything in between.
``CheckpointStore`` waits, bounded, for such a transaction to end, and refuses with a clear
error when the bound passes (docs/checkpoints.md, "Open transactions").
"""
from __future__ import annotations

import json
import logging
import os
import struct
import signal
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from grudge_stream.checkpoint import (
    CHUNK_MAGIC, SNAPSHOT_TOPIC_CONFIG, CheckpointStore, SnapshotWrite, chunk_key, manifest_key,
)
from grudge_stream.exceptions import CheckpointError
from grudge_stream.hashing import crc32c

pytestmark = pytest.mark.kafka

_CHUNK = struct.Struct("<4sQIIIII")  # the chunk header of docs/checkpoints.md


# -- helpers -------------------------------------------------------------------------------------


def txn_producer(bootstrap: str, timeout_ms: int = 60_000, name: str = "txn") -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{name}-{uuid.uuid4().hex[:8]}",
                  "transaction.timeout.ms": timeout_ms, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 0})
    p.init_transactions(30)
    return p


def open_foreign_transaction(bootstrap: str, topic: str, partition: int, key: bytes,
                             timeout_ms: int) -> tuple[Producer, int]:
    """A second producer (another transactional id) writes one chunk-like record to the snapshot
    partition in a transaction it never ends, as a worker that died mid-snapshot leaves it.
    Returns the producer (keep it referenced) and the record's offset."""
    p = txn_producer(bootstrap, timeout_ms, name="foreign")
    p.begin_transaction()
    data = os.urandom(512)
    value = _CHUNK.pack(CHUNK_MAGIC, 7, 0, 1, crc32c(data), len(data), 0) + data
    got: list = []
    p.produce(topic, key=key, value=value, partition=partition, on_delivery=lambda err, msg: got.append((err, msg)))
    assert p.flush(30) == 0
    (err, msg), = got
    assert err is None, err
    return p, msg.offset()


class Offsets:
    """Log end (read_uncommitted) and last stable offset (read_committed) of partitions."""

    def __init__(self, bootstrap: str) -> None:
        base = {"bootstrap.servers": bootstrap, "group.id": f"eos-probe-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False}
        self.committed = Consumer({**base, "isolation.level": "read_committed"})
        self.uncommitted = Consumer({**base, "isolation.level": "read_uncommitted"})

    def open(self, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
        """Partitions with an open transaction (or pending markers): {p: (lso, log end)}."""
        out = {}
        for p in range(partitions):
            tp = TopicPartition(topic, p)
            hw = self.uncommitted.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            lso = self.committed.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            if lso < hw:
                out[p] = (lso, hw)
        return out

    def wait_stable(self, topics: list[str], partitions: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            still = {t: o for t in topics if (o := self.open(t, partitions))}
            if not still:
                return
            assert time.monotonic() < deadline, f"transactions still open after {timeout}s: {still}"
            time.sleep(0.5)

    def close(self) -> None:
        self.committed.close()
        self.uncommitted.close()


def write(store: CheckpointStore, partition: int, blob: bytes, next_offset: int):
    return store.write_many([SnapshotWrite("op", partition, blob, next_offset, 1_000 + next_offset, "fp",
                                           "events", 1)])[0]


# -- the store on its own --------------------------------------------------------------------------


def test_restore_waits_for_a_foreign_open_transaction_and_never_adopts_the_stale_snapshot(
        kafka_bootstrap, make_topic, caplog) -> None:
    topic = make_topic(1, config=SNAPSHOT_TOPIC_CONFIG, suffix="snap")
    a = txn_producer(kafka_bootstrap, name="worker-a")
    store_a = CheckpointStore(kafka_bootstrap, topic, chunk_bytes=4096, producer=a)
    gen1, gen2 = os.urandom(9_000), os.urandom(9_000)
    a.begin_transaction()
    assert write(store_a, 0, gen1, 100).generation == 1
    a.commit_transaction(30)
    # Worker B (another transactional id) starts a snapshot and dies before committing.
    foreign, foreign_offset = open_foreign_transaction(kafka_bootstrap, topic, 0, chunk_key("op", 0, 0, 0),
                                                       timeout_ms=5_000)
    a.begin_transaction()
    assert write(store_a, 0, gen2, 300).generation == 2
    a.commit_transaction(30)
    probe = Offsets(kafka_bootstrap)
    try:
        lso, hw = probe.open(topic, 1)[0]
        assert lso == foreign_offset and hw > foreign_offset

        # A tiny bound: a clear refusal, never generation 1.
        t0 = time.monotonic()
        impatient = CheckpointStore(kafka_bootstrap, topic, open_transaction_wait_s=0.5)
        with pytest.raises(CheckpointError, match="Operator action") as err:
            impatient.restore("op", 0)
        assert time.monotonic() - t0 < 10
        msg = str(err.value)
        assert f"{topic}[0]" in msg and f"--start-offset {foreign_offset}" in msg and "open_transaction_wait_s" in msg
        # write_many's generation numbering reads the same manifest: no second generation 2.
        with pytest.raises(CheckpointError, match="Operator action"):
            write(impatient, 0, os.urandom(2_000), 400)
        impatient.close()

        # The default bound covers the 5 s timeout plus the broker's 10 s abort check.
        caplog.clear()
        caplog.set_level(logging.INFO, logger="grudge_stream.checkpoint")
        patient = CheckpointStore(kafka_bootstrap, topic)
        t0 = time.monotonic()
        got = patient.restore("op", 0)
        waited = time.monotonic() - t0
        assert got.blob == gen2 and got.ref.generation == 2 and got.ref.next_offset == 300
        assert waited < 40, waited
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings, "the wait must be logged"
        assert f"{topic}[0]" in warnings[0] and f"last stable offset {foreign_offset}" in warnings[0]
        assert "at most 90 s" in warnings[0]
        assert not probe.open(topic, 1), "the broker should have aborted the foreign transaction"
        # And the next generation written after the restore is 3, in the other slot.
        ref3 = write(patient, 0, os.urandom(3_000), 500)
        assert ref3.generation == 3 and ref3.slot != got.ref.slot
        patient.close()
        # A normal restore (no open transaction) does not wait and logs nothing.
        caplog.clear()
        fresh = CheckpointStore(kafka_bootstrap, topic)
        t0 = time.monotonic()
        assert fresh.restore("op", 0).ref.generation == 3
        assert time.monotonic() - t0 < 2.0
        assert not [r for r in caplog.records if r.levelno >= logging.INFO]
        fresh.close()
    finally:
        probe.close()
        del foreign


def test_an_open_transaction_that_hides_no_manifest_costs_no_wait(kafka_bootstrap, make_topic, caplog) -> None:
    """A crashed worker's transaction that got no further than chunks hides nothing newer: the
    newest committed manifest is below the LSO, so restore and write_many go ahead at once."""
    topic = make_topic(1, config=SNAPSHOT_TOPIC_CONFIG, suffix="snap")
    setup = CheckpointStore(kafka_bootstrap, topic, chunk_bytes=4096)
    blob = os.urandom(9_000)
    write(setup, 0, blob, 100)
    write(setup, 1, os.urandom(5_000), 100)  # same snapshot partition (the topic has one)
    setup.close()
    foreign, _ = open_foreign_transaction(kafka_bootstrap, topic, 0, chunk_key("op", 0, 1, 0), timeout_ms=60_000)
    try:
        caplog.set_level(logging.INFO, logger="grudge_stream.checkpoint")
        # An impatient bound proves nothing waits for the 60 s transaction.
        store = CheckpointStore(kafka_bootstrap, topic, open_transaction_wait_s=2.0)
        got = store.restore("op", 0)
        assert got.blob == blob and got.ref.generation == 1
        assert any("holds no manifest" in r.getMessage() for r in caplog.records)
        store.close()

        # A transactional writer's own open transaction: a round over two partitions that share
        # the snapshot partition, the second one not yet cached (a fresh store). Reading its
        # manifest must not wait for the round's own chunks to commit.
        own = txn_producer(kafka_bootstrap, name="own")
        mine = CheckpointStore(kafka_bootstrap, topic, chunk_bytes=4096, chunk_delay_s=0.01, producer=own,
                               open_transaction_wait_s=2.0)
        own.begin_transaction()
        refs = mine.write_many([SnapshotWrite("op", p, os.urandom(6_000), 200, 1_200, "fp", "events", 1)
                                for p in (0, 1)])
        own.commit_transaction(30)
        assert [r.generation for r in refs] == [2, 2]
    finally:
        foreign.abort_transaction(30)
    after = CheckpointStore(kafka_bootstrap, topic)
    assert after.restore("op", 1).ref.next_offset == 200
    after.close()


# -- takeover with the batch runtime ---------------------------------------------------------------


def eos_harness(harness, **settings):
    return harness(partitions=2, runtime="batch", exactly_once="true", emit_scores="every",
                   snapshot_chunk_bytes=16384, transaction_timeout_s=10, session_timeout_s=6,
                   heartbeat_interval_s=1, **settings)


def reference_outputs(h) -> tuple[dict, set, dict]:
    """Operators run in-process over the source records: score per (partition, offset), alert
    ids, and the final sketch per partition."""
    recs = h.source_records()
    scores: dict[tuple[int, int], float] = {}
    alerts: set[str] = set()
    sketches = {}
    for p in range(h.partitions):
        op = h.topology.make_operator(p)
        for o in op.process(recs.get(p, [])):
            body = json.loads(o.value)
            if o.role == "scores":
                scores[(body["source"]["partition"], body["source"]["offset"])] = body["score"]
            elif o.role == "alerts":
                alerts.add(body["alert_id"])
        sketches[p] = op.sketch_bytes()
    return scores, alerts, sketches


def assert_exactly_once(h, probe: Offsets) -> None:
    scores, alerts, sketches = reference_outputs(h)
    assert scores and alerts, "the traffic should raise alerts"
    state = h.final_state()
    for p in range(h.partitions):
        assert state[p] == sketches[p], f"partition {p} state differs from the reference"
    # The dead worker's transaction (outputs included) ends by its 10 s timeout: until then a
    # read_committed reader stops before it.
    probe.wait_stable([h.topology.outputs["scores"], h.topology.outputs["alerts"]], h.partitions, 60)
    seen = Counter()
    got_scores = {}
    for m in h.read_all(h.topology.outputs["scores"], read_committed=True):
        body = json.loads(m.value())
        k = (body["source"]["partition"], body["source"]["offset"])
        seen[k] += 1
        got_scores[k] = body["score"]
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"{len(twice)} score records committed more than once, e.g. {list(twice.items())[:5]}"
    assert set(got_scores) == set(scores), (
        f"{len(set(scores) - set(got_scores))} missing, {len(set(got_scores) - set(scores))} unexpected")
    assert got_scores == scores
    ids = [json.loads(m.value())["alert_id"] for m in h.read_all(h.topology.outputs["alerts"], read_committed=True)]
    assert len(ids) == len(set(ids)), "an alert was committed twice"
    assert set(ids) == alerts


@pytest.mark.slow
def test_takeover_by_another_transactional_id_after_kill_9_mid_background_snapshot(harness) -> None:
    """Exactly-once snapshots are written in the background, outside the transaction: a
    worker killed while one is on its way leaves chunks without a manifest on the snapshot
    topic and a transaction of outputs open; the replacement (another transactional id,
    which cannot fence it) restores from the last manifest and nothing is lost, duplicated
    or divergent."""
    h = eos_harness(harness)
    events = h.make_events(30_000, seed=31)
    h.produce(events[:10_000])
    snap = h.topology.snapshot_topic
    probe = Offsets(h.bootstrap)
    try:
        a = h.start_worker(group_instance_id="eos-a", snapshot_chunk_delay_s=0.05, transaction_timeout_s=15,
                           snapshot_replay_budget_s=0)
        feeder = h.produce_in_background(events[10_000:20_000], seconds=8)
        store = h.store()
        deadline = time.monotonic() + 45
        while not all(store.read_manifest(h.topology.operator_id, p) for p in range(h.partitions)):
            assert time.monotonic() < deadline and a.proc.poll() is None, a.log()[-3000:]
            time.sleep(0.2)
        # Then wait for the chunks of a newer generation to start arriving, and kill.
        ends = {p: probe.uncommitted.get_watermark_offsets(TopicPartition(snap, p), timeout=10, cached=False)[1]
                for p in range(h.partitions)}
        while all(probe.uncommitted.get_watermark_offsets(TopicPartition(snap, p), timeout=10, cached=False)[1]
                  == ends[p] for p in range(h.partitions)):
            assert time.monotonic() < deadline and a.proc.poll() is None, a.log()[-3000:]
            time.sleep(0.01)
        a.kill9()
        assert not probe.open(snap, h.partitions), "background snapshots are not transactional"
        b = h.start_worker(group_instance_id="eos-b")
        feeder.join(60)
        h.produce(events[20_000:])
        h.wait_caught_up(timeout=90)
        assert b.stop() == 0
        log = b.log()
        assert "mode=snapshot" in log, log[-3000:]
        assert_exactly_once(h, probe)
    finally:
        probe.close()


@pytest.mark.slow
def test_takeover_while_a_foreign_transaction_hides_the_newest_snapshot(harness) -> None:
    h = eos_harness(harness)
    events = h.make_events(30_000, seed=32)
    h.produce(events[:10_000])
    snap, op_id = h.topology.snapshot_topic, h.topology.operator_id
    probe = Offsets(h.bootstrap)
    foreign = None
    try:
        a = h.start_worker(group_instance_id="eos-a")
        h.wait_caught_up(timeout=60)
        # A third producer leaves a transaction open on snapshot partition 0; it times out after
        # 20 s, so it is still open when the replacement restores (after A's 6 s session).
        foreign, foreign_offset = open_foreign_transaction(h.bootstrap, snap, 0, chunk_key(op_id, 0, 1, 0),
                                                           timeout_ms=20_000)
        h.produce(events[10_000:20_000])
        # A commits a newer generation of partition 0 behind the foreign transaction: wait for
        # its manifest there, then for the group offset committed in the same transaction.
        newest = wait_for_manifest_after(h, probe, foreign_offset, deadline=time.monotonic() + 30)
        watcher = Consumer({"bootstrap.servers": h.bootstrap, "group.id": h.topology.app_id})
        try:
            deadline = time.monotonic() + 30
            while True:
                (tp,) = watcher.committed([TopicPartition(h.topology.source_topic, 0)], timeout=10)
                if tp.offset >= newest:
                    break
                assert time.monotonic() < deadline, (tp.offset, newest)
                time.sleep(0.1)
        finally:
            watcher.close()
        assert 0 in probe.open(snap, h.partitions), "the foreign transaction should still be open"
        a.kill9()
        b = h.start_worker(group_instance_id="eos-b")
        h.produce(events[20_000:])
        h.wait_caught_up(timeout=90)
        assert b.stop() == 0
        log = b.log()
        restored = [line for line in log.splitlines() if f"{h.topology.source_topic}[0] mode=snapshot" in line]
        assert restored, log[-3000:]
        next_offset = int(restored[0].split("next_offset=")[1].split()[0])
        assert next_offset >= newest, f"restored a stale snapshot: next_offset {next_offset} < {newest}"
        assert_exactly_once(h, probe)
        assert "waits for an open transaction" in log, log[-3000:]
    finally:
        probe.close()
        del foreign


def wait_for_manifest_after(h, probe: Offsets, after: int, deadline: float) -> int:
    """The next_offset of the first manifest of partition 0 written past offset ``after``."""
    key = manifest_key(h.topology.operator_id, 0)
    c = probe.uncommitted
    tp = TopicPartition(h.topology.snapshot_topic, 0, after + 1)
    c.assign([tp])
    try:
        while True:
            for m in c.consume(100, timeout=0.2):
                if not m.error() and m.key() == key:
                    return json.loads(m.value())["current"]["next_offset"]
            assert time.monotonic() < deadline, "worker A wrote no snapshot of partition 0 behind the foreign one"
    finally:
        c.unassign()


@pytest.mark.slow
def test_a_worker_dropped_from_the_group_aborts_its_transaction_and_carries_on(harness) -> None:
    """A worker stopped (SIGSTOP) past its session timeout falls out of the group; when it
    runs again its open transaction cannot commit (its member id is gone). It aborts the
    transaction, goes back to its snapshots and carries on, as Kafka Streams does with a
    migrated task: the worker does not exit, and nothing is lost, duplicated or divergent."""
    h = eos_harness(harness)
    events = h.make_events(30_000, seed=37)
    h.produce(events[:10_000])
    probe = Offsets(h.bootstrap)
    try:
        a = h.start_worker(group_instance_id="", snapshot_replay_budget_s=0)
        store = h.store()
        deadline = time.monotonic() + 45
        while not all(store.read_manifest(h.topology.operator_id, p) for p in range(h.partitions)):
            assert time.monotonic() < deadline and a.proc.poll() is None, a.log()[-3000:]
            time.sleep(0.2)
        feeder = h.produce_in_background(events[10_000:20_000], seconds=6)
        time.sleep(1.0)
        a.proc.send_signal(signal.SIGSTOP)  # past session_timeout_s (6), within the transaction's 10 s
        time.sleep(8.0)
        a.proc.send_signal(signal.SIGCONT)
        feeder.join(60)
        h.produce(events[20_000:])
        h.wait_caught_up(timeout=120)
        assert a.proc.poll() is None, a.log()[-3000:]
        log = a.log()
        # Aborted, or (when librdkafka's send_offsets_to_transaction blocks past its timeout
        # with the member gone) the producer replaced: either way the held partitions reset.
        # On a loaded machine librdkafka may serve the lost assignment's revocation before the
        # loop's next commit: the revocation's checkpoint then goes through (nothing open to
        # abort, or committed as the rejoining member's) and the partitions come back from
        # those snapshots. Every way keeps exactly-once, asserted below.
        aborted = "transaction aborted" in log or "transactional producer cannot go on" in log
        timed_out = "Consumer group session timed out"
        after_timeout = log.split(timed_out, 1)[1] if timed_out in log else ""
        assert aborted or "mode=snapshot" in after_timeout, log[-3000:]
        assert a.stop() == 0, a.log()[-3000:]
        assert_exactly_once(h, probe)
    finally:
        probe.close()
