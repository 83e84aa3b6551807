"""CheckpointStore.write_many against the real broker: rounds of several partitions."""
from __future__ import annotations

import os
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from grudge_stream.checkpoint import SNAPSHOT_TOPIC_CONFIG, CheckpointStore, SnapshotWrite
from grudge_stream.exceptions import CheckpointError

pytestmark = pytest.mark.kafka


def snapshot_topic(bootstrap: str, **config: str) -> str:
    topic = f"ckpt-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 4, 1, config={**SNAPSHOT_TOPIC_CONFIG, **config})])[topic].result(30)
    return topic


def write(op: str, p: int, blob: bytes, next_offset: int) -> SnapshotWrite:
    return SnapshotWrite(op, p, blob, next_offset, 1_000 + next_offset, "fp", "events", 4)


def refuse_generation_2(ref, blob) -> None:
    if ref.generation == 2:
        raise ValueError("refused by the test")


def test_a_round_writes_every_partition_and_keeps_the_previous_generation(kafka_bootstrap) -> None:
    topic = snapshot_topic(kafka_bootstrap)
    store = CheckpointStore(kafka_bootstrap, topic, chunk_bytes=4096)
    first = {p: os.urandom(10_000 + 3_000 * p) for p in range(4)}  # 3..6 chunks each
    served: list[int] = []

    def lazily(blobs: dict[int, bytes], next_offset: int):
        for p, blob in blobs.items():
            served.append(p)
            yield write("op", p, blob, next_offset)

    refs = store.write_many(lazily(first, 100))
    assert served == [0, 1, 2, 3]
    assert [r.generation for r in refs] == [1, 1, 1, 1]
    assert [len(r.offsets) for r in refs] == [3, 4, 4, 5]
    second = {p: os.urandom(5_000) for p in range(4)}
    refs2 = store.write_many(lazily(second, 200))
    assert [r.generation for r in refs2] == [2, 2, 2, 2]
    assert all(a.slot != b.slot for a, b in zip(refs, refs2)), "a round must not overwrite the last good slot"

    fresh = CheckpointStore(kafka_bootstrap, topic)
    for p in range(4):
        got = fresh.restore("op", p)
        assert got.blob == second[p] and got.ref.next_offset == 200 and got.ref.watermark == 1_200
        m = fresh.read_manifest("op", p)
        assert m.previous is not None and m.previous.generation == 1 and m.previous.next_offset == 100
        # The previous generation is intact: refusing the newest falls back to it.
        back = fresh.restore("op", p, accept=refuse_generation_2)
        assert back.blob == first[p] and back.refused and back.refused[0][0] == 2


def test_a_failed_partition_does_not_stop_the_others(kafka_bootstrap) -> None:
    # The broker refuses records over 20 kB: a 64 kB chunk of partition 1 cannot land.
    topic = snapshot_topic(kafka_bootstrap, **{"max.message.bytes": "20000"})
    store = CheckpointStore(kafka_bootstrap, topic, chunk_bytes=64 * 1024)
    base = {p: os.urandom(2_000) for p in range(3)}
    store.write_many(write("op", p, b, 10) for p, b in base.items())
    nxt = {0: os.urandom(3_000), 1: os.urandom(60_000), 2: os.urandom(3_000)}
    with pytest.raises(CheckpointError, match=r"op\[1\]"):
        store.write_many(write("op", p, b, 20) for p, b in nxt.items())
    fresh = CheckpointStore(kafka_bootstrap, topic)
    assert fresh.restore("op", 0).blob == nxt[0]
    assert fresh.restore("op", 2).blob == nxt[2]
    kept = fresh.restore("op", 1)
    assert kept.blob == base[1] and kept.ref.generation == 1 and kept.ref.next_offset == 10
    # The store did not count the failed generation: the next round is generation 2 for p1.
    ref = store.write_many([write("op", 1, os.urandom(3_000), 30)])[0]
    assert ref.generation == 2 and fresh.restore("op", 1).ref.next_offset == 30
