"""A harness for runtime tests against the real broker: topics, traffic, workers, references.

A test gets a ``Harness`` bound to fresh topics. It produces a deterministic
event stream, runs ``grudge-stream worker abuse_scores`` as child processes
(killed with SIGKILL or stopped with SIGTERM as the test likes), and compares
what the workers left in the snapshot topic with a reference computed by
running the same operators in-process over the records read back from Kafka.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from grudge_devkafka import free_port
from grudge_stream.checkpoint import CheckpointStore
from grudge_stream.operators.records import SourceRecord
from grudge_stream.topics import create_topics, ensure_topology_topics
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

    def wait_ready(self, timeout: float = 90) -> None:
        """Until ``/ready`` answers 200 (the worker started and restored its partitions)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            assert self.proc.poll() is None, f"worker exited: {self.log()[-3000:]}"
            assert time.monotonic() < deadline, f"worker not ready after {timeout}s: {self.log()[-3000:]}"
            time.sleep(0.2)


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
            # Tests that wait for snapshots to cover the end of the topic: every changed
            # partition at every checkpoint_interval_s (test_commits.py runs the budget).
            "snapshot_replay_budget_s": "0",
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
        """Each partition's log end; a topic created moments ago may not have its leaders
        elected yet (NOT_LEADER_FOR_PARTITION, UNKNOWN_TOPIC_OR_PART): asked again for 30 s."""
        topic = topic or self.topology.source_topic
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "harness-wm"})
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                            for p in range(self.partitions)}
                except KafkaException as exc:
                    if exc.args[0].code() not in (KafkaError.NOT_LEADER_FOR_PARTITION,
                                                  KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                  KafkaError.LEADER_NOT_AVAILABLE) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
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


@pytest.fixture
def harness_on(tmp_path):
    """A Harness factory bound to a broker of the test's choosing (``harness_on(bootstrap, ...)``),
    for tests that run their own cluster; workers are killed at the end."""
    made: list[Harness] = []

    def make(bootstrap: str, **kw) -> Harness:
        h = Harness(bootstrap, tmp_path, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


# -- embedded state: the example apps of examples/ ---------------------------------------------

def embedded_events(n: int, seed: int, abusers: int, users: int) -> list[tuple[bytes, bytes, int]]:
    """(key, value, timestamp_ms): planted abusers (mostly "bad") among many good users; event
    time from ten minutes ago, a few ms apart, so abusers raise, go quiet and clear."""
    rnd = random.Random(seed)
    t = (time.time_ns() // 1_000_000 - 600_000) // 1000 * 1000
    out = []
    for i in range(n):
        t += rnd.randint(0, 12)
        quiet = i > n * 2 // 3  # the abusers stop for the last third: they clear
        if rnd.random() < 0.1 and not quiet:
            key, bad = f"abuser-{rnd.randrange(abusers)}", rnd.random() < 0.9
        else:
            key, bad = f"user-{rnd.randrange(users)}", rnd.random() < 0.03
        out.append((key.encode(), b'{"outcome":"bad"}' if bad else b'{"outcome":"good"}', t))
    return out



class ExampleApp:
    """One run of an example app (a script of examples/) as a child process."""

    def __init__(self, script: Path, args: list[str], env: dict, tmp: Path, name: str) -> None:
        self.name = name
        self.log_path = tmp / f"{name}.log"
        datadir = tmp / f"{name}-data"
        datadir.mkdir(exist_ok=True)
        env = {**env, "EXAMPLE_DATADIR": str(datadir)}
        port = str(free_port())
        self.web_port = int(port)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, str(script), *[a.replace("{port}", port) for a in args]],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(tmp))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_text(self, chars: int = 6000) -> str:
        """The log's last ``chars`` characters without Faust's status tables (a recovery
        that waits prints one every 5 s, and they would fill the tail)."""
        lines = [ln for ln in self.log().splitlines() if not ln.startswith(("+", "|"))]
        return "\n".join(lines)[-chars:]

    def wait_ready(self, timeout: float = 90) -> None:
        """Until ``/ready`` answers 200 (the worker started and restored its partitions)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            assert self.proc.poll() is None, f"worker exited: {self.log()[-3000:]}"
            assert time.monotonic() < deadline, f"worker not ready after {timeout}s: {self.log()[-3000:]}"
            time.sleep(0.2)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"app ignored SIGTERM; log: {self.log()[-3000:]}")


class EmbeddedScenario:
    """An example app that embeds a ``ScoreState`` named ``<app>-abuse`` (``abuse`` in the
    module), its source topic, traffic, and the comparison with an uninterrupted replay
    (tests/integration/test_embedded_*.py)."""

    PARTITIONS = 4
    events = staticmethod(embedded_events)

    def __init__(self, bootstrap: str, tmp: Path, script: Path, args: list[str], table: str | None) -> None:
        self.bootstrap, self.tmp = bootstrap, tmp
        self.script, self.args, self.table = script, args, table
        self.app_id = f"guard-{uuid.uuid4().hex[:8]}"
        self.source = f"{self.app_id}-logins"
        self.env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "GRUDGE_SEED": secrets.token_hex(16),
                    "EXAMPLE_APP_ID": self.app_id, "EXAMPLE_SOURCE": self.source,
                    "EXAMPLE_PARTITIONS": str(self.PARTITIONS)}
        self.env.pop("PYTHONPATH", None)
        # The bearer token of the state's live reads on the app's web server (grudge.serve).
        self.token = secrets.token_urlsafe(24)
        token_file = tmp / f"{self.app_id}-query-tokens"
        token_file.write_text(f"app:{self.token}\n")
        self.env["GRUDGE_QUERY_TOKEN_FILE"] = str(token_file)
        create_topics(bootstrap, {self.source: (self.PARTITIONS, {})})
        self.example = self._load_example()
        self.state = self.example.abuse
        self.apps: list[ExampleApp] = []
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def _load_example(self):
        """The example module itself (its state's config is the reference's)."""
        saved = dict(os.environ)
        os.environ.update({k: v for k, v in self.env.items() if k.startswith(("EXAMPLE_", "GRUDGE_SEED"))})
        os.environ["EXAMPLE_DATADIR"] = str(self.tmp / "reference-data")
        try:
            spec = importlib.util.spec_from_file_location(f"example_{self.app_id.replace('-', '_')}", self.script)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def start(self, name: str, script: Path | None = None) -> ExampleApp:
        """Run the example app (or ``script``, another app of the same environment)."""
        app = ExampleApp(script or self.script, self.args, self.env, self.tmp, name)
        self.apps.append(app)
        return app

    def produce(self, events) -> None:
        for key, value, ts in events:
            self.producer.produce(self.source, key=key, value=value, timestamp=ts)
            self.producer.poll(0)
        self.producer.flush(30)

    def produce_slowly(self, events, seconds: float) -> threading.Thread:
        def run() -> None:
            step = max(1, len(events) // 50)
            for i in range(0, len(events), step):
                self.produce(events[i:i + step])
                time.sleep(seconds / 50)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def end_offsets(self, topic: str) -> dict[int, int]:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "embedded-wm"})
        try:
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                    for p in range(self.PARTITIONS)}
        finally:
            c.close()

    def committed(self) -> dict[int, int]:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(self.app_id)])
        res = list(fut.values())[0].result(30)
        return {tp.partition: tp.offset for tp in res.topic_partitions if tp.topic == self.source}

    def wait_snapshot_progress(self, timeout: float = 60) -> None:
        """Until some partition has a snapshot past offset 0 (the app is mid-stream)."""
        store = CheckpointStore(self.bootstrap, self.state.snapshot_topic)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in range(self.PARTITIONS):
                try:
                    m = store.read_manifest(self.state.operator_id, p)
                except Exception:  # noqa: BLE001 - the topic may not exist yet
                    m = None
                if m is not None and m.current.next_offset:
                    return
            time.sleep(0.3)
        raise AssertionError("no snapshot appeared; logs:\n" + self.logs())

    def logs(self) -> str:
        """Every app's log tail, for a failing assertion."""
        return "\n".join(f"== {a.name}\n" + a.log_text() for a in self.apps)

    def wait_done(self, timeout: float = 150) -> None:
        """Until the group's offsets and every partition's snapshot reach the topic's end."""
        ends = self.end_offsets(self.source)
        store = CheckpointStore(self.bootstrap, self.state.snapshot_topic)
        deadline = time.monotonic() + timeout
        while True:
            committed = self.committed()
            snaps = {}
            for p in range(self.PARTITIONS):
                m = store.read_manifest(self.state.operator_id, p)
                snaps[p] = m.current.next_offset if m else None
            if all(committed.get(p) == ends[p] and snaps[p] == ends[p] for p in range(self.PARTITIONS)):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not caught up: committed {committed}, snapshots {snaps}, ends {ends}\n"
                                     + self.logs())
            time.sleep(0.5)

    def read_all(self, topic: str) -> list:
        ends = self.end_offsets(topic)
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": False, "fetch.queue.backoff.ms": 1})
        c.assign([TopicPartition(topic, p, 0) for p in range(self.PARTITIONS) if ends[p]])
        got, deadline = [], time.monotonic() + 60
        try:
            while sum(1 for _ in got) < sum(ends.values()):
                got.extend(m for m in c.consume(1000, timeout=0.5) if not m.error())
                assert time.monotonic() < deadline, f"timed out reading {topic}"
        finally:
            c.close()
        return got

    def check(self) -> dict:
        """Compare the app's outputs and state with an uninterrupted replay; the figures."""
        records = defaultdict(list)
        for m in self.read_all(self.source):
            records[m.partition()].append(m)
        truth = Counter()
        ref_alerts: dict[str, bytes] = {}
        store = CheckpointStore(self.bootstrap, self.state.snapshot_topic)
        divergent_state: list[int] = []
        history: dict[int, list[str]] = {}
        ref_raised: set[bytes] = set()
        for p in range(self.PARTITIONS):
            op = self.state.topology.make_operator(p)
            for m in sorted(records[p], key=lambda m: m.offset()):
                truth[m.key()] += 1
                outcome = self.example.outcome_of(m.value())
                if outcome is None or not m.key():
                    continue
                out = op.apply_event(m.key(), self.example.DELTAS[outcome], offset=m.offset(),
                                     timestamp_ms=m.timestamp()[1])
                for o in out or ():
                    if o.role == "alerts":
                        ref_alerts[json.loads(o.value)["alert_id"]] = o.value
            op.next_offset = max(m.offset() for m in records[p]) + 1
            ref_raised.update(op.latch.keys())
            got = self.state.topology.make_operator(p)
            res = store.restore(self.state.operator_id, p, accept=lambda ref, blob: None)
            assert res.blob is not None, f"no snapshot of partition {p}"
            got.restore(res.blob)
            if got.snapshot() != op.snapshot():
                divergent_state.append(p)
                history[p] = self.snapshot_history(p, sorted(records[p], key=lambda m: m.offset()))
        seen: dict[str, set] = defaultdict(set)
        for m in self.read_all(self.state.outputs["alerts"]):
            seen[json.loads(m.value())["alert_id"]].add(m.value())
        lost = set(ref_alerts) - set(seen)
        extra = set(seen) - set(ref_alerts)
        differing = [a for a, vals in seen.items() if a in ref_alerts and vals != {ref_alerts[a]}]
        dropped: dict = {}
        excess = 0
        if self.table:
            # A Faust Table agent beside the state: the last changelog value per key.
            table: dict[bytes, int] = {}
            for m in self.read_all(f"{self.app_id}-{self.table}-changelog"):
                table[m.key()] = json.loads(m.value())
            dropped = {k: (table.get(k, 0), n) for k, n in truth.items() if table.get(k, 0) < n}
            excess = sum(max(0, table.get(k, 0) - n) for k, n in truth.items())
        return {"alerts": len(ref_alerts), "lost": lost, "extra": extra, "differing": differing,
                "divergent_state": divergent_state, "history": history, "dropped": dropped,
                "table_excess": excess, "ref_raised": ref_raised,
                "committed": self.committed(), "ends": self.end_offsets(self.source),
                "raised": sum(1 for v in ref_alerts.values() if b'"raised"' in v)}

    def view_raised(self) -> set[bytes]:
        """The state's ban list as a subscriber sees it: ``AlertView.for_state`` on its topics."""
        from grudge_stream.client import AlertView

        view = AlertView.for_state(self.state, bootstrap_servers=self.bootstrap).start(timeout_s=60)
        try:
            return set(view.raised())
        finally:
            view.stop()

    def snapshot_history(self, p: int, records: list) -> list[str]:
        """Every snapshot of partition ``p`` still in the snapshot topic, oldest first, each
        against a replay of the records below its offset: where a divergence began, and
        which instance's snapshot carried it (a failing test's diagnosis, so it never
        raises: a history it cannot read says why instead)."""
        try:
            return self._snapshot_history(p, records)
        except Exception as exc:  # noqa: BLE001 - the assertion it explains must still show
            return [f"history unavailable: {exc!r}"]

    def _snapshot_history(self, p: int, records: list) -> list[str]:
        from grudge_stream.checkpoint.format import Manifest, manifest_key

        store = CheckpointStore(self.bootstrap, self.state.snapshot_topic)
        sp = store.snapshot_partition(p)
        key = manifest_key(self.state.operator_id, p)
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"hist-{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": False, "isolation.level": "read_committed"})
        try:
            low, high = c.get_watermark_offsets(TopicPartition(self.state.snapshot_topic, sp), timeout=10)
            c.assign([TopicPartition(self.state.snapshot_topic, sp, low)])
            manifests, deadline = [], time.monotonic() + 60
            while time.monotonic() < deadline:
                msgs = c.consume(500, timeout=0.5)
                manifests += [Manifest.decode(m.value(), m.offset()) for m in msgs
                              if not m.error() and m.key() == key]
                (pos,) = c.position([TopicPartition(self.state.snapshot_topic, sp)])
                if pos.offset >= high or (not msgs and pos.offset > 0):
                    break
        finally:
            c.close()
        lines = []
        for man in manifests:
            ref = man.current
            try:
                blob = store.load_ref(self.state.operator_id, p, ref)
            except Exception as exc:  # noqa: BLE001 - a diagnosis: say so and go on
                lines.append(f"@{man.offset} gen {ref.generation} next {ref.next_offset}: unreadable ({exc})")
                continue
            want = self.state.topology.make_operator(p)
            for m in records:
                if ref.next_offset is not None and m.offset() >= ref.next_offset:
                    break
                outcome = self.example.outcome_of(m.value())
                if outcome is not None and m.key():
                    want.apply_event(m.key(), self.example.DELTAS[outcome], offset=m.offset(),
                                     timestamp_ms=m.timestamp()[1])
            want.next_offset = ref.next_offset
            got = self.state.topology.make_operator(p)
            got.restore(blob)
            same = got.snapshot() == want.snapshot()
            lines.append(f"@{man.offset} gen {ref.generation} next {ref.next_offset} written {ref.written_ms}: "
                         f"{'same' if same else 'DIFFERS'}")
        store.close()
        return lines

    def close(self) -> None:
        for a in self.apps:
            if a.proc.poll() is None:
                a.proc.kill()
                a.proc.wait(10)


@pytest.fixture
def embedded(kafka_bootstrap, tmp_path):
    """``embedded(script, args, table=None)``: an ``EmbeddedScenario`` of an example app."""
    made: list[EmbeddedScenario] = []

    def make(script: Path, args: list[str], table: str | None = None) -> EmbeddedScenario:
        s = EmbeddedScenario(kafka_bootstrap, tmp_path, script, args, table)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


# -- running as an unprivileged user (tests/integration/test_deploy.py, test_image.py) ----------

def _run_probe(prefix: list[str], env: dict, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(prefix + [sys.executable, "-c", "import grudge_stream.cli, grudge_stream.topologies, faust"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def _sandbox(uid: int, gid: int):
    """(prefix, env, cwd, state): a command prefix that runs as ``uid``, its environment, a
    read-only working directory and a state directory only that user may write."""
    if os.geteuid() != 0:
        pytest.skip("switching to an unprivileged user needs root")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) not installed")
    base = Path(tempfile.mkdtemp(prefix="grudge-deploy-"))
    try:
        base.chmod(0o755)
        cwd = base / "cwd"
        cwd.mkdir()
        cwd.chmod(0o555)  # root's, read-only for everyone else
        state = base / "state"
        state.mkdir()
        os.chown(state, uid, gid)
        state.chmod(0o700)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GRUDGE_", "XDG_")) and k not in ("HOME", "USER", "LOGNAME")}
        env.update(HOME="/nonexistent", USER="nobody", LOGNAME="nobody")
        prefix = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs"]
        probe = _run_probe(prefix, env, str(cwd))
        if probe.returncode != 0:
            prefix = prefix[:-1] + ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
                                    "--bounding-set=-all,+dac_read_search", "--no-new-privs"]
            probe = _run_probe(prefix, env, str(cwd))
        if probe.returncode != 0:
            pytest.skip(f"uid {uid} cannot run {sys.executable}: {probe.stderr.strip()[-300:]}")
        yield prefix, env, cwd, state
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def sandbox():
    """As uid/gid 65534 (nobody), as a systemd DynamicUser would run."""
    yield from _sandbox(65534, 65534)


@pytest.fixture
def image_user():
    """As uid/gid 10001, the container image's user (deploy/Dockerfile)."""
    yield from _sandbox(10001, 10001)
