"""The Faust runtime against the real broker: crashes, rebalances, bad input, corrupt snapshots.

Every test ends the same way: once the workers have caught up, the sketch
state of every partition (restored from the snapshot topic) is byte-identical
to a reference computed by running the operator over the same records without
interruption, and every reference alert id is on the alert topic.
"""
from __future__ import annotations

import json
import random
import time
import zlib

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from grudge_devkafka import free_port
from grudge_stream.checkpoint import CHUNK_MAGIC

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

# The batch runtime on each ingest path (setting ingest, grudge_stream.runtime.native).
BATCH_INGEST = [pytest.param("python", id="python-ingest"), pytest.param("native", id="native-ingest")]


def assert_matches_reference(h, ref=None) -> None:
    ref = ref or h.reference()
    h.wait_caught_up()
    state = h.final_state()
    for p in range(h.partitions):
        assert state[p] == ref[p]["sketch"], f"partition {p} state differs from the reference"
    missing = set().union(*(r["alerts"] for r in ref.values())) - h.alert_ids()
    assert not missing, f"{len(missing)} reference alerts never published"
    assert any(r["alerts"] for r in ref.values()), "the traffic should raise alerts"


def last_record_is_chunk(h) -> bool:
    """True if some snapshot partition ends in a chunk: a snapshot write was cut short."""
    c = Consumer({"bootstrap.servers": h.bootstrap, "group.id": "probe", "enable.auto.commit": False})
    try:
        for p in range(h.partitions):
            low, high = c.get_watermark_offsets(TopicPartition(h.topology.snapshot_topic, p), timeout=10)
            if high <= low:
                continue
            c.assign([TopicPartition(h.topology.snapshot_topic, p, high - 1)])
            for _ in range(20):
                msgs = c.consume(1, timeout=0.5)
                if msgs and not msgs[0].error():
                    if msgs[0].value()[:4] == CHUNK_MAGIC:
                        return True
                    break
        return False
    finally:
        c.close()


def snapshot_high(h) -> int:
    return sum(h.end_offsets(h.topology.snapshot_topic).values())


def kill_nine_times(h, rnd: random.Random, kills: int = 6, **worker_settings):
    """Start a worker and kill -9 it ``kills`` times (every other time right inside a snapshot
    write); return the last, still running, worker and how many kills hit a write."""
    # Static membership: each restart takes the dead worker's place (same instance id, same
    # advertised web address) without waiting for its session to time out.
    port = free_port()
    settings = dict(snapshot_chunk_delay_s=0.03, group_instance_id="crash-test", **worker_settings)
    worker = h.start_worker(port, **settings)
    mid_write = 0
    for i in range(kills):
        if i % 2 == 1:
            # Kill right after a snapshot chunk lands: the manifest is not written yet.
            base = snapshot_high(h)
            deadline = time.monotonic() + 20
            while snapshot_high(h) == base and time.monotonic() < deadline:
                time.sleep(0.02)
            worker.kill9()
            mid_write += last_record_is_chunk(h)
        else:
            time.sleep(rnd.uniform(1.0, 4.0))
            worker.kill9()
        worker = h.start_worker(port, **settings)
    return worker, mid_write


@pytest.mark.parametrize("runtime,ingest", [("faust", "python"), ("batch", "python"), ("batch", "native")])
def test_kill_9_at_random_points_loses_and_duplicates_nothing(harness, runtime: str, ingest: str) -> None:
    h = harness(partitions=4, snapshot_chunk_bytes=16384, runtime=runtime, ingest=ingest)
    events = h.make_events(60_000, seed=11)
    h.produce(events[:10_000])
    feeder = h.produce_in_background(events[10_000:], seconds=25)
    worker, mid_write = kill_nine_times(h, random.Random(3))
    feeder.join(120)
    assert mid_write >= 1, "no kill landed inside a snapshot write"
    assert_matches_reference(h)
    worker.wait_ready()
    assert worker.stop() == 0


@pytest.mark.parametrize("ingest", BATCH_INGEST)
def test_exactly_once_outputs_survive_kill_9(harness, ingest: str) -> None:
    h = harness(partitions=3, snapshot_chunk_bytes=16384, runtime="batch", exactly_once="true", ingest=ingest)
    events = h.make_events(45_000, seed=16)
    h.produce(events[:10_000])
    feeder = h.produce_in_background(events[10_000:], seconds=20)
    worker, _ = kill_nine_times(h, random.Random(4))
    feeder.join(120)
    ref = h.reference()
    h.wait_caught_up()
    worker.wait_ready()  # the last restart may still be starting: the snapshots covered the end before it
    assert worker.stop() == 0
    state = h.final_state()
    for p in range(h.partitions):
        assert state[p] == ref[p]["sketch"]
    seen = [json.loads(m.value())["alert_id"] for m in h.read_all(h.topology.outputs["alerts"],
                                                                   read_committed=True)]
    expected = set().union(*(r["alerts"] for r in ref.values()))
    assert expected and len(seen) == len(set(seen)), "an alert was delivered twice"
    assert set(seen) == expected


@pytest.mark.parametrize("runtime,drain,ingest", [("faust", "batch", "python"), ("faust", "agent", "python"),
                                                  ("batch", "batch", "python"), ("batch", "batch", "native"),
                                                  ("batch", "cooperative-sticky", "python"),
                                                  ("batch", "cooperative-sticky", "native")])
def test_two_workers_rebalance_to_the_same_state(harness, runtime: str, drain: str, ingest: str) -> None:
    if drain == "cooperative-sticky":  # incremental rebalances: only the moving partitions stop
        h = harness(partitions=4, runtime=runtime, ingest=ingest, **{"kafka.partition.assignment.strategy": drain})
    else:
        h = harness(partitions=4, drain=drain, runtime=runtime, ingest=ingest)
    events = h.make_events(50_000, seed=12)
    feeder = h.produce_in_background(events, seconds=20)
    a = h.start_worker()
    time.sleep(4)
    b = h.start_worker()
    time.sleep(5)
    assert b.stop() == 0  # leaves the group: its partitions move back to a
    time.sleep(4)
    b = h.start_worker()  # joins again: partitions move once more
    feeder.join(120)
    assert_matches_reference(h)
    assert b.stop() == 0
    assert a.stop() == 0


@pytest.mark.parametrize("runtime", ["faust", "batch"])
def test_every_compression_codec_is_read(harness, runtime: str) -> None:
    """Producers pick their own compression: one codec per source partition here."""
    codecs = ["gzip", "snappy", "lz4", "zstd"]
    h = harness(partitions=len(codecs), runtime=runtime)
    producers = [Producer({"bootstrap.servers": h.bootstrap, "compression.type": c, "linger.ms": 20})
                 for c in codecs]
    for key, value, ts in h.make_events(20_000, seed=21):
        p = zlib.crc32(key) % len(codecs)
        producers[p].produce(h.topology.source_topic, key=key, value=value, timestamp=ts, partition=p)
        producers[p].poll(0)
    for pr in producers:
        assert pr.flush(30) == 0
    worker = h.start_worker()
    assert_matches_reference(h)
    assert worker.stop() == 0
    assert "Traceback" not in worker.log()


def test_bad_records_go_to_the_dead_letter_topic_and_touch_nothing(harness) -> None:
    h = harness(partitions=2)
    clean = h.make_events(8_000, seed=13)
    rnd = random.Random(4)
    kinds = [b"{not json", b"\xff\xfe\xfd", b"[1,2]", b'"bad"', b"{}", b'{"outcome":"worst"}',
             b'{"outcome":1}', b'{"outcome":null}', b'{"outcome":NaN}', b"", None]
    mixed, bad_n = [], 0
    for ev in clean:
        mixed.append(ev)
        if rnd.random() < 0.125 and bad_n < 1000:
            key, _, ts = ev
            mixed.append((key, kinds[bad_n % len(kinds)], ts))
            bad_n += 1
    while bad_n < 1000:
        mixed.append((b"user-1", kinds[bad_n % len(kinds)], clean[-1][2]))
        bad_n += 1
    # Same partition for a key in both runs: route by key explicitly.
    part = lambda i, key: (sum(key) % 2)  # noqa: E731
    h.produce(mixed, partition_of=part)
    w = h.start_worker()
    h.wait_caught_up()
    assert w.stop() == 0
    dead = h.read_all(h.topology.outputs["dead_letters"])
    assert len(dead) == 1000
    reasons = {json.loads(m.value())["reason"].split(":")[0] for m in dead}
    assert len(reasons) >= 5
    assert all(json.loads(m.value())["source"]["topic"] == h.topology.source_topic for m in dead)
    # State equals a reference over the clean records alone.
    recs = h.source_records()
    clean_recs = {p: [r for r in rs if r.value in (b'{"outcome":"bad"}', b'{"outcome":"good"}') and r.key]
                  for p, rs in recs.items()}
    ref = h.reference(clean_recs)
    state = h.final_state()
    for p in range(2):
        assert state[p] == ref[p]["sketch"]


def test_corrupt_or_foreign_snapshots_are_refused_and_recovery_falls_back(harness) -> None:
    h = harness(partitions=2)
    events = h.make_events(10_000, seed=14)
    h.produce(events)
    w = h.start_worker()
    h.wait_caught_up()
    assert w.stop() == 0
    ref = h.reference()
    store = h.store()
    op_id = h.topology.operator_id
    good = store.restore(op_id, 0)
    assert good.blob is not None
    # Partition 0: a bit-flipped newest snapshot -> the previous (good) generation is used.
    flipped = bytearray(good.blob)
    flipped[len(flipped) // 2] ^= 0x01
    store.write(op_id, 0, bytes(flipped), next_offset=good.ref.next_offset, watermark=good.ref.watermark,
                fingerprint=good.ref.fingerprint, source_topic=h.topology.source_topic,
                partition_count=2)
    # Partition 1: two snapshots under other state-shaping settings -> with reset_state, a full replay.
    from grudge_stream.topology import Settings, load_topology

    foreign = load_topology("abuse_scores", Settings({**h.overrides, "cells_per_level": "4000"}, environ={}))
    fop = foreign.make_operator(1)
    fop.process(h.source_records()[1][:100])
    for _ in range(2):
        store.write(op_id, 1, fop.snapshot(), next_offset=fop.next_offset, watermark=fop.watermark,
                    fingerprint=fop.fingerprint, source_topic=h.topology.source_topic, partition_count=2)
    w = h.start_worker(reset_state="true")
    deadline = time.monotonic() + 60
    wanted = ("checksum", "settings that shape the state differ", "replaying from the earliest retained offset")
    while time.monotonic() < deadline and not all(s in w.log() for s in wanted):
        time.sleep(0.5)
    log = w.log()
    assert "refusing snapshot generation" in log and "checksum" in log
    assert "cells_per_level: 4000 in the snapshot, 5000 now" in log and "reset_state: dropping" in log
    assert "replaying from the earliest retained offset" in log
    time.sleep(3)  # let the replayed partition write a fresh snapshot
    state_deadline = time.monotonic() + 60
    while True:
        state = h.final_state()
        if all(state[p] == ref[p]["sketch"] for p in range(2)) or time.monotonic() > state_deadline:
            break
        time.sleep(1)
    assert w.stop() == 0
    for p in range(2):
        assert state[p] == ref[p]["sketch"]


def test_event_time_makes_processing_speed_irrelevant(harness) -> None:
    part = lambda i, key: (sum(key) % 2)  # noqa: E731
    fast = harness(partitions=2)
    events = fast.make_events(20_000, seed=15)  # the same timestamps for both runs
    fast.produce(events, partition_of=part)
    w = fast.start_worker()
    fast.wait_caught_up()
    assert w.stop() == 0
    slow = harness(partitions=2, operator_id=fast.overrides["operator_id"], seed=fast.overrides["seed"])
    w = slow.start_worker()
    for i in range(0, len(events), 2000):
        slow.produce(events[i:i + 2000], partition_of=lambda j, key: sum(key) % 2)
        time.sleep(0.7)
    slow.wait_caught_up()
    assert w.stop() == 0
    assert fast.final_state() == slow.final_state()
    assert fast.alert_ids() == slow.alert_ids()
