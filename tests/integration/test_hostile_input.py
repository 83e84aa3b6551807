"""Hostile input on the real broker, both runtimes: nothing crashes, nothing is lost, nothing
blinds detection, and the secret hash key never reaches Kafka."""
from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from grudge_stream.hashkey import HashKey
from grudge_stream.operators.records import SourceRecord

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

# The batch runtime on each ingest path (setting ingest): "batch" reads confluent-kafka messages,
# "batch-native" the native path (grudge_stream.runtime.native).
RUNTIMES = ["faust", "batch", "batch-native"]


def worker_settings(runtime: str) -> dict[str, str]:
    if runtime == "batch-native":
        return {"runtime": "batch", "ingest": "native"}
    return {"runtime": runtime, "ingest": "python"}
BAD, GOOD = b'{"outcome":"bad"}', b'{"outcome":"good"}'


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def topic_limit(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return int(admin.describe_configs([res])[res].result(30)["max.message.bytes"].value)


def big_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                     "message.max.bytes": 2_000_000})


YEAR_AGO = -365 * 86_400_000


def hostile_records(limit: int, rnd: random.Random) -> list[tuple]:
    """(key, value, timestamp_ms, headers): every kind of record the public can send. A
    timestamp of None means "the stream's time" (its neighbour's), a negative one is relative
    to that; the others are absolute."""
    big = limit - 700  # a key or value as large as the topic takes (record framing aside)
    return [
        (b"", BAD, None, None),                                 # empty key
        (b"h", BAD, None, [("h", b"v")]),                       # a header
        (b"x" * 1024, BAD, None, None),                         # at max_key_bytes
        (b"x" * 1025, BAD, None, None),                         # over it
        (b"y" * 450_000, BAD, None, None),                      # a large key
        (b"z" * big, b"{}", None, None),                        # a key at the broker's limit
        (b"hostile-big-value", b'{"outcome":"bad"' + b" " * (big - 40) + b"}", None, None),  # valid, huge
        (b"hostile-garbage", bytes(rnd.randrange(256) for _ in range(big)), None, None),  # binary garbage
        (b"hostile-tomb", None, None, None),                    # tombstone
        (None, BAD, None, None),                                # no key
        (b"hostile-1970", BAD, 1, None),  # the epoch (a timestamp of 0 means "now" to librdkafka)
        (b"hostile-year-ago", BAD, YEAR_AGO, None),             # a year before the stream
        (b"hostile-future", GOOD, now_ms() + 59 * 60_000, None),  # just inside the broker's 1 h
        (b"hostile-json", b'{"outcome": NaN}', None, None),
        (b"hostile-type", b'{"outcome": 7}', None, [("a", None), ("b", b"\x00" * 100)]),
    ]


def produce(h, producer: Producer, records, partition: int | None = None) -> None:
    errors: list = []

    def report(err, msg) -> None:
        if err is not None:
            errors.append((err, len(msg.key() or b""), len(msg.value() or b"")))

    for key, value, ts, headers in records:
        kw = {"partition": partition} if partition is not None else {}
        while True:
            try:
                producer.produce(h.topology.source_topic, key=key, value=value, timestamp=ts,
                                 headers=headers, on_delivery=report, **kw)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    assert not errors, errors


def is_normal(rec: SourceRecord) -> bool:
    return rec.key is not None and rec.key.startswith((b"abuser-", b"user-")) and rec.value in (BAD, GOOD)


def state_sequences(alert_values) -> dict[str, list[str]]:
    """Per key, the order of its raised/cleared alerts (duplicates of one alert id dropped)."""
    seen: set[str] = set()
    alerts = []
    for a in alert_values:
        if a["alert_id"] not in seen:
            seen.add(a["alert_id"])
            alerts.append(a)
    alerts.sort(key=lambda a: (a["source"]["partition"], a["source"]["offset"]))
    seq: dict[str, list[str]] = defaultdict(list)
    for a in alerts:
        seq[a["key"]].append(a["state"])
    return dict(seq)


def assert_alive(h) -> None:
    for w in h.workers:
        if w.proc.poll() is not None and w.proc.returncode not in (-9,):
            raise AssertionError(f"a worker exited on its own ({w.proc.returncode}): {w.log()[-3000:]}")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_hostile_input_is_accounted_for_and_leaves_normal_alerts_unchanged(harness, runtime: str) -> None:
    h = harness(partitions=2, emit_scores="every")
    bs = h.bootstrap
    limit = topic_limit(bs, h.topology.source_topic)
    rnd = random.Random(3)
    normal = [(k, v, t, None) for k, v, t in h.make_events(6000, seed=31)]
    hostile = hostile_records(limit, rnd)
    producer = big_producer(bs)

    def interleave(part):
        out = list(part)
        for key, value, ts, headers in hostile:  # never first: a partition's first record sets its clock
            i = rnd.randrange(1, len(out) + 1)
            here = out[i - 1][2]
            ts = here if ts is None else here + ts if ts < 0 else ts
            out.insert(i, (key, value, ts, headers))
        return out

    # Each partition gets every hostile record, spread among the normal traffic.
    first, second = normal[:3000], normal[3000:]
    for p in (0, 1):
        produce(h, producer, interleave([r for i, r in enumerate(first) if i % 2 == p]), partition=p)
    w1 = h.start_worker(**worker_settings(runtime))
    deadline = time.monotonic() + 90
    store = h.store()
    while True:  # until some snapshot was written, then kill -9 in the middle of the run
        m = [store.read_manifest(h.topology.operator_id, p) for p in (0, 1)]
        if any(x is not None for x in m):
            break
        assert time.monotonic() < deadline, w1.log()[-3000:]
        assert_alive(h)
        time.sleep(0.3)
    assert_alive(h)
    w1.kill9()
    for p in (0, 1):
        produce(h, producer, interleave([r for i, r in enumerate(second) if i % 2 == p]), partition=p)
    w2 = h.start_worker(**worker_settings(runtime))
    h.wait_caught_up(timeout=180)
    assert_alive(h)
    assert w2.stop() == 0, w2.log()[-3000:]

    # Every source offset ends exactly one way: a score (processed) or a dead letter.
    ends = h.end_offsets()
    processed = {(json.loads(m.value())["source"]["partition"], json.loads(m.value())["source"]["offset"])
                 for m in h.read_all(h.topology.outputs["scores"])}
    dlq = h.read_all(h.topology.outputs["dead_letters"])
    dead = {(json.loads(m.value())["source"]["partition"], json.loads(m.value())["source"]["offset"])
            for m in dlq}
    every = {(p, o) for p, end in ends.items() for o in range(end)}
    assert not processed & dead, sorted(processed & dead)[:10]
    assert processed | dead == every, sorted(every - processed - dead)[:10]
    dl_limit = topic_limit(bs, h.topology.outputs["dead_letters"])
    assert all(len(m.value()) + len(m.key() or b"") <= dl_limit for m in dlq)
    # 11 of the 15 hostile kinds are refused, in each partition and each half of the run
    assert len(dead) == 2 * 2 * 11, "\n".join(sorted(json.loads(m.value())["reason"][:70] for m in dlq))
    big = [json.loads(m.value()) for m in dlq if json.loads(m.value()).get("key_truncated")]
    assert big and all(b["key_bytes"] > 400_000 and len(b["key_sha256"]) == 64 for b in big)

    # The normal traffic raised and cleared exactly what it raises and clears on its own.
    live = state_sequences(json.loads(m.value()) for m in h.read_all(h.topology.outputs["alerts"]))
    alone = {p: [r for r in recs if is_normal(r)] for p, recs in h.source_records().items()}
    ref_alerts = []
    for p in alone:
        op = h.topology.make_operator(p)
        ref_alerts += [json.loads(o.value) for o in op.process(alone.get(p, [])) if o.role == "alerts"]
    expected = state_sequences(ref_alerts)
    assert expected and live == expected

    # The secret key never reaches the snapshot topic, in any form.
    key = HashKey.parse(h.overrides["seed"])
    k0, k1 = key.words
    needles = [key.material, key.material.hex().encode(), base64.b64encode(key.material),
               str(k0).encode(), str(k1).encode()]
    snaps = h.read_all(h.topology.snapshot_topic)
    assert snaps
    for m in snaps:
        assert not any(n in (m.value() or b"") or n in (m.key() or b"") for n in needles)


def metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_one_record_an_hour_ahead_does_not_blind_detection(harness, runtime: str) -> None:
    h = harness(partitions=1)
    t = now_ms() - 20_000
    recs = [(b"attacker-a", BAD, t + 100 * i, None) for i in range(30)]
    recs.append((b"skewed-clock", GOOD, now_ms() + 59 * 60_000, None))
    recs += [(b"attacker-b", BAD, t + 3000 + 100 * i, None) for i in range(30)]
    produce(h, big_producer(h.bootstrap), recs, partition=0)
    w = h.start_worker(**worker_settings(runtime))
    h.wait_caught_up()
    deadline = time.monotonic() + 30
    while metric(w.web_port, "grudge_future_clamped_total") < 1:
        assert time.monotonic() < deadline, "the clamped record is not counted"
        time.sleep(0.5)
    assert metric(w.web_port, "grudge_future_clamped_total") == 1
    assert w.stop() == 0
    alerts = [json.loads(m.value()) for m in h.read_all(h.topology.outputs["alerts"])]
    assert {a["key"] for a in alerts if a["state"] == "raised"} == {"attacker-a", "attacker-b"}
    assert not [a for a in alerts if a["state"] == "cleared"]


def test_worker_refuses_to_start_without_a_secret_key(harness) -> None:
    h = harness(partitions=1)
    cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", "abuse_scores", "--bootstrap-servers",
           h.bootstrap, "--no-create-topics"]
    for k, v in h.overrides.items():
        if k not in ("seed", "bootstrap_servers"):
            cmd += ["--set", f"{k}={v}"]
    env = {"PATH": "/usr/bin:/bin", **{k: v for k, v in __import__("os").environ.items()
                                      if k.startswith(("PYTHON", "VIRTUAL_ENV"))}}
    # From a scratch directory, as the harness runs workers: the checkout's source tree (no
    # compiled kernels) must not shadow the installed package.
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=str(h.tmp_path))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "GRUDGE_SEED" in lines[0] and "Traceback" not in res.stderr


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_outputs_too_large_for_their_topic_are_dead_lettered_not_lost(harness, runtime: str) -> None:
    h = harness(partitions=1)
    admin = AdminClient({"bootstrap.servers": h.bootstrap})
    alerts_topic = h.topology.outputs["alerts"]
    res = ConfigResource(ConfigResource.Type.TOPIC, alerts_topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "200", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)
    h.produce(h.make_events(4000, seed=41), partition_of=lambda i, key: 0)
    w = h.start_worker(**worker_settings(runtime))
    h.wait_caught_up()
    assert_alive(h)
    deadline = time.monotonic() + 30
    while metric(w.web_port, "grudge_outputs_dead_lettered_total") < 1:
        assert time.monotonic() < deadline, w.log()[-3000:]
        time.sleep(0.5)
    assert w.stop() == 0, w.log()[-3000:]
    assert h.read_all(alerts_topic) == []
    carried = set()
    for m in h.read_all(h.topology.outputs["dead_letters"]):
        body = json.loads(m.value())
        assert body["output"] == {"role": "alerts", "topic": alerts_topic}
        assert "max.message.bytes" in body["reason"]
        carried.add(json.loads(base64.b64decode(body["value_b64"]))["alert_id"])
    ref = h.reference()
    assert carried == ref[0]["alerts"] and carried


def framing_keys(victim: bytes, levels: int, cells: int) -> list[bytes]:
    """Keys covering every cell of ``victim`` under the PUBLIC hash key (an offline search)."""
    from grudge_stream import Exponential, ScoreSketch
    from grudge_stream.hashing import level_indexes

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
    return [found[lvl] for lvl in range(levels)]


@pytest.mark.parametrize("secret", [False, True], ids=["public-key", "secret-key"])
def test_keys_found_with_the_public_key_frame_the_innocent_only_without_a_secret_key(harness, secret: bool) -> None:
    h = harness(partitions=1)
    if not secret:
        del h.overrides["seed"]
        h.overrides["insecure_public_seed"] = "true"
    attackers = framing_keys(b"innocent", 4, int(h.overrides["cells_per_level"]))
    t = now_ms() - 30_000
    recs = [(b"innocent", GOOD, t, None)]
    for r in range(15):
        recs += [(k, BAD, t + 100 * r + j, None) for j, k in enumerate(attackers)]
    recs.append((b"innocent", GOOD, t + 2000, None))
    produce(h, big_producer(h.bootstrap), recs, partition=0)
    w = h.start_worker(runtime="batch")
    h.wait_caught_up()
    assert w.stop() == 0
    if not secret:
        assert "PUBLIC key" in w.log()
    raised = {json.loads(m.value())["key"] for m in h.read_all(h.topology.outputs["alerts"])
              if json.loads(m.value())["state"] == "raised"}
    assert set(a.decode() for a in attackers) <= raised
    assert ("innocent" in raised) == (not secret)
