"""Keying by a field through the worker-managed repartition topic, on the real broker.

dedup with ``key_field`` on a source keyed at random (so every id's copies land in
several partitions): the repartition stage re-keys the records by the field, the
operators read the repartition topic, and each id is forwarded exactly once, with the
headers and timestamp of the copy that was forwarded; a record without the field is
dead-lettered by the stage; a kill -9 of the worker loses nothing.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from grudge_devkafka import free_port
from grudge_stream.operators.records import ID_HEADER
from grudge_stream.topics import ensure_topology_topics
from grudge_stream.topology import Settings, load_topology

pytestmark = [pytest.mark.kafka]

IDS = 100
COPIES = 3
PARTITIONS = 4


class Env:
    def __init__(self, bootstrap: str, tmp_path: Path, **extra: object) -> None:
        run = uuid.uuid4().hex[:8]
        self.bootstrap, self.tmp_path = bootstrap, tmp_path
        self.overrides = {
            "source_topic": f"rp-{run}-in",
            "output_topic": f"rp-{run}-out",
            "dead_letter_topic": f"rp-{run}-dlq",
            "snapshot_topic": f"rp-{run}-snapshots",
            "operator_id": f"dedup-{run}",
            "key_field": "id",
            "capacity": "10000",
            "checkpoint_interval_s": "1.0",
            "seed": secrets.token_hex(16),
            **{k: str(v) for k, v in extra.items()},
        }
        self.topology = load_topology("dedup", Settings({**self.overrides, "bootstrap_servers": bootstrap},
                                                        environ={}))
        self.plan = self.topology.repartition
        ensure_topology_topics(self.topology, bootstrap, partitions=PARTITIONS, create_source=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        self.sent: dict[str, list[tuple[bytes, list, int]]] = defaultdict(list)

    def records(self, ids: range, copy: int, start_ms: int) -> list[tuple]:
        """(key, value, headers, timestamp) of one copy of each id, keyed at random."""
        out = []
        for n, i in enumerate(ids):
            ident = f"id-{i}"
            value = json.dumps({"id": ident, "copy": copy}).encode()
            headers = [("trace", f"{ident}/{copy}".encode()), ("origin", b"test")]
            if copy == 1:
                headers.append(("none", None))  # a header without a value: kept as it is
            ts = start_ms + copy * 1000 + n
            out.append((secrets.token_bytes(8), value, headers, ts))
            self.sent[ident].append((value, headers, ts))
        return out

    def produce(self, records: list[tuple]) -> None:
        for key, value, headers, ts in records:
            self.producer.produce(self.plan.source_topic, key=key, value=value, headers=headers, timestamp=ts)
        assert self.producer.flush(30) == 0

    def start_worker(self, runtime: str = "batch", **extra: object) -> int:
        port = free_port()
        log_path = self.tmp_path / f"worker-{len(self.procs)}.log"
        cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", "dedup", "--runtime", runtime,
               "--bootstrap-servers", self.bootstrap, "--web-port", str(port), "--no-create-topics"]
        for k, v in {"state_dir": str(self.tmp_path / "state"), **self.overrides,
                     **{k: str(v) for k, v in extra.items()}}.items():
            cmd += ["--set", f"{k}={v}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
        with open(log_path, "wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(self.tmp_path))
        self.procs.append((proc, log_path))
        return port

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for _, p in self.procs)

    def close(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def read(self, topic: str, read_committed: bool = False) -> list:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"rp-read-{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": False, "fetch.queue.backoff.ms": 1,
                      "isolation.level": "read_committed" if read_committed else "read_uncommitted"})
        try:
            ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                    for p in range(PARTITIONS)}
            tps = [TopicPartition(topic, p, 0) for p, e in ends.items() if e > 0]
            got: list = []
            if not tps:
                return got
            c.assign(tps)
            deadline = time.monotonic() + 30
            while True:
                got += [m for m in c.consume(1000, timeout=0.3) if not m.error()]
                pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, t.partition)
                                                                      for t in tps])}
                if all(pos[p] >= ends[p] for p in pos):
                    return got
                assert time.monotonic() < deadline, f"timed out reading {topic}"
        finally:
            c.close()

    def wait_for(self, topic: str, n: int, timeout: float = 60.0, read_committed: bool = False) -> list:
        """The records of ``topic`` once it holds at least ``n`` (and then a second more of quiet)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.read(topic, read_committed)
            if len(got) >= n:
                time.sleep(1.0)
                return self.read(topic, read_committed)
            if time.monotonic() > deadline or any(p.poll() is not None for p, _ in self.procs[-1:]):
                raise AssertionError(f"{topic}: {len(got)} records, wanted {n}\n{self.logs()}")
            time.sleep(0.3)


@pytest.fixture
def env(kafka_bootstrap, tmp_path):
    made: list[Env] = []

    def make(**kw) -> Env:
        e = Env(kafka_bootstrap, tmp_path, **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def _start_ms() -> int:
    return (time.time_ns() // 1_000_000 - 600_000) // 1000 * 1000


def _headers(m) -> list:
    """A record's headers less the output id the publisher adds (``grudge-id``)."""
    return [(k, v) for k, v in (m.headers() or []) if k != ID_HEADER]


def _check_forwarded(e: Env, out: list) -> None:
    ids = Counter(m.key().decode() for m in out)
    assert len(ids) == IDS and set(ids.values()) == {1}, ids.most_common(3)
    for m in out:
        ident = m.key().decode()
        # (Less the output id the dedup adds: docs/runtime.md, "Output ids".)
        got = (m.value(), _headers(m), m.timestamp()[1])
        # The record of one of the id's copies, whole: value, headers and timestamp together.
        assert got in e.sent[ident], (got, e.sent[ident])
        assert m.timestamp()[0] == 1  # CreateTime: the producer's, kept through both hops


# ingest (grudge_stream.runtime.native): how the repartition stage, and the batch worker's
# operators, read their source.
@pytest.mark.parametrize("runtime,drain,ingest", [("batch", "batch", "python"), ("batch", "batch", "native"),
                                                  ("faust", "batch", "native"), ("faust", "agent", "python")])
def test_dedup_by_field_forwards_each_id_once_with_headers(env, runtime, drain, ingest) -> None:
    e = env(drain=drain, ingest=ingest)
    start = _start_ms()
    records = [r for copy in range(COPIES) for r in e.records(range(IDS), copy, start)]
    # Not JSON, and JSON without the field: the stage dead-letters both.
    e.produce(records + [(b"k1", b"not json", [("trace", b"x")], start), (b"k2", b'{"other":1}', None, start)])
    port = e.start_worker(runtime)
    out = e.wait_for(e.topology.outputs["forward"], IDS)
    _check_forwarded(e, out)
    # The repartition topic: every copy, keyed by the id, each id in one partition.
    rp = e.read(e.plan.topic)
    assert len(rp) == IDS * COPIES
    # Each copy whole: its value, headers and timestamp (CreateTime) as sent, under the id.
    assert sorted((m.key().decode(), m.value(), m.headers(), m.timestamp()) for m in rp) == \
        sorted((ident, v, h, (1, ts)) for ident, rows in e.sent.items() for v, h, ts in rows)
    where = defaultdict(set)
    for m in rp:
        where[m.key()].add(m.partition())
    assert len(where) == IDS and all(len(ps) == 1 for ps in where.values())
    assert len({p for ps in where.values() for p in ps}) > 1  # spread over the partitions
    dead = [json.loads(m.value()) for m in e.wait_for(e.topology.outputs["dead_letters"], 2)]
    assert len(dead) == 2 and all(d["stage"] == "repartition" for d in dead)
    assert {d["operator"] for d in dead} == {e.overrides["operator_id"] + "-repartition"}
    assert sorted(d["source"]["topic"] for d in dead) == [e.plan.source_topic] * 2
    assert any("missing key field 'id'" in d["reason"] for d in dead)
    assert any("not JSON" in d["reason"] for d in dead)
    # /live answers for the stage too, and /metrics counts what it did.
    live = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=10).read())
    assert live["live"] and live["parts"]["repartition"]["live"], live
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    fwd = [ln for ln in metrics.splitlines()
           if ln.startswith("grudge_repartition_records_total") and 'outcome="forwarded"' in ln]
    assert fwd and float(fwd[0].split()[-1]) == IDS * COPIES, fwd
    lag = [float(ln.split()[-1]) for ln in metrics.splitlines() if ln.startswith("grudge_repartition_lag_records")]
    assert len(lag) == PARTITIONS and set(lag) == {0.0}, lag
    # Which path the stage reads on: its metric, and its start-up line (ingest=python says nothing).
    native = [ln for ln in metrics.splitlines() if ln.startswith("grudge_repartition_ingest_native{")]
    assert len(native) == 1 and float(native[0].split()[-1]) == (1.0 if ingest == "native" else 0.0), native
    said = "\n".join(path.read_text(errors="replace") for _, path in e.procs)
    assert ("repartition stage ingest: native" in said) == (ingest == "native"), said[-3000:]
    if runtime == "batch":
        # replay reads the repartition topic: the records the operators consumed (records with
        # headers: on the native path they are built from its headed columns), on both paths.
        outs = {}
        for path in ("python", "native"):
            cmd = [sys.executable, "-m", "grudge_stream.cli", "replay", "dedup", "--bootstrap-servers", e.bootstrap,
                   "--output", "stdout", "--quiet"]
            for k, v in {**e.overrides, "ingest": path}.items():
                cmd += ["--set", f"{k}={v}"]
            env_ = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env_, cwd=str(e.tmp_path))
            assert r.returncode == 0, r.stderr
            lines = [json.loads(x) for x in r.stdout.splitlines()]
            assert sorted(x["key"] for x in lines if x["role"] == "forward") == sorted(e.sent)
            summary = json.loads(r.stderr.strip().splitlines()[-1])
            assert summary["records"] == IDS * COPIES and summary["ingest"] == path
            outs[path] = sorted(r.stdout.splitlines())  # (partitions interleave as their fetches come)
        assert outs["python"] == outs["native"]


@pytest.mark.parametrize("exactly_once,ingest", [(True, "python"), (False, "python"), (True, "native")])
def test_repartition_stage_survives_kill9(env, exactly_once, ingest) -> None:
    """A kill -9 mid-stream loses no record: every id is forwarded, exactly once with
    exactly_once=true (the stage's and the operators' transactions), at least once without."""
    e = env(exactly_once=str(exactly_once).lower(), group_instance_id="rp-w0", transaction_timeout_s="10",
            ingest=ingest)
    start = _start_ms()
    first = [r for copy in range(COPIES) for r in e.records(range(IDS // 2), copy, start)]
    rest = [r for copy in range(COPIES) for r in e.records(range(IDS // 2, IDS), copy, start)]
    e.produce(first)
    e.start_worker("batch")
    e.wait_for(e.topology.outputs["forward"], 1, read_committed=True)
    # Traffic in flight while the worker dies.
    th = threading.Thread(target=lambda: [e.produce(rest[i:i + 15]) or time.sleep(0.05)
                                          for i in range(0, len(rest), 15)], daemon=True)
    th.start()
    time.sleep(0.4)
    proc, _ = e.procs[-1]
    proc.kill()
    proc.wait(10)
    th.join(30)
    e.start_worker("batch")
    if exactly_once:
        out = e.wait_for(e.topology.outputs["forward"], IDS, timeout=90, read_committed=True)
        _check_forwarded(e, out)
        rp = e.read(e.plan.topic, read_committed=True)
        assert Counter(m.key() for m in rp) == Counter({f"id-{i}".encode(): COPIES for i in range(IDS)})
        return
    # At least once: outputs and re-keyed copies after the last snapshot / commit may come twice.
    deadline = time.monotonic() + 90
    while True:
        out = e.read(e.topology.outputs["forward"])
        if {m.key() for m in out} == {f"id-{i}".encode() for i in range(IDS)}:
            break
        assert time.monotonic() < deadline, f"{len({m.key() for m in out})} ids forwarded\n{e.logs()}"
        time.sleep(0.3)
    for m in out:
        assert (m.value(), _headers(m), m.timestamp()[1]) in e.sent[m.key().decode()]
    time.sleep(1.0)
    rp = Counter(m.key() for m in e.read(e.plan.topic))
    assert set(rp) == {f"id-{i}".encode() for i in range(IDS)} and min(rp.values()) >= COPIES
