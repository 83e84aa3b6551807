"""Broker faults on a three-node cluster (``grudge_devkafka start --nodes 3``): replication
factor 3, ``min.insync.replicas=2``, brokers stopped, killed and restarted under load.

Each scenario feeds the crash harness's stream (planted abusers that raise and clear) while
it bounces brokers, then compares the outputs and final sketch state, identity by identity,
with an uninterrupted in-process replay of the same source records:

- lost: a score of the replay (one per source offset, ``emit_scores=every``) or an alert id
  that no output carries;
- dup: extra copies of an output (allowed at least once; 0 required under exactly_once);
- div: an output whose value differs from the replay's, an output the replay does not have,
  or a partition whose final sketch differs.

It also records the worker's exits, every ``/ready`` transition and the longest gap between
arrivals on the scores topic while traffic flows (the output stall).

``make test`` runs the short scenario (a rolling restart, then one broker down, batch
runtime) and one kill -9 scenario per runtime (the quorum leader under the batch runtime with
and without exactly-once, the snapshot partition's leader under Faust); ``make test-faults``
(``GRUDGE_FAULTS=1``) runs the full set in every runtime, and two exactly-once workers with
static membership through five kills of the quorum leader.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import pytest
from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from grudge_devkafka import LocalKafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

full_set = pytest.mark.skipif(not os.environ.get("GRUDGE_FAULTS"),
                              reason="the full fault set runs with `make test-faults` (GRUDGE_FAULTS=1)")


@pytest.fixture(scope="module")
def cluster():
    with LocalKafkaCluster(nodes=3, quiet=True) as c:
        yield c


# -- observing ------------------------------------------------------------------------------------

def http_status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class Watch:
    """A background thread: the worker's /ready transitions, its exit, and the arrival times of
    score records (assigned at the end of the scores topic)."""

    def __init__(self, h, worker, cluster: LocalKafkaCluster) -> None:
        self.h, self.worker, self.cluster = h, worker, cluster
        self.t0 = time.monotonic()
        self.ready: list[tuple[float, int | None]] = []
        self.arrivals: list[float] = []
        self.exit_code: int | None = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._probe, daemon=True),
                         threading.Thread(target=self._outputs, daemon=True)]
        for t in self._threads:
            t.start()

    def _probe(self) -> None:
        while not self._stop.is_set():
            rc = self.worker.proc.poll()
            if rc is not None and self.exit_code is None:
                self.exit_code = rc
            status = http_status(self.worker.web_port, "/ready")
            if not self.ready or self.ready[-1][1] != status:
                self.ready.append((round(time.monotonic() - self.t0, 1), status))
            self._stop.wait(0.5)

    def _outputs(self) -> None:
        c = Consumer({"bootstrap.servers": self.cluster.bootstrap, "group.id": "fault-watch",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 50, "log_level": 0})
        topic = self.h.topology.outputs["scores"]
        c.assign([TopicPartition(topic, p, OFFSET_END) for p in range(self.h.partitions)])
        try:
            while not self._stop.is_set():
                msgs = c.consume(1000, timeout=0.2)
                if any(not m.error() for m in msgs):
                    self.arrivals.append(time.monotonic())
        finally:
            c.close()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)

    def longest_stall(self, until: float) -> float:
        """The longest gap between score arrivals before ``until`` (monotonic)."""
        times = [t for t in self.arrivals if t <= until]
        return max((b - a for a, b in zip(times, times[1:])), default=float("nan"))

    def ready_transitions(self) -> str:
        return " ".join(f"{t:g}s:{s}" for t, s in self.ready)


# -- faults -----------------------------------------------------------------------------------------

def wait_in_sync(cluster: LocalKafkaCluster, timeout: float = 90.0) -> None:
    """Until every node is a broker again and every partition has all its replicas in sync
    (what an operator waits for between two restarts of a rolling upgrade)."""
    cluster.wait_for_brokers(len(cluster.nodes), timeout)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout
    while True:
        try:
            md = admin.list_topics(timeout=5)
            behind = [(t, p.id) for t, tm in md.topics.items() for p in tm.partitions.values()
                      if len(p.isrs) < len(p.replicas)]
            if not behind:
                return
        except KafkaException as exc:
            behind = [str(exc)]
        assert time.monotonic() < deadline, f"partitions not back in sync: {behind[:10]}"
        time.sleep(0.5)


def rolling_restart(cluster, h) -> None:
    for node in range(1, len(cluster.nodes) + 1):
        cluster.stop_node(node)
        cluster.start_node(node)
        wait_in_sync(cluster)


def one_broker_down(seconds: float):
    def fault(cluster, h) -> None:
        cluster.stop_node(2)
        time.sleep(seconds)
        cluster.start_node(2)
        wait_in_sync(cluster)
    return fault


def kill_quorum_leader(cluster, h) -> None:
    leader = cluster.quorum_leader()
    assert leader is not None
    cluster.kill_node(leader)
    time.sleep(10)
    cluster.start_node(leader)
    wait_in_sync(cluster)


def kill_snapshot_leader(cluster, h) -> None:
    leader = cluster.partition_leader(h.topology.snapshot_topic, 0)
    assert leader is not None
    cluster.kill_node(leader)
    time.sleep(10)
    cluster.start_node(leader)
    wait_in_sync(cluster)


def whole_cluster_down(seconds: float):
    def fault(cluster, h) -> None:
        for node in range(1, len(cluster.nodes) + 1):
            cluster.stop_node(node)
        time.sleep(seconds)
        cluster.start()  # every node together: one alone has no quorum to answer with
        wait_in_sync(cluster, timeout=180)
    return fault


def rolling_then_one_down(cluster, h) -> None:
    rolling_restart(cluster, h)
    one_broker_down(20)(cluster, h)


# -- the comparison ----------------------------------------------------------------------------------

@dataclass
class Result:
    lost: int = 0
    dup: int = 0
    div: int = 0
    exits: str = "none"
    ready: str = ""
    stall_s: float = float("nan")
    fault: str = ""  # seconds from the watch's start: the first fault action .. cluster back in sync
    notes: list[str] = field(default_factory=list)

    def row(self, name: str) -> str:
        return (f"{name}: lost={self.lost} dup={self.dup} div={self.div} exits={self.exits} "
                f"stall={self.stall_s:.1f}s fault={self.fault} ready=[{self.ready}]")


def compare(h, read_committed: bool) -> Result:
    recs = h.source_records()
    want_scores: dict[tuple[int, int], float] = {}
    want_alerts: set[str] = set()
    res = Result()
    state = h.final_state()
    for p in range(h.partitions):
        op = h.topology.make_operator(p)
        for o in op.process(recs.get(p, [])):
            body = json.loads(o.value)
            if o.role == "scores":
                want_scores[(body["source"]["partition"], body["source"]["offset"])] = body["score"]
            elif o.role == "alerts":
                want_alerts.add(body["alert_id"])
        if state[p] != op.sketch_bytes():
            res.div += 1
            res.notes.append(f"partition {p}: final sketch differs from the replay")
    assert want_scores and want_alerts, "the traffic should score and raise alerts"
    seen: Counter = Counter()
    for m in h.read_all(h.topology.outputs["scores"], read_committed=read_committed):
        body = json.loads(m.value())
        k = (body["source"]["partition"], body["source"]["offset"])
        seen[k] += 1
        if want_scores.get(k) != body["score"]:
            res.div += 1
    alerts = Counter(json.loads(m.value())["alert_id"]
                     for m in h.read_all(h.topology.outputs["alerts"], read_committed=read_committed))
    res.lost = len(set(want_scores) - set(seen)) + len(want_alerts - set(alerts))
    res.dup = sum(n - 1 for n in seen.values() if n > 1) + sum(n - 1 for n in alerts.values() if n > 1)
    res.div += len(set(alerts) - want_alerts)
    return res


def feed(h, events, seconds: float) -> threading.Thread:
    """Produce ``events`` spread over about ``seconds``, as the harness does, but waiting as long
    as a fault needs for the acknowledgements (the harness gives a flush 30 s)."""
    def run() -> None:
        chunk = max(1, len(events) // max(1, int(seconds * 20)))
        for i in range(0, len(events), chunk):
            for key, value, ts in events[i:i + chunk]:
                while True:
                    try:
                        h.producer.produce(h.topology.source_topic, key=key, value=value, timestamp=ts)
                        break
                    except BufferError:
                        h.producer.poll(0.05)
            h.producer.poll(0)
            time.sleep(0.05)
        deadline = time.monotonic() + 240
        while h.producer.flush(5) and time.monotonic() < deadline:
            pass
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def run_scenario(harness_on, cluster: LocalKafkaCluster, tmp_path, fault, runtime: str, exactly_once: bool = False,
                 events: int = 24_000, feed_s: float = 50.0) -> Result:
    wait_in_sync(cluster)
    settings = {"runtime": runtime, "emit_scores": "every", "session_timeout_s": 10,
                "heartbeat_interval_s": 1, "state_dir": str(tmp_path / "state")}
    if exactly_once:
        settings.update(exactly_once="true", transaction_timeout_s=20)
    h = harness_on(cluster.bootstrap, partitions=4, **settings)
    watch = None
    try:
        stream = h.make_events(events, seed=2600)
        h.produce(stream[:4000])
        w = h.start_worker()
        h.wait_caught_up(timeout=120)
        watch = Watch(h, w, cluster)
        feeder = feed(h, stream[4000:], seconds=feed_s)
        time.sleep(3)
        fault_start = time.monotonic() - watch.t0
        fault(cluster, h)
        fault_end = time.monotonic() - watch.t0
        feeder.join(300)
        assert not feeder.is_alive() and len(h.producer) == 0, "the producer did not finish"
        fed = time.monotonic()
        h.wait_caught_up(timeout=240)
        deadline = time.monotonic() + 30
        while http_status(w.web_port, "/ready") != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.5)  # the last /ready sample
        watch.stop()
        res = compare(h, read_committed=exactly_once)
        res.stall_s = watch.longest_stall(fed)
        res.ready = watch.ready_transitions()
        res.fault = f"{fault_start:.1f}s..{fault_end:.1f}s"
        if watch.exit_code is not None:
            res.exits = f"exited rc={watch.exit_code}"
        else:
            rc = w.stop()
            res.exits = "none" if rc == 0 else f"stop rc={rc}"
        res.notes.append(w.log()[-3000:] if res.exits != "none" else "")
        return res
    finally:
        if watch is not None:
            watch.stop()
        h.close()


def report(name: str, res: Result) -> None:
    line = res.row(name)
    print(line)
    path = os.environ.get("GRUDGE_FAULTS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def assert_survived(res: Result, exactly_once: bool = False) -> None:
    detail = "\n".join(n for n in res.notes if n)
    assert res.exits == "none", f"the worker exited: {res.exits}\n{detail}"
    assert res.lost == 0 and res.div == 0, f"{res.row('')}\n{detail}"
    if exactly_once:
        assert res.dup == 0, res.row("")
    assert res.ready.endswith(":200"), f"not ready at the end: {res.ready}"


# -- make test: the short scenario ----------------------------------------------------------------

def test_batch_worker_keeps_every_output_through_a_rolling_restart_and_a_broker_down(cluster, harness_on,
                                                                                    tmp_path):
    res = run_scenario(harness_on, cluster, tmp_path, rolling_then_one_down, "batch")
    report("batch rolling-restart+one-down-20s", res)
    assert_survived(res)


def test_topics_get_the_brokers_replication_and_bad_input_is_one_line(cluster, tmp_path):
    """replication_factor -1 means the brokers' default (3 here); more than the broker count, an
    unknown assignor and a cluster that never answers are each one line, exit 2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    env["GRUDGE_SEED"] = "00112233445566778899aabbccddeeff"
    run = f"rf-{os.getpid()}-{time.monotonic_ns() % 100000}"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "grudge_stream.cli", *args, "--set", f"app_name={run}",
                               "--set", f"source_topic={run}-events", "--set", f"snapshot_topic={run}-snap",
                               "--set", f"alerts_topic={run}-alerts", "--set", f"scores_topic={run}-scores",
                               "--set", f"dead_letter_topic={run}-dlq"],
                              capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)

    ok = cli("topics", "abuse_scores", "--bootstrap-servers", cluster.bootstrap, "--partitions", "2")
    assert ok.returncode == 0, ok.stderr
    assert f"{run}-snap: 2 partitions, replication 3 (created)" in ok.stdout, ok.stdout
    for args, words in (
        (["topics", "abuse_scores", "--bootstrap-servers", cluster.bootstrap, "--set", "replication_factor=4"],
         "replication_factor=4 is more than the 3 broker(s)"),
        (["worker", "abuse_scores", "--runtime", "batch", "--bootstrap-servers", cluster.bootstrap,
          "--set", "kafka.partition.assignment.strategy=sticky-ish"], "partition.assignment.strategy"),
        (["worker", "abuse_scores", "--runtime", "batch", "--bootstrap-servers", "127.0.0.1:9",
          "--set", "broker_wait_s=2"], "did not answer within"),
    ):
        bad = cli(*args)
        assert bad.returncode == 2, (args, bad.stderr[-2000:])
        lines = [ln for ln in bad.stderr.splitlines() if ln.startswith("grudge-stream ")]
        assert len(lines) == 1 and words in lines[0], bad.stderr[-2000:]
        assert "Traceback" not in bad.stderr, bad.stderr[-2000:]


def test_a_worker_started_against_a_loading_coordinator_waits_and_starts(harness_on, tmp_path):
    """A fresh cluster whose offsets topic does not exist yet: the first group's coordinator is
    loading while the worker checks the group (a TimeoutError traceback before)."""
    with LocalKafkaCluster(nodes=3, quiet=True, warm_up=False) as cold:
        h = harness_on(cold.bootstrap, partitions=2, runtime="batch", state_dir=str(tmp_path / "s"))
        try:
            h.produce(h.make_events(2000, seed=7))
            w = h.start_worker()
            h.wait_caught_up(timeout=120)
            assert w.proc.poll() is None, w.log()[-3000:]
            assert w.stop() == 0, w.log()[-3000:]
            assert "Traceback" not in w.log(), w.log()[-3000:]
        finally:
            h.close()


# -- make test-faults: the full set -----------------------------------------------------------------

SCENARIOS = {
    "rolling-restart": rolling_restart,
    "kill-9-quorum-leader": kill_quorum_leader,
    "kill-9-snapshot-leader": kill_snapshot_leader,
    "one-broker-down-60s": one_broker_down(60),
    "whole-cluster-down-45s": whole_cluster_down(45),
}


# `make test` (and so CI) runs one kill -9 scenario per runtime; `make test-faults` all of them.
IN_MAKE_TEST = {("kill-9-quorum-leader", "batch"), ("kill-9-quorum-leader", "batch-eos"),
                ("kill-9-snapshot-leader", "faust")}
CASES = [pytest.param(scenario, runtime, id=f"{scenario}-{runtime}",
                      marks=() if (scenario, runtime) in IN_MAKE_TEST else (full_set,))
         for runtime in ("batch", "faust", "batch-eos") for scenario in SCENARIOS]


@pytest.mark.parametrize("scenario, runtime", CASES)
def test_fault(cluster, harness_on, tmp_path, scenario: str, runtime: str) -> None:
    eos = runtime == "batch-eos"
    res = run_scenario(harness_on, cluster, tmp_path, SCENARIOS[scenario], "batch" if eos else runtime, exactly_once=eos)
    report(f"{runtime} {scenario}", res)
    assert_survived(res, exactly_once=eos)


# -- static membership: the group coordinator killed again and again ------------------------------

class Supervisor:
    """What the shipped manifests make Kubernetes do: a worker that exits is started again
    (any code but 0: a StatefulSet restarts it), and so is one whose ``/live`` failed three
    probes in a row (``failureThreshold: 3``, here every 2 s). It records every exit code,
    every liveness restart, and the longest time a worker stayed alive without being ready
    (a zombie stays so for ever)."""

    def __init__(self, h, workers: dict[str, object]) -> None:
        self.h, self.workers = h, workers
        self.exits: list[int] = []
        self.live_restarts = 0
        self.longest_unready_s = 0.0
        self._unready_since: dict[str, float | None] = {name: None for name in workers}
        self._fails: dict[str, int] = {name: 0 for name in workers}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _restart(self, name: str) -> None:
        old = self.workers[name]
        self.workers[name] = self.h.start_worker(web_port=old.web_port, group_instance_id=name)
        self._unready_since[name] = None
        self._fails[name] = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for name, w in list(self.workers.items()):
                rc = w.proc.poll()
                if rc is not None:
                    self.exits.append(rc)
                    self._restart(name)
                    continue
                if http_status(w.web_port, "/live") == 200:
                    self._fails[name] = 0
                else:
                    self._fails[name] += 1
                    if self._fails[name] >= 3 and http_status(w.web_port, "/live") is not None:
                        w.kill9()
                        self.live_restarts += 1
                        self._restart(name)
                        continue
                if http_status(w.web_port, "/ready") == 200:
                    self._unready_since[name] = None
                else:
                    since = self._unready_since[name] = self._unready_since[name] or now
                    self.longest_unready_s = max(self.longest_unready_s, now - since)
            self._stop.wait(2.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@full_set
def test_static_members_exactly_once_through_five_kills_of_the_quorum_leader(cluster, harness_on, tmp_path) -> None:
    """Two exactly-once workers with static membership (as the shipped manifests run them)
    while the quorum leader (group and transaction coordinator) is killed five times under
    load. A fenced consumer is replaced in place, or its worker ends with the fault code and
    is restarted: never exit code 2, never a worker alive and unready for good; 0 lost, 0
    duplicated, 0 divergent."""
    wait_in_sync(cluster)
    h = harness_on(cluster.bootstrap, partitions=4, runtime="batch", emit_scores="every", session_timeout_s=10,
                   heartbeat_interval_s=1, exactly_once="true", transaction_timeout_s=20, liveness_timeout_s=30,
                   state_dir=str(tmp_path / "state"))
    sup = None
    try:
        stream = h.make_events(30_000, seed=4040)
        h.produce(stream[:4000])
        workers = {name: h.start_worker(group_instance_id=name) for name in ("g0", "g1")}
        h.wait_caught_up(timeout=120)
        sup = Supervisor(h, workers)
        feeder = feed(h, stream[4000:], seconds=120)
        for _ in range(5):
            time.sleep(3)
            kill_quorum_leader(cluster, h)
        feeder.join(400)
        assert not feeder.is_alive() and len(h.producer) == 0, "the producer did not finish"
        h.wait_caught_up(timeout=300)
        deadline = time.monotonic() + 120
        while not all(http_status(w.web_port, "/ready") == 200 for w in sup.workers.values()):
            assert time.monotonic() < deadline, "workers not ready after the faults"
            time.sleep(1)
        sup.stop()
        res = compare(h, read_committed=True)
        logs = {name: w.log() for name, w in sup.workers.items()}
        stops = {name: w.stop() for name, w in sup.workers.items()}
        res.exits = f"exits={sup.exits} live_restarts={sup.live_restarts} stops={stops}"
        report(f"batch-eos static-members kill-9-quorum-leader x5 (longest unready "
               f"{sup.longest_unready_s:.0f}s)", res)
        detail = "\n".join(log[-2000:] for log in logs.values())
        assert 2 not in sup.exits and 2 not in stops.values(), f"{res.exits}\n{detail}"
        assert all(rc == 0 for rc in stops.values()), f"{res.exits}\n{detail}"
        assert sup.longest_unready_s < 180, f"a worker stayed unready {sup.longest_unready_s:.0f}s\n{detail}"
        assert res.lost == 0 and res.div == 0 and res.dup == 0, f"{res.row('')}\n{detail}"
    finally:
        if sup is not None:
            sup.stop()
        h.close()
