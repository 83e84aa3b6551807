"""Live score queries, without a broker: the key partitioners against known vectors, the
read-only key reads of the operators, and the request handling of ``ScoreQueries``."""
from __future__ import annotations

import json
import random
import zlib

import pytest
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from grudge_stream.exceptions import ConfigError
from grudge_stream.operators.records import SourceRecord
from grudge_stream.serving import (FORWARDED_HEADER, ScoreQueries, murmur2, parse_body, parse_query,
                                   partition_for)
from grudge_stream.topology import Settings, load_topology

# librdkafka's rdmurmur2.c unit test: Java's Utils.murmur2 of these keys (as unsigned ints).
JAVA_MURMUR2 = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"234": 0xE7C009CA,
    b"": 0x106E08D9,
}
# kafka-python's test_murmur2_java_compatibility: the partition among 1000 that Java's
# DefaultPartitioner picks.
JAVA_PARTITION_OF_1000 = {b"": 681, b"a": 524, b"ab": 434, b"abc": 107, b"123456789": 566, b"\x00 ": 742}


def test_murmur2_matches_the_java_client_partitions() -> None:
    for key, want in JAVA_PARTITION_OF_1000.items():
        assert partition_for(key, 1000, "murmur2") == want, key


def test_murmur2_matches_aiokafka_on_every_tail_and_random_keys() -> None:
    rnd = random.Random(13)
    keys = [rnd.randbytes(n) for n in range(40)] + [rnd.randbytes(rnd.randint(0, 300)) for _ in range(2000)]
    for key in keys:
        assert murmur2(key) == aiokafka_murmur2(key) & 0xFFFFFFFF, key


def test_murmur2_librdkafka_vectors() -> None:
    for key, want in JAVA_MURMUR2.items():
        assert murmur2(key) == want, key


def test_crc32_partitioner_is_librdkafka_consistent() -> None:
    for key in (b"a", b"user-17", bytes(range(256))):
        assert partition_for(key, 7, "crc32") == zlib.crc32(key) % 7
    with pytest.raises(ConfigError):
        partition_for(b"a", 4, "fnv")


def test_partition_is_positive_even_when_the_hash_has_its_top_bit_set() -> None:
    top = [k for k in (f"k{i}".encode() for i in range(200)) if murmur2(k) & 0x80000000]
    assert top
    for k in top:
        assert partition_for(k, 3) == (murmur2(k) & 0x7FFFFFFF) % 3


# -- requests ------------------------------------------------------------------------------------

def test_parse_query_and_body() -> None:
    keys, fwd = parse_query("key=a&key=%C3%A9&key_b64=/w==&forward=0")
    assert keys == [b"a", "é".encode(), b"\xff"] and fwd is False
    assert parse_body(b'["x", "y"]') == [b"x", b"y"]
    assert parse_body(b'{"keys": ["x"], "keys_b64": ["AA=="]}') == [b"x", b"\x00"]


def _abuse_operator(partition: int):
    topo = load_topology("abuse_scores", Settings({"insecure_public_seed": "true", "cells_per_level": "2000"},
                                                  environ={}))
    op = topo.make_operator(partition)
    rnd = random.Random(partition)
    t = 1_700_000_000_000
    recs = []
    for off in range(3000):
        t += rnd.randint(0, 30)
        key = f"abuser-{rnd.randrange(4)}" if rnd.random() < 0.3 else f"user-{rnd.randrange(300)}"
        bad = rnd.random() < (0.9 if key.startswith("abuser") else 0.05)
        recs.append(SourceRecord(topo.source_topic, partition, off, t, key.encode(),
                                 b'{"outcome":"bad"}' if bad else b'{"outcome":"good"}'))
    op.process(recs)
    return op


def test_describe_key_reads_without_writing_and_equals_query_detailed() -> None:
    op = _abuse_operator(0)
    before = op.snapshot()
    keys = [f"abuser-{i}".encode() for i in range(4)] + [f"user-{i}".encode() for i in range(50)] + [b"never"]
    answers = [op.describe_key(k, debug=True) for k in keys]
    plain = [op.describe_key(k) for k in keys]
    assert op.snapshot() == before  # bit for bit: nothing written back
    assert any(a["raised"] for a in answers)
    twin = _abuse_operator(0)  # the same records: its kernel reads (which write) are the reference
    for k, a, p in zip(keys, answers, plain):
        want = twin.sketch.query_detailed(k, twin.watermark)
        assert a["score"] == want["score"] == p["score"]
        assert a["detail"]["punishment"] == want["punishment"]
        assert a["detail"]["forgiveness"] == want["forgiveness"]
        assert a["detail"]["cell_indexes"] == want["cell_indexes"]
        assert a["raised"] == p["raised"] == (k in op.latch)
        assert "detail" not in p  # the default answer: the score and its verdict only


class _Slot:
    def __init__(self, op, partition: int, n: int) -> None:
        self.operator, self.partition, self.partition_count = op, partition, n
        self.snapshotted_offset, self.restore_mode = None, "fresh"
        import threading
        self.lock = threading.Lock()


def test_queries_answer_local_partitions_and_refuse_others_with_503() -> None:
    n = 4
    ops = {0: _abuse_operator(0)}
    slots = {0: _Slot(ops[0], 0, n)}
    q = ScoreQueries(slots.get, lambda: n)
    local = next(k for k in (f"user-{i}".encode() for i in range(300)) if partition_for(k, n) == 0)
    other = next(k for k in (f"user-{i}".encode() for i in range(300)) if partition_for(k, n) != 0)
    status, doc, headers = q.handle("GET", "/v1/score", f"key={local.decode()}", b"", {})
    assert status == 200 and doc["partition"] == 0 and doc["key"] == local.decode()
    assert doc["score"] == _abuse_operator(0).sketch.query_detailed(local, ops[0].watermark)["score"]
    status, doc, headers = q.handle("GET", "/v1/score", f"key={other.decode()}", b"", {FORWARDED_HEADER: "x"})
    assert status == 503 and doc["error"] == "not_owner" and headers["Retry-After"]
    status, doc, headers = q.handle("GET", "/v1/score", f"key={other.decode()}", b"", {})
    assert status == 503 and doc["error"] == "owner_unknown"  # no directory
    status, doc, _ = q.handle("POST", "/v1/scores", "", json.dumps([local.decode(), other.decode()]).encode(), {})
    assert status == 200 and [bool(r.get("error")) for r in doc["results"]] == [False, True]
    assert q.handle("GET", "/v1/score", "", b"", {})[0] == 400


class _CountingLock:
    """A slot lock that counts its acquisitions."""

    def __init__(self) -> None:
        import threading
        self.inner, self.acquired = threading.Lock(), 0

    def acquire(self, blocking: bool = True) -> bool:
        self.acquired += 1
        return self.inner.acquire(blocking)

    def release(self) -> None:
        self.inner.release()


def test_a_many_key_request_takes_each_slot_lock_once_and_keeps_key_order() -> None:
    n = 2
    slots = {p: _Slot(_abuse_operator(p), p, n) for p in range(n)}
    for s in slots.values():
        s.lock = _CountingLock()
    q = ScoreQueries(slots.get, lambda: n)
    keys = [f"user-{i}" for i in range(200)]
    status, doc, _ = q.handle("POST", "/v1/scores", "", json.dumps(keys).encode(), {})
    assert status == 200
    assert [r["key"] for r in doc["results"]] == keys
    assert [r["partition"] for r in doc["results"]] == [partition_for(k.encode(), n) for k in keys]
    assert {p: s.lock.acquired for p, s in slots.items()} == {0: 1, 1: 1}


def test_a_partition_revoked_between_routing_and_reading_is_an_error_not_a_wrong_answer() -> None:
    n = 2
    slots = {p: _Slot(_abuse_operator(p), p, n) for p in range(n)}
    q = ScoreQueries(slots.get, lambda: n)
    keys = [f"user-{i}".encode() for i in range(40)]
    results: list = [None] * len(keys)
    local: dict = {}
    remote: dict = {}
    assert q.route(keys, True, 0, len(keys), results, local, remote) == n
    assert sorted(local) == [0, 1] and not remote and results == [None] * len(keys)
    del slots[1]  # revoked while the request was in flight
    q.read_local(keys, n, local, results)
    for k, r in zip(keys, results):
        if partition_for(k, n) == 1:
            assert r["error"] == "owner_unknown" and r["partition"] == 1 and "score" not in r
        else:
            assert "error" not in r and r["partition"] == 0


def test_members_directory_newest_claim_wins_and_tombstones_remove() -> None:
    from grudge_stream.serving import MembersDirectory

    d = MembersDirectory("unused:9092", "app", "me", "http://me:1")
    rec = lambda mid, parts, ts: json.dumps({"member": mid, "url": f"http://{mid}:1", "partitions": parts,  # noqa: E731
                                             "partition_count": 4, "timestamp_ms": ts}).encode()
    d._apply(b"me", rec("me", [0, 1], 50))
    d._apply(b"old", rec("old", [2, 3], 10))
    d._apply(b"new", rec("new", [3], 20))
    assert d.owner(0) is None  # our own claim is never a forward target
    assert d.owner(2)["member"] == "old" and d.owner(3)["member"] == "new"
    d._apply(b"new", rec("new", [1], 5))  # an older record of a member never replaces a newer one
    assert d.owner(3)["member"] == "new"
    d._apply(b"new", None)
    assert d.owner(3)["member"] == "old" and d.partition_count() == 4


@pytest.mark.parametrize("name,value,check", [
    ("heavy_hitters", b"1", lambda a: a["estimate"] >= 5 and a["raised"] in (True, False)),
    ("rate_limit", b'{"cost": 1}', lambda a: 0 < a["level"] <= a["burst"]
     and a["tokens_available"] == max(0.0, a["burst"] - a["level"])),
    ("dedup", b"x", lambda a: a["seen"] is True),
    ("known_keys", b'{"event": "accepted"}', lambda a: a["known"] is True),
])
def test_every_keyed_operator_describes_a_key_without_writing(name, value, check) -> None:
    topo = load_topology(name, Settings({"insecure_public_seed": "true"}, environ={}))
    op = topo.make_operator(0)
    t = 1_700_000_000_000
    op.process([SourceRecord(topo.source_topic, 0, i, t + i, b"hot", value) for i in range(5)])
    before = op.snapshot()
    got = op.describe_key(b"hot")
    assert got["kind"] == op.kind and check(got), got
    cold = op.describe_key(b"cold")
    assert cold.get("seen", False) is False and cold.get("estimate", 0) == 0
    assert op.snapshot() == before


def test_partitioner_check_counts_mismatches_and_says_so_in_answers(caplog) -> None:
    from grudge_stream.metrics import Metrics
    from grudge_stream.serving import PartitionerCheck

    n = 4
    keys = [f"user-{i}".encode() for i in range(400)]
    crc = {p: [k for k in keys if zlib.crc32(k) % n == p] for p in range(n)}
    m = Metrics()
    check = PartitionerCheck("murmur2", "events", m)
    assert check.status() == "unverified"
    right = [k for k in keys if partition_for(k, n) == 1]
    check.check(1, n, right + [b""])  # empty keys are skipped
    assert check.status() == "verified" and check.checked == PartitionerCheck.SAMPLE
    with caplog.at_level("WARNING"):
        for p in range(n):
            check.check(p, n, crc[p])
            check.check(p, n, crc[p])
    assert check.status() == "mismatched" and check.mismatched > 0 and check.other_matches == check.mismatched
    assert caplog.text.count("key_partitioner=murmur2 puts") == 1 and "key_partitioner=crc32" in caplog.text
    assert sum(m.registry.get_sample_value("grudge_partitioner_mismatches_total", {"partition": str(p)}) or 0
               for p in range(n)) == check.mismatched
    ops = {0: _abuse_operator(0)}
    q = ScoreQueries({0: _Slot(ops[0], 0, n)}.get, lambda: n)
    local = next(k for k in keys if partition_for(k, n) == 0)
    assert "partitioner_check" not in q.handle("GET", "/v1/score", f"key={local.decode()}", b"", {})[1]
    q.partitioner_check = check
    assert q.handle("GET", "/v1/score", f"key={local.decode()}", b"", {})[1]["partitioner_check"] == "mismatched"
