"""A harness for runtime tests against the real broker: topics, traffic, workers, references.

A test gets a ``Harness`` bound to fresh topics. It produces a deterministic
event stream, runs ``grudge-stream worker abuse_scores`` as child processes
(killed with SIGKILL or stopped with SIGTERM as the test likes), and compares
what the workers left in the snapshot topic with a reference computed by
running the same operators in-process over the records read back from Kafka.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from grudge_devkafka import free_port
from grudge_stream.checkpoint import CheckpointStore
from grudge_stream.operators.records import SourceRecord
from grudge_stream.topics import ensure_topology_topics
from grudge_stream.topology import Settings, load_topology


def make_events(n: int, seed: int = 1, start_ms: int | None = None, abusers: int = 8,
                users: int = 3000) -> list[tuple[bytes, bytes, int]]:
    """(key, value, timestamp_ms) triples: a few abusive clients among many good ones.

    Timestamps start ten minutes ago by default: the broker deletes segments whose records
    are older than the topic's retention (7 days), so fixed historical timestamps would
    make records vanish in the middle of a test.
    """
    rnd = random.Random(seed)
    if start_ms is None:
        start_ms = (time.time_ns() // 1_000_000 - 600_000) // 1000 * 1000
    out = []
    t = start_ms
    for _ in range(n):
        t += rnd.randint(0, 3)
        if rnd.random() < 0.1:
            key, bad = f"abuser-{rnd.randrange(abusers)}", rnd.random() < 0.85
        else:
            key, bad = f"user-{rnd.randrange(users)}", rnd.random() < 0.03
        out.append((key.encode(), b'{"outcome":"bad"}' if bad else b'{"outcome":"good"}', t))
    return out


class Worker:
    def __init__(self, proc: subprocess.Popen, log_path: Path, web_port: int) -> None:
        self.proc, self.log_path, self.web_port = proc, log_path, web_port

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"worker ignored SIGTERM for {timeout}s; log: {self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Harness:
    make_events = staticmethod(make_events)

    def __init__(self, bootstrap: str, tmp_path: Path, partitions: int = 4, **settings: object) -> None:
        self.bootstrap = bootstrap
        self.tmp_path = tmp_path
        self.partitions = partitions
        run = uuid.uuid4().hex[:8]
        self.overrides: dict[str, str] = {
            "source_topic": f"rt-{run}-events",
            "alerts_topic": f"rt-{run}-alerts",
            "scores_topic": f"rt-{run}-scores",
            "dead_letter_topic": f"rt-{run}-dlq",
            "snapshot_topic": f"rt-{run}-snapshots",
            "app_name": f"rt-{run}",
            "operator_id": f"abuse-{run}",
            "cells_per_level": "5000",
            "checkpoint_interval_s": "1.0",
            "snapshot_chunk_bytes": "65536",
            "seed": secrets.token_hex(16),
            "bootstrap_servers": bootstrap,
        }
        self.overrides.update({k: str(v) for k, v in settings.items()})
        self.workers: list[Worker] = []
        self.topology = load_topology("abuse_scores", Settings(self.overrides, environ={}))
        ensure_topology_topics(self.topology, bootstrap, partitions=partitions, create_source=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})

    # -- traffic ------------------------------------------------------------------------------

    def produce(self, events, partition_of=None) -> None:
        for i, (key, value, ts) in enumerate(events):
            kw = {} if partition_of is None else {"partition": partition_of(i, key)}
            while True:
                try:
                    self.producer.produce(self.topology.source_topic, key=key, value=value, timestamp=ts, **kw)
                    break
                except BufferError:
                    self.producer.poll(0.05)
        assert self.producer.flush(30) == 0

    def produce_in_background(self, events, seconds: float) -> threading.Thread:
        """Produce ``events`` spread evenly over about ``seconds``."""
        def run() -> None:
            chunk = max(1, len(events) // max(1, int(seconds * 20)))
            for i in range(0, len(events), chunk):
                self.produce(events[i:i + chunk])
                time.sleep(0.05)
        th = threading.Thread(target=run, daemon=True)
        th.start()
        return th

    # -- workers ------------------------------------------------------------------------------

    def track(self, proc: subprocess.Popen, log_path: Path, web_port: int) -> Worker:
        """A worker process started elsewhere, killed by ``close()`` like the harness's own."""
        w = Worker(proc, log_path, web_port)
        self.workers.append(w)
        return w

    def start_worker(self, web_port: int | None = None, **extra: object) -> Worker:
        port = web_port or free_port()
        log_path = self.tmp_path / f"worker-{len(self.workers)}.log"
        cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", "abuse_scores",
               "--bootstrap-servers", self.bootstrap, "--web-port", str(port), "--loglevel", "info",
               "--no-create-topics"]
        # Faust's data directory in the test's directory, not the user's ~/.local/state.
        state = {"state_dir": str(self.tmp_path / "state")}
        for k, v in {**state, **self.overrides, **{k: str(v) for k, v in extra.items()}}.items():
            if k != "bootstrap_servers":
                cmd += ["--set", f"{k}={v}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
        with open(log_path, "wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(self.tmp_path))
        w = Worker(proc, log_path, port)
        self.workers.append(w)
        return w

    def close(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(10)

    # -- reading back ---------------------------------------------------------------------------

    def end_offsets(self, topic: str | None = None) -> dict[int, int]:
        topic = topic or self.topology.source_topic
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "harness-wm"})
        try:
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                    for p in range(self.partitions)}
        finally:
            c.close()

    def read_all(self, topic: str, read_committed: bool = False) -> list:
        """Every record of ``topic`` up to its current end (committed ones only if asked)."""
        ends = self.end_offsets(topic)
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"harness-{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": False, "fetch.queue.backoff.ms": 1,
                      "isolation.level": "read_committed" if read_committed else "read_uncommitted"})
        tps = [TopicPartition(topic, p, 0) for p in range(self.partitions) if ends[p] > 0]
        got: list = []
        deadline = time.monotonic() + 60
        try:
            if not tps:
                return got
            c.assign(tps)
            while True:
                for m in c.consume(1000, timeout=0.5):
                    if not m.error():
                        got.append(m)
                # Positions move past transaction markers and aborted records too.
                pos = {tp.partition: tp.offset for tp in c.position(
                    [TopicPartition(topic, tp.partition) for tp in tps])}
                if all(pos[p] >= ends[p] for p in pos):
                    return got
                assert time.monotonic() < deadline, f"timed out reading {topic}: {pos} / {ends}"
        finally:
            c.close()

    def source_records(self) -> dict[int, list[SourceRecord]]:
        by_p: dict[int, list[SourceRecord]] = defaultdict(list)
        for m in self.read_all(self.topology.source_topic):
            by_p[m.partition()].append(SourceRecord(m.topic(), m.partition(), m.offset(), m.timestamp()[1],
                                                    m.key(), m.value()))
        for recs in by_p.values():
            recs.sort(key=lambda r: r.offset)
        return by_p

    def reference(self, records_by_partition=None) -> dict[int, dict]:
        """Run the operators in-process over everything in the source topic."""
        records_by_partition = records_by_partition or self.source_records()
        ref = {}
        for p in range(self.partitions):
            op = self.topology.make_operator(p)
            out = op.process(records_by_partition.get(p, []))
            ref[p] = {
                "sketch": op.sketch_bytes(),
                "alerts": {json.loads(o.value)["alert_id"] for o in out if o.role == "alerts"},
                "dead": [o for o in out if o.role == "dead_letters"],
                "op": op,
            }
        return ref

    def store(self) -> CheckpointStore:
        return CheckpointStore(self.bootstrap, self.topology.snapshot_topic)

    def wait_caught_up(self, timeout: float = 120.0) -> None:
        """Until every partition's newest snapshot covers the end of the source topic."""
        ends = self.end_offsets()
        store = self.store()
        deadline = time.monotonic() + timeout
        op_id = self.topology.operator_id
        while True:
            behind = {}
            for p, end in ends.items():
                m = store.read_manifest(op_id, p)
                got = m.current.next_offset if m else None
                if end and (got is None or got < end):
                    behind[p] = (got, end)
            if not behind:
                return
            if time.monotonic() > deadline:
                logs = "\n".join(w.log()[-2000:] for w in self.workers)
                raise AssertionError(f"workers did not catch up: {behind}\n{logs}")
            time.sleep(0.5)

    def final_state(self) -> dict[int, bytes]:
        store = self.store()
        out = {}
        for p in range(self.partitions):
            op = self.topology.make_operator(p)
            res = store.restore(self.topology.operator_id, p,
                                accept=lambda ref, blob, p=p: self.topology.make_operator(p).restore(blob))
            if res.blob is not None:
                op.restore(res.blob)
            out[p] = op.sketch_bytes()
        return out

    def alert_ids(self) -> set[str]:
        return {json.loads(m.value())["alert_id"] for m in self.read_all(self.topology.outputs["alerts"])}


@pytest.fixture
def harness(kafka_bootstrap, tmp_path):
    made: list[Harness] = []

    def make(**kw) -> Harness:
        h = Harness(kafka_bootstrap, tmp_path, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
