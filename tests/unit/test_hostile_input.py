"""Hostile input without a broker: skewed clocks, late and empty keys, oversized fields,
and the secret hash key (framing, snapshots that never hold the key)."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import secrets

import pytest

from grudge_stream import ConfigError, Exponential, MismatchError, ScoreSketch
from grudge_stream.hashing import level_indexes
from grudge_stream.hashkey import HashKey
from grudge_stream.operators import EventCodec, SourceRecord
from grudge_stream.operators.deadletters import dead_letter_record
from grudge_stream.operators.scores import FeedbackScoreOperator
from grudge_stream.topology import Settings, load_topology

TOPIC = "events"
NOW = 1_764_000_000_000  # processing time of these tests (ms)
SKETCH = {"levels": 4, "cells_per_level": 5_000, "decay": {"kind": "exponential", "lambda_per_s": 0.01},
          "lo": 0.0, "hi": 1.0, "aggregator": "min", "hasher": "siphash"}
CODEC = EventCodec(value_field="outcome", outcomes={"bad": 0.04, "good": -0.001}, allow_numbers=False,
                   max_key_bytes=1024)
BAD, GOOD = b'{"outcome":"bad"}', b'{"outcome":"good"}'


def op_(**kw) -> FeedbackScoreOperator:
    args = dict(operator_id="abuse", source_topic=TOPIC, partition=0, sketch=SKETCH, codec=CODEC,
                raise_at=0.5, clear_at=0.25, sweep_interval_ms=10_000, emit_scores="crossings")
    args.update(kw)
    return FeedbackScoreOperator(**args)


def raised(out) -> set[str]:
    return {json.loads(o.value)["key"] for o in out if o.role == "alerts" and json.loads(o.value)["state"] == "raised"}


def skew_stream() -> list[SourceRecord]:
    recs, off = [], 0
    t = NOW - 10_000
    for _ in range(30):
        recs.append(SourceRecord(TOPIC, 0, off, t, b"attacker-a", BAD))
        off, t = off + 1, t + 100
    recs.append(SourceRecord(TOPIC, 0, off, NOW + 59 * 60_000, b"skewed-clock", GOOD))
    off += 1
    for _ in range(30):
        recs.append(SourceRecord(TOPIC, 0, off, t, b"attacker-b", BAD))
        off, t = off + 1, t + 100
    return recs


@pytest.mark.parametrize("columns", [False, True])
def test_one_record_an_hour_ahead_does_not_blind_detection(columns: bool) -> None:
    recs = skew_stream()
    op = op_()
    if columns:
        out = op.process_columns(TOPIC, 0, [r.offset for r in recs], [r.timestamp_ms for r in recs],
                                 [r.key for r in recs], [r.value for r in recs], processing_ms=NOW)
    else:
        out = op.process(recs, processing_ms=NOW)
    assert raised(out) == {"attacker-a", "attacker-b"}
    assert op.counters["future_clamped"] == 1
    assert op.watermark == NOW - 10_000 + 29 * 100 + 30 * 100  # the skewed record moved no clock
    assert op.max_future_ms == 5_000  # 5% of the 100 s decay time constant
    # Without the bound the same stream hides attacker B (the test could fail).
    blind = op_(max_future_ms=None)
    assert raised(blind.process(recs, processing_ms=NOW)) == {"attacker-a"}


def test_future_dead_letter_policy_and_late_policies() -> None:
    recs = skew_stream()
    op = op_(future_policy="dead_letter")
    out = op.process(recs, processing_ms=NOW)
    dead = [json.loads(o.value) for o in out if o.role == "dead_letters"]
    assert [d["source"]["offset"] for d in dead] == [30] and "ahead of processing time" in dead[0]["reason"]
    assert raised(out) == {"attacker-a", "attacker-b"}
    ancient = [SourceRecord(TOPIC, 0, 100, NOW, b"k", BAD), SourceRecord(TOPIC, 0, 101, 0, b"k", BAD),
               SourceRecord(TOPIC, 0, 102, NOW - 365 * 86_400_000, b"k", BAD),
               SourceRecord(TOPIC, 0, 103, NOW - 1000, b"k", BAD)]
    op = op_()
    out = op.process(ancient, processing_ms=NOW)
    dead = [json.loads(o.value) for o in out if o.role == "dead_letters"]
    assert [d["source"]["offset"] for d in dead] == [101, 102]
    assert all("behind the partition's watermark" in d["reason"] for d in dead)
    assert op.counters["late_dropped"] == 2 and op.counters["events"] == 2 and op.counters["late"] == 1
    op = op_(late_policy="count")
    out = op.process(ancient, processing_ms=NOW)
    assert not [o for o in out if o.role == "dead_letters"]
    assert op.counters["late_dropped"] == 2 and op.next_offset == 104


def test_empty_keys_are_dead_lettered_unless_allowed() -> None:
    recs = [SourceRecord(TOPIC, 0, i, NOW, b"", BAD) for i in range(3)]
    op = op_()
    out = op.process(recs, processing_ms=NOW)
    assert [json.loads(o.value)["reason"] for o in out] == ["empty key (allow_empty_keys is off)"] * 3
    op2 = op_(codec=EventCodec(value_field="outcome", outcomes={"bad": 0.04}, allow_empty_keys=True))
    assert not [o for o in op2.process(recs, processing_ms=NOW) if o.role == "dead_letters"]
    assert op2.counters["events"] == 3


def hostile_mix(n: int = 400) -> list[SourceRecord]:
    import random

    rnd = random.Random(5)
    out = []
    t = NOW - 60_000
    for i in range(n):
        t += rnd.randint(0, 50)
        r = rnd.random()
        key, val, ts = f"user-{rnd.randrange(40)}".encode(), BAD if rnd.random() < 0.3 else GOOD, t
        if r < 0.04:
            ts = NOW + rnd.randint(1, 3_600_000)
        elif r < 0.08:
            ts = rnd.choice([0, 1, NOW - 86_400_000, t - rnd.randint(0, 3_000_000)])
        elif r < 0.10:
            key = b""
        elif r < 0.12:
            key = b"k" * rnd.choice([1025, 450_000])
        elif r < 0.14:
            val = None
        elif r < 0.16:
            val = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64)))
        elif r < 0.17:
            key = None
        out.append(SourceRecord(TOPIC, 0, i, ts, key, val))
    return out


@pytest.mark.parametrize("policies", [{}, {"future_policy": "dead_letter", "late_policy": "count"}])
def test_column_path_equals_record_path_on_hostile_input(policies: dict) -> None:
    recs = hostile_mix()
    a, b = op_(**policies), op_(**policies)
    out_a = a.process(recs, processing_ms=NOW)
    out_b = []
    for i in range(0, len(recs), 37):
        part = recs[i:i + 37]
        out_b += b.process_columns(TOPIC, 0, [r.offset for r in part], [r.timestamp_ms for r in part],
                                   [r.key for r in part], [r.value for r in part], processing_ms=NOW)
    assert out_a == out_b
    assert a.snapshot() == b.snapshot()
    # every record ends exactly one way: applied, dead-lettered, or counted
    dead = {json.loads(o.value)["source"]["offset"] for o in out_a if o.role == "dead_letters"}
    c = a.counters
    counted_only = c["late_dropped"] if policies.get("late_policy") == "count" else 0
    assert c["events"] + c["dead_letters"] + counted_only == len(recs)
    assert len(dead) == c["dead_letters"]


def test_dead_letters_fit_the_limit_and_keep_length_and_digest() -> None:
    key, value = secrets.token_bytes(1_000_000), secrets.token_bytes(1_048_000)
    src = {"topic": "t", "partition": 3, "offset": 17, "timestamp_ms": NOW}
    for limit in (1_000_000, 300_000, 20_000):
        rec = dead_letter_record("op", "a reason", src, key, value, limit)
        assert len(rec.value) + len(rec.key) <= limit
        body = json.loads(rec.value)
        assert body["key_bytes"] == len(key) and body["key_sha256"] == hashlib.sha256(key).hexdigest()
        assert body["value_bytes"] == len(value) and body["value_sha256"] == hashlib.sha256(value).hexdigest()
        assert key.startswith(base64.b64decode(body["key_b64"]))
        assert value.startswith(base64.b64decode(body["value_b64"]))
        assert rec.key == b"sha256:" + hashlib.sha256(key).hexdigest().encode()
        assert body["source"] == src
    small = dead_letter_record("op", "r", src, b"abc", b"xyz")
    body = json.loads(small.value)
    assert small.key == b"abc" and body["key_b64"] == "YWJj" and "key_truncated" not in body


# -- the secret hash key ----------------------------------------------------------------------


def test_hash_key_forms() -> None:
    raw = secrets.token_bytes(16)
    forms = [raw.hex(), "0x" + raw.hex().upper(), base64.b64encode(raw).decode(),
             base64.urlsafe_b64encode(raw).decode().rstrip("="), f"  {raw.hex()}\n"]
    assert {HashKey.parse(f).material for f in forms} == {raw}
    long = HashKey.parse(secrets.token_hex(32))  # 256 bits of material, condensed
    assert len(long.material) == 16
    for bad in ["99", "12345678901234567890", "", "not a key!", base64.b64encode(b"x" * 8).decode()]:
        with pytest.raises(ConfigError):
            HashKey.parse(bad)
    # A hex key that is too short says how long it must be, not how many bits base64 made of it.
    for short in (raw.hex()[:24], raw.hex()[:16]):
        with pytest.raises(ConfigError, match=f"must be 32 hex digits .*not {len(short)}"):
            HashKey.parse(short)
    assert raw.hex() not in repr(HashKey(raw))
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(HashKey(raw))


TOPOLOGIES = ["abuse_scores", "rate_limit", "heavy_hitters", "dedup", "known_keys"]
SMALL_BY = {"abuse_scores": {"cells_per_level": "1000"}, "rate_limit": {"cells_per_level": "1000"},
            "heavy_hitters": {"width": "1024"}, "dedup": {"capacity": "1000"}, "known_keys": {"capacity": "1000"}}


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_topologies_refuse_to_start_without_a_secret_key(name: str, tmp_path, caplog) -> None:
    SMALL = SMALL_BY[name]
    with pytest.raises(ConfigError, match="GRUDGE_SEED"):
        load_topology(name, Settings(SMALL, environ={}))
    key = secrets.token_bytes(16)
    f = tmp_path / "seed"
    f.write_text(base64.b64encode(key).decode() + "\n")
    a = load_topology(name, Settings({**SMALL, "seed_file": str(f)}, environ={})).make_operator(0)
    b = load_topology(name, Settings(SMALL, environ={"GRUDGE_SEED": key.hex()})).make_operator(0)
    assert a.hash_key == b.hash_key and a.fingerprint == b.fingerprint
    with pytest.raises(ConfigError, match="seed_file"):
        load_topology(name, Settings({**SMALL, "seed_file": str(tmp_path / "missing")}, environ={}))
    with caplog.at_level(logging.WARNING):
        op = load_topology(name, Settings({**SMALL, "insecure_public_seed": "true"}, environ={})).make_operator(0)
    assert op.hash_key is None and "PUBLIC key" in caplog.text


SAMPLES = {
    "abuse_scores": BAD, "rate_limit": b'{"cost":1}', "heavy_hitters": b"x", "dedup": b"x",
    "known_keys": b'{"event":"accepted"}',
}


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_snapshots_never_hold_the_key_and_another_key_is_refused(name: str) -> None:
    SMALL = SMALL_BY[name]
    key = HashKey(secrets.token_bytes(16))
    topo = load_topology(name, Settings({**SMALL, "seed": key.material.hex()}, environ={}))
    op = topo.make_operator(0)
    op.process([SourceRecord(topo.source_topic, 0, i, NOW + i, f"client-{i % 7}".encode(), SAMPLES[name])
                for i in range(50)], processing_ms=NOW)
    blob = op.snapshot()
    k0, k1 = key.words
    for needle in (key.material, key.material.hex().encode(), key.material.hex().upper().encode(),
                   base64.b64encode(key.material), base64.b64encode(key.material).rstrip(b"="),
                   str(k0).encode(), str(k1).encode()):
        assert needle not in blob
    assert key.fingerprint.encode() in blob
    clone = topo.make_operator(0)
    clone.restore(blob)
    assert clone.snapshot() == blob
    other = load_topology(name, Settings({**SMALL, "seed": secrets.token_hex(16)}, environ={})).make_operator(0)
    with pytest.raises(MismatchError, match="another hash key"):
        other.restore(blob)


def framing_keys(victim: bytes, levels: int, cells: int) -> tuple[list[bytes], int]:
    """Keys that, under the PUBLIC hash key, cover every cell of ``victim``: what an attacker
    computes offline. Returns (keys, hash evaluations)."""
    public = ScoreSketch(levels=levels, cells_per_level=cells, decay=Exponential(0.01), hi=1.0, hasher="siphash")
    want = level_indexes(public.key_hash(victim), levels, cells)
    found: dict[int, bytes] = {}
    i = 0
    while len(found) < levels:
        k = f"attacker-{i}".encode()
        i += 1
        got = level_indexes(public.key_hash(k), levels, cells)
        for lvl in range(levels):
            if lvl not in found and got[lvl] == want[lvl]:
                found[lvl] = k
    return [found[lvl] for lvl in range(levels)], i


def test_framing_keys_from_the_public_key_frame_nobody_under_a_secret_key() -> None:
    keys, evaluations = framing_keys(b"innocent", 4, 5_000)
    assert evaluations < 200_000
    attack = []
    for r in range(15):
        for k in keys:
            attack.append((k, BAD))
    attack.append((b"innocent", GOOD))
    recs = [SourceRecord(TOPIC, 0, i, NOW - 5_000 + i, k, v) for i, (k, v) in enumerate(attack)]
    public = op_(hash_key=None)
    assert "innocent" in raised(public.process(recs, processing_ms=NOW))  # the attack works...
    secret = op_(hash_key=HashKey(secrets.token_bytes(16)))
    out = secret.process(recs, processing_ms=NOW)
    assert "innocent" not in raised(out)  # ...and not without the key
    assert secret.sketch.query(b"innocent", now_ms=secret.watermark) < 0.1


HOSTILE_VALUES = {"abuse_scores": [BAD, GOOD], "rate_limit": [b'{"cost":1}', b'{"cost":0.5}'],
                  "heavy_hitters": [b"x", b"y"], "dedup": [b"a", b"b"],
                  "known_keys": [b'{"event":"seen"}', b'{"event":"accepted"}']}


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_every_topology_accounts_for_every_hostile_record(name: str) -> None:
    """Big, empty and missing keys and values, garbage, skewed and ancient times: nothing
    raises, every record is applied or dead-lettered, and dead letters fit their limit."""
    import random

    rnd = random.Random(9)
    topo = load_topology(name, Settings({**SMALL_BY[name], "seed": secrets.token_hex(16)}, environ={}))
    op = topo.make_operator(0)
    op.dead_letter_limit = 50_000
    good = HOSTILE_VALUES[name]
    recs = []
    t = NOW - 60_000
    for i in range(600):
        t += rnd.randint(0, 20)
        key, value, ts = f"k{rnd.randrange(50)}".encode(), rnd.choice(good), t
        r = rnd.random()
        if r < 0.05:
            key = rnd.choice([b"", None, b"k" * 2000, b"k" * 200_000])
        elif r < 0.10:
            value = rnd.choice([None, b"", bytes(rnd.randrange(256) for _ in range(300)), b"\x00" * 100_000])
        elif r < 0.15:
            ts = rnd.choice([1, NOW - 400 * 86_400_000, NOW + 59 * 60_000, t - 86_400_000 * 2])
        recs.append(SourceRecord(topo.source_topic, 0, i, ts, key, value))
    out = op.process(recs, processing_ms=NOW)
    c = op.counters
    assert c["events"] + c["dead_letters"] == len(recs)
    dead = [o for o in out if o.role == "dead_letters"]
    assert len(dead) == c["dead_letters"] > 0
    assert all(len(o.value) + len(o.key or b"") <= 50_000 for o in dead)
    assert {json.loads(o.value)["source"]["offset"] for o in dead} <= set(range(len(recs)))
    clone = topo.make_operator(0)
    clone.restore(op.snapshot())
    assert clone.snapshot() == op.snapshot()
