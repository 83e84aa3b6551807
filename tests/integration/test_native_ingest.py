"""The native ingest kernel (grudge_stream._cyext._native) against a real broker: the records
of split partitions arrive as columns and never on the consumer queue, errors and rebalances
still do; seeks land in the split queues; the position librdkafka keeps follows the records."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from grudge_stream.runtime import native

pytestmark = [pytest.mark.kafka,
              pytest.mark.skipif(native.unavailable() is not None, reason=f"native ingest: {native.unavailable()}")]


def _topic(bs: str, partitions: int, n: int) -> tuple[str, list[tuple[int, bytes, bytes, int]]]:
    topic = f"native-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bs, "linger.ms": 20})
    sent = []
    t0 = int(time.time() * 1000) - 60_000
    for i in range(n):
        part = i % partitions
        key = None if i % 97 == 0 else b"k%d" % i
        value = None if i % 89 == 0 else (b"" if i % 83 == 0 else b"v%d" % i)
        p.produce(topic, key=key, value=value, partition=part, timestamp=t0 + i)
        sent.append((part, key, value, t0 + i))
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    return topic, sent


def _consumer(bs: str, **extra) -> Consumer:
    return Consumer({"bootstrap.servers": bs, "group.id": f"native-{uuid.uuid4().hex[:8]}",
                     "enable.auto.commit": False, "enable.auto.offset.store": False,
                     "auto.offset.reset": "earliest", "enable.partition.eof": True, **extra})


def _drain(c: Consumer, r: native.NativeReader, n: int, deadline_s: float = 60.0, arrays: bool = False):
    got: dict[int, list] = {}
    eofs: set[int] = set()
    strays = 0
    end = time.monotonic() + deadline_s
    while sum(len(v[0]) for v in got.values()) < n and time.monotonic() < end:
        msgs = c.consume(500, timeout=0)
        strays += sum(1 for m in msgs if m.error() is None)
        groups, errors, count = r.fetch.fetch(500, 50, False, arrays)
        for p, code, _ in errors:
            assert code == r._eof
            eofs.add(p)
        for p, cols in groups.items():
            if arrays:
                assert [type(c).__name__ for c in cols] == ["array", "array", "list", "list"]
                assert cols[0].typecode == cols[1].typecode == "q"
                assert len({len(c) for c in cols}) == 1
            have = got.setdefault(p, ([], [], [], []))
            for a, b in zip(have, cols):
                a.extend(b)
    return got, eofs, strays


def test_subscribed_records_come_as_columns_and_never_on_the_consumer_queue(kafka_bootstrap) -> None:
    topic, sent = _topic(kafka_bootstrap, 3, 30_000)
    c = _consumer(kafka_bootstrap)
    r = native.NativeReader(c, topic, 500)
    assigned = []

    def on_assign(consumer, parts):
        r.split([tp.partition for tp in parts])  # before the assignment
        consumer.assign(parts)
        assigned.extend(tp.partition for tp in parts)

    def on_revoke(consumer, parts):
        consumer.unassign()
        r.release([tp.partition for tp in parts])

    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    got, eofs, strays = _drain(c, r, len(sent))
    assert sorted(assigned) == [0, 1, 2]
    assert strays == 0, "a split partition's record came through the consumer queue"
    for p in range(3):
        offs, tss, keys, vals = got[p]
        mine = [s for s in sent if s[0] == p]
        assert offs == list(range(len(mine)))
        assert tss == [s[3] for s in mine]
        assert keys == [s[1] for s in mine]
        assert vals == [s[2] for s in mine]
    # The end of each partition came as an error record of its own queue.
    end = time.monotonic() + 10
    while eofs != {0, 1, 2} and time.monotonic() < end:
        eofs |= {p for p, _, _ in r.fetch.fetch(100, 100)[1]}
    assert eofs == {0, 1, 2}
    # The position librdkafka keeps follows the records handed out. (librdkafka 2.12 moves it
    # one further past the end-of-partition event, 2.16 does not; the worker never reads it:
    # it commits and seeks explicit offsets.)
    pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in range(3)])}
    assert all(len(got[p][0]) <= pos[p] <= len(got[p][0]) + 1 for p in range(3)), pos
    # A seek lands in the split queue: the records from there come again.
    c.seek(TopicPartition(topic, 1, 5))
    again, _, strays = _drain(c, r, len(got[1][0]) - 5, 30)
    assert strays == 0
    assert again[1][0] == list(range(5, len(got[1][0])))
    assert set(again) == {1}
    r.close()
    c.close()


def test_the_array_columns_hold_the_same_records(kafka_bootstrap) -> None:
    """fetch(..., arrays=True): offsets and timestamps as array('q'), the same records as the
    lists give, partitions interleaved in one fetch; a payload repeated over records is one
    object (the fetcher remembers the last few small ones), and never mixed up with another."""
    topic = f"native-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    sent = []
    t0 = int(time.time() * 1000) - 60_000
    payloads = [b'{"outcome":"good"}', b'{"outcome":"bad"}', b"x" * 300, b"", None, b"v", b"w", b"y", b"z"]
    for i in range(20_000):
        part = (i * 7) % 3
        value = payloads[0] if i % 5 else payloads[(i // 5) % len(payloads)]  # one common, 8 others
        key = None if i % 101 == 0 else b"k%d" % (i % 500)
        p.produce(topic, key=key, value=value, partition=part, timestamp=t0 + i)
        sent.append((part, key, value, t0 + i))
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    c = _consumer(kafka_bootstrap)
    r = native.NativeReader(c, topic, 500)
    r.split([0, 1, 2])
    c.assign([TopicPartition(topic, q, 0) for q in range(3)])
    got, _, strays = _drain(c, r, len(sent), arrays=True)
    assert strays == 0
    for q in range(3):
        offs, tss, keys, vals = got[q]
        mine = [s for s in sent if s[0] == q]
        assert offs == list(range(len(mine)))
        assert tss == [s[3] for s in mine]
        assert keys == [s[1] for s in mine]
        assert vals == [s[2] for s in mine]
    good = [v for q in range(3) for v in got[q][3] if v == payloads[0]]
    assert len(good) > 100 and len({id(v) for v in good}) < len(good) / 10
    r.close()
    c.close()


def test_a_fetcher_closed_before_its_consumer_touches_nothing_after(kafka_bootstrap) -> None:
    topic, sent = _topic(kafka_bootstrap, 2, 2_000)
    c = _consumer(kafka_bootstrap)
    r = native.NativeReader(c, topic, 100)
    r.split([0, 1])
    c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    got, _, strays = _drain(c, r, len(sent))
    assert strays == 0 and sum(len(v[0]) for v in got.values()) == len(sent)
    r.close()
    r.release([0])  # nothing left to release
    with pytest.raises(RuntimeError):
        r.fetch.fetch(10, 0)
    c.unassign()
    c.close()
    r.close()


@pytest.mark.parametrize("log_append", [False, True], ids=["create-time", "log-append-time"])
def test_the_headers_mode_gives_each_records_headers_and_timestamp_type(kafka_bootstrap, log_append) -> None:
    """fetch(..., headers=True): per partition, the four columns plus each record's headers as
    confluent-kafka's Message.headers() gives them (None without any; a header's None value
    kept) and its timestamp type, as Message.timestamp()[0]."""
    topic = f"native-h-{uuid.uuid4().hex[:8]}"
    config = {"message.timestamp.type": "LogAppendTime"} if log_append else {}
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1, config=config)])[topic].result(30)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    t0 = int(time.time() * 1000) - 60_000
    headers = [
        [("trace", b"abc"), ("none", None), ("empty", b""), ("trace", b"again")],
        None,
        [("naïve", b"\x00\xff")],
    ]
    for i in range(300):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2, timestamp=t0 + i,
                  headers=headers[i % 3])
    assert p.flush(30) == 0
    # What confluent-kafka's messages say of the same records.
    c = _consumer(kafka_bootstrap, **{"enable.partition.eof": False})
    c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    want: dict[int, list] = {0: [], 1: []}
    end = time.monotonic() + 30
    while sum(map(len, want.values())) < 300 and time.monotonic() < end:
        for m in c.consume(300, timeout=0.5):
            assert m.error() is None
            want[m.partition()].append((m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers(),
                                        m.timestamp()[0]))
    c.close()
    c = _consumer(kafka_bootstrap, **{"enable.partition.eof": False})
    r = native.NativeReader(c, topic, 500)
    r.split([0, 1])
    c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    got: dict[int, list] = {0: [], 1: []}
    end = time.monotonic() + 30
    while sum(map(len, got.values())) < 300 and time.monotonic() < end:
        assert not [m for m in c.consume(100, timeout=0) if m.error() is None]
        groups, errors, count = r.fetch.fetch(500, 100, headers=True)
        assert errors == []
        for part, cols in groups.items():
            assert len(cols) == 6 and count >= len(cols[0])
            got[part].extend(zip(*cols))
    r.close()
    c.close()
    assert got == want
    rows = got[0] + got[1]
    assert {h is None for *_, h, _ in rows} == {True, False}
    assert any(h and ("none", None) in h for *_, h, _ in rows)
    assert {tt for *_, tt in rows} == {2 if log_append else 1}
    # The plain mode of the same kernel: four columns, no headers.
    c = _consumer(kafka_bootstrap, **{"enable.partition.eof": False})
    r = native.NativeReader(c, topic, 500)
    r.split([0])
    c.assign([TopicPartition(topic, 0, 0)])
    end = time.monotonic() + 30
    plain: list = []
    while len(plain) < 150 and time.monotonic() < end:
        groups, _, _ = r.fetch.fetch(500, 100)
        for cols in groups.values():
            assert len(cols) == 4
            plain.extend(zip(*cols))
    r.close()
    c.close()
    assert plain == [row[:4] for row in want[0]]
