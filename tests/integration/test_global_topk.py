"""heavy_hitters and heavy_global workers end to end: the global record of each report
interval equals the exact top-k of a keyed Zipf stream over 4 partitions."""
from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from grudge_devkafka import free_port
from grudge_stream.topics import ensure_topology_topics
from grudge_stream.topology import Settings, load_topology

P = 4
K = 8
INTERVAL = 1000
INTERVALS = 4


def start(topology: str, settings: dict, bootstrap: str, tmp_path, name: str) -> tuple[subprocess.Popen, object]:
    log = open(tmp_path / f"{name}.log", "wb")
    cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", topology, "--bootstrap-servers", bootstrap,
           "--web-port", str(free_port()), "--loglevel", "info", "--no-create-topics"]
    for k, v in {"state_dir": str(tmp_path / f"state-{name}"), **settings}.items():
        cmd += ["--set", f"{k}={v}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path)), log


def read_global(bootstrap: str, topic: str, want: int, deadline: float) -> list[dict]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "fetch.queue.backoff.ms": 1})
    got: list[dict] = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(P)])
        while len(got) < want and time.monotonic() < deadline:
            for m in c.consume(100, timeout=0.5):
                if not m.error():
                    got.append(json.loads(m.value()))
    finally:
        c.close()
    return got


@pytest.mark.parametrize("hh_runtime, hg_runtime", [("batch", "faust"), ("faust", "batch")])
def test_heavy_global_worker_emits_the_exact_global_top_k(kafka_bootstrap, tmp_path, hh_runtime,
                                                          hg_runtime) -> None:
    run = uuid.uuid4().hex[:8]
    hh = {"source_topic": f"gt-{run}-requests", "reports_topic": f"gt-{run}-top", "alerts_topic": f"gt-{run}-alerts",
          "dead_letter_topic": f"gt-{run}-hh-dlq", "snapshot_topic": f"gt-{run}-hh-snap",
          "operator_id": f"hh-{run}", "width": "16384", "epoch_ms": str(10**12), "top_k": str(K),
          "report_interval_ms": str(INTERVAL), "raise_at": "1e9", "clear_at": "1",
          "checkpoint_interval_s": "1.0", "seed": secrets.token_hex(16), "runtime": hh_runtime}
    hg = {"source_topic": hh["reports_topic"], "global_reports_topic": f"gt-{run}-global",
          "dead_letter_topic": f"gt-{run}-hg-dlq", "snapshot_topic": f"gt-{run}-hg-snap",
          "operator_id": f"hg-{run}", "checkpoint_interval_s": "1.0", "runtime": hg_runtime}
    heavy = load_topology("heavy_hitters", Settings(hh, environ={}))
    ensure_topology_topics(heavy, kafka_bootstrap, partitions=P, create_source=True)
    ensure_topology_topics(load_topology("heavy_global", Settings(hg, environ={})), kafka_bootstrap)

    # A Zipf stream keyed by the counted key (the default partitioner keeps a key in one
    # partition), then one tick per partition at the last interval's end to close it.
    rnd = random.Random(3)
    names = [f"10.9.{r // 200}.{r % 200}".encode() for r in range(1500)]
    weights = [1 / (r ** 1.3) for r in range(1, len(names) + 1)]
    t0 = (time.time_ns() // 1_000_000 - 120_000) // INTERVAL * INTERVAL
    n = 12_000
    events = [(k, t0 + i * INTERVAL * INTERVALS // n) for i, k in enumerate(rnd.choices(names, weights, k=n))]
    end = t0 + INTERVALS * INTERVAL
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for key, ts in events:
        producer.produce(hh["source_topic"], key=key, value=b"", timestamp=ts)
    for p in range(P):
        producer.produce(hh["source_topic"], key=b"tick", value=b"", timestamp=end, partition=p)
    assert producer.flush(30) == 0

    procs = [start("heavy_hitters", hh, kafka_bootstrap, tmp_path, "hh"),
             start("heavy_global", hg, kafka_bootstrap, tmp_path, "hg")]
    try:
        got = read_global(kafka_bootstrap, hg["global_reports_topic"], INTERVALS, time.monotonic() + 90)
    finally:
        for proc, log in procs:
            proc.kill()
            proc.wait(10)
            log.close()
    logs = "\n".join((tmp_path / f"{x}.log").read_text(errors="replace")[-3000:] for x in ("hh", "hg"))
    assert sorted(g["interval_end_ms"] for g in got) == [t0 + i * INTERVAL for i in range(1, INTERVALS + 1)], logs
    for g in got:
        assert g["complete"] and g["exact"] and g["partitions"] == P and g["id"]
        counts = Counter(k.decode() for k, ts in events if ts < g["interval_end_ms"])
        want = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:K]
        got_top = [(e["key"], e["estimate"]) for e in g["top"]]
        assert [c for _, c in got_top] == [c for _, c in want]
        kth = want[-1][1]
        assert {k for k, c in got_top if c > kth} == {k for k, c in want if c > kth}
