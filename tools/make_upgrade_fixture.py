"""Write the upgrade fixture: state of the released grudge-stream 0.2.0, as its workers wrote it.

Run it with the Python of an environment holding the 0.2.0 release (commit 07202d7,
"Release 0.2.0"; it is not on PyPI, so ``tools/release_venv.py`` builds it from git), against
a Kafka broker. The fixture in the repository was made with::

    make upgrade-fixture

which is, from the checkout::

    repo=$PWD
    .venv/bin/python tools/release_venv.py 0.2.0          # builds .cache/grudge-0.2.0-venv
    export KAFKA_BOOTSTRAP_SERVERS=$(cd / && "$repo/.venv/bin/python" -m grudge_devkafka start \
        --dir "$repo/.cache/kafka/upgrade-fixture")
    (cd / && "$repo/.cache/grudge-0.2.0-venv/bin/python" "$repo/tools/make_upgrade_fixture.py" \
        --out "$repo/tests/data/upgrade-0.2.0")
    (cd / && "$repo/.venv/bin/python" -m grudge_devkafka stop --dir "$repo/.cache/kafka/upgrade-fixture")

For each topology below it creates fresh topics, produces a deterministic event stream
(fixed seed, fixed hash key, fixed event timestamps) in two halves, runs one 0.2.0 batch
worker (``grudge-stream worker <topology> --runtime batch``) until its snapshots cover each
half, stops it with SIGTERM, and then writes ``<topology>.json``: every record of the source,
snapshot (chunks and manifests), alert and alert-state topics (partition, offset, timestamp,
key, value and headers, base64), and what the 0.2.0 code itself makes of them: for every
snapshot generation a manifest names, the SHA-256 of the blob 0.2.0's
``CheckpointStore.load_ref`` assembles, of the restored operator's ``snapshot()`` and
``sketch_bytes()``, and of a 0.2.0 replay of the source records below the generation's
``next_offset``; the raised set 0.2.0's ``AlertView`` reads from the alert-state topic
(``tests/data/upgrade-0.2.0/README.md`` has the layout).

The tests (tests/unit/test_upgrade_fixture.py, tests/integration/test_upgrade.py) check that
the current code reads the same state from these records.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
import zlib
from collections import defaultdict
from importlib.metadata import version
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from grudge_stream.checkpoint import CheckpointStore
from grudge_stream.checkpoint.format import Manifest, manifest_key
from grudge_stream.client import AlertView
from grudge_stream.operators.records import SourceRecord
from grudge_stream.topics import create_topics, ensure_topology_topics
from grudge_stream.topology import Settings, load_topology

RELEASE = "0.2.0"
COMMIT = "07202d7"
PARTITIONS = 2
EVENTS = 1600
# A fixed hash key: the fixture is public test data, never a deployment's key.
SEED = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z; the topics keep records forever (retention.ms=-1)

# Small shapes keep the fixture small; the chunk size (the smallest allowed) splits every
# snapshot into several chunks.
COMMON = {"checkpoint_interval_s": "0.5", "snapshot_replay_budget_s": "0", "snapshot_chunk_bytes": "1024",
          "seed": SEED}
TOPOLOGIES = {
    "abuse_scores": {"cells_per_level": "64"},
    "rate_limit": {"cells_per_level": "64", "rate_per_s": "2", "burst": "5"},
    "heavy_hitters": {"width": "64", "epoch_ms": "5000", "raise_at": "15", "clear_at": "5", "top_k": "5",
                      "report_interval_ms": "2000"},
    "dedup": {"capacity": "200", "period_ms": "5000"},
    "known_keys": {"capacity": "200", "period_ms": "5000"},
}


def topic_names(name: str) -> dict[str, str]:
    """Fixed names (the manifests record the source topic, so a restore needs the same one)."""
    p = f"upgrade-{RELEASE}-{name}"
    names = {"source_topic": f"{p}-events", "snapshot_topic": f"{p}-snapshots", "app_name": p,
             "operator_id": p, "dead_letter_topic": f"{p}-dlq"}
    names.update({"abuse_scores": {"alerts_topic": f"{p}-alerts", "scores_topic": f"{p}-scores"},
                  "rate_limit": {"decisions_topic": f"{p}-decisions"},
                  "heavy_hitters": {"alerts_topic": f"{p}-alerts", "reports_topic": f"{p}-top"},
                  "dedup": {"output_topic": f"{p}-out"},
                  "known_keys": {"checks_topic": f"{p}-checks"}}[name])
    return names


def settings_of(name: str) -> dict[str, str]:
    return {**COMMON, **TOPOLOGIES[name], **topic_names(name)}


def events(name: str) -> list[tuple[bytes, bytes, int]]:
    """(key, value, timestamp_ms): a few heavy or abusive keys among many ordinary ones."""
    rnd = random.Random(f"{name}-{RELEASE}")
    out, t = [], BASE_MS
    for i in range(EVENTS):
        quiet = i >= EVENTS * 3 // 4  # the hot keys go quiet for the last quarter, which spans more time
        t += rnd.randint(30, 70) if quiet else rnd.randint(0, 12)
        hot = rnd.random() < 0.15 and not quiet
        key = f"hot-{rnd.randrange(4)}" if hot else f"user-{rnd.randrange(300)}"
        if name == "abuse_scores":
            value = {"outcome": "bad" if rnd.random() < (0.9 if hot else 0.03) else "good"}
        elif name == "rate_limit":
            value = {"cost": rnd.choice([1, 1, 1, 2])}
        elif name == "known_keys":
            value = {"event": rnd.choice(["seen", "seen", "accepted", "rejected"])}
        else:
            value = {"n": i}
        out.append((key.encode(), json.dumps(value, separators=(",", ":")).encode(), t))
    return out


def b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def sha(b: bytes | None) -> str | None:
    return None if b is None else hashlib.sha256(b).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    present = [t for t in topics if t in admin.list_topics(timeout=30).topics]
    if not present:
        return
    for fut in admin.delete_topics(present).values():
        fut.result(60)
    deadline = time.monotonic() + 60
    while any(t in admin.list_topics(timeout=30).topics for t in present):
        assert time.monotonic() < deadline, f"topics {present} not deleted"
        time.sleep(0.5)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fixture-wm"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1]
                for p in range(PARTITIONS)}
    finally:
        c.close()


def read_all(bootstrap: str, topic: str) -> list:
    """Every record of ``topic`` (read_uncommitted: everything in the log), in offset order."""
    ends = end_offsets(bootstrap, topic)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"fixture-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    tps = [TopicPartition(topic, p, 0) for p in range(PARTITIONS) if ends[p] > 0]
    got: list = []
    deadline = time.monotonic() + 60
    try:
        if tps:
            c.assign(tps)
            while True:
                got += [m for m in c.consume(1000, timeout=0.5) if not m.error()]
                pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, tp.partition)
                                                                       for tp in tps])}
                if all(pos[p] >= ends[p] for p in pos):
                    break
                assert time.monotonic() < deadline, f"timed out reading {topic}"
    finally:
        c.close()
    return sorted(got, key=lambda m: (m.partition(), m.offset()))


RECORD_FIELDS = ["partition", "offset", "timestamp", "key", "value", "headers"]


def record(m) -> list:
    """One record as a list of RECORD_FIELDS (key, value and header values base64, or null)."""
    return [m.partition(), m.offset(), m.timestamp()[1], b64(m.key()), b64(m.value()),
            [[k, b64(v)] for k, v in (m.headers() or [])]]


def wait_covered(bootstrap: str, topology, worker: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    ends = end_offsets(bootstrap, topology.source_topic)
    store = CheckpointStore(bootstrap, topology.snapshot_topic)
    deadline = time.monotonic() + timeout
    try:
        while True:
            got = {}
            for p in range(PARTITIONS):
                m = store.read_manifest(topology.operator_id, p)
                got[p] = m.current.next_offset if m else None
            if all(got[p] is not None and got[p] >= ends[p] for p in range(PARTITIONS)):
                return
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not cover {ends} (snapshots at {got}):\n{log.read_text()[-4000:]}")
            time.sleep(0.3)
    finally:
        store.close()


def produce(bootstrap: str, topic: str, evs, partition_of) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i, (k, v, ts) in evs:
        p.produce(topic, key=k, value=v, timestamp=ts, partition=partition_of(i))
    assert p.flush(30) == 0


def run_topology(name: str, bootstrap: str, workdir: Path, venv_bin: Path) -> dict:
    settings = settings_of(name)
    topology = load_topology(name, Settings({**settings, "bootstrap_servers": bootstrap}, environ={}))
    topics = {"source": topology.source_topic, "snapshots": topology.snapshot_topic}
    for role in ("alerts", "alert_state"):
        if role in topology.outputs:
            topics[role] = topology.outputs[role]
    every = sorted({topology.source_topic, topology.snapshot_topic, *topology.outputs.values(),
                    *([topology.overrides_topic] if topology.overrides_topic else [])})
    delete_topics(bootstrap, every)
    # Event times are fixed and in the past: no topic may delete them for their age.
    keep = {"retention.ms": "-1"}
    create_topics(bootstrap, {t: (PARTITIONS, dict(keep)) for t in
                              {topology.source_topic, *(v for r, v in topology.outputs.items() if r != "alert_state")}})
    ensure_topology_topics(topology, bootstrap, partitions=PARTITIONS)

    evs = list(enumerate(events(name)))
    partition_of = lambda i: zlib.crc32(evs[i][1][0]) % PARTITIONS  # noqa: E731 - by key
    half = len(evs) // 2
    produce(bootstrap, topology.source_topic, evs[:half], partition_of)

    log = workdir / f"{name}-worker.log"
    cmd = [str(venv_bin / "grudge-stream"), "worker", name, "--runtime", "batch", "--bootstrap-servers", bootstrap,
           "--web-port", str(free_port()), "--loglevel", "info", "--no-create-topics"]
    for k, v in {**settings, "state_dir": str(workdir / f"{name}-state")}.items():
        cmd += ["--set", f"{k}={v}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    with open(log, "wb") as f:
        worker = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(workdir))
    try:
        wait_covered(bootstrap, topology, worker, log)
        produce(bootstrap, topology.source_topic, evs[half:], partition_of)
        wait_covered(bootstrap, topology, worker, log)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        rc = worker.wait(60)
    if rc != 0:
        raise SystemExit(f"{name}: worker exited {rc}:\n{log.read_text()[-4000:]}")

    records = {role: [record(m) for m in read_all(bootstrap, t)] for role, t in topics.items()}
    return {"records": records, "expected": expected(name, bootstrap, topology, records),
            "topics": topics}


def expected(name: str, bootstrap: str, topology, records: dict) -> dict:
    """What 0.2.0 makes of the records: per partition, every generation a manifest names."""
    source: dict[int, list[SourceRecord]] = defaultdict(list)
    for p, off, ts, k, v, _headers in records["source"]:
        source[p].append(SourceRecord(topology.source_topic, p, off, ts, base64.b64decode(k), base64.b64decode(v)))
    store = CheckpointStore(bootstrap, topology.snapshot_topic)
    out: dict = {"partitions": {}}
    for p in range(PARTITIONS):
        key = manifest_key(topology.operator_id, p)
        manifests = [Manifest.decode(base64.b64decode(v), off) for sp, off, _ts, k, v, _h in records["snapshots"]
                     if sp == store.snapshot_partition(p) and k == b64(key)]
        gens: dict[int, dict] = {}
        for man in manifests:
            for ref in (man.current, man.previous):
                if ref is None or ref.generation in gens:
                    continue
                try:
                    blob = store.load_ref(topology.operator_id, p, ref)
                except Exception as exc:  # noqa: BLE001 - compacted away: recorded as such
                    gens[ref.generation] = {"generation": ref.generation, "loads": False, "why": str(exc)}
                    continue
                op = topology.make_operator(p)
                op.restore(blob)
                replay = topology.make_operator(p)
                replay.process([r for r in source[p] if ref.next_offset is None or r.offset < ref.next_offset])
                gens[ref.generation] = {
                    "generation": ref.generation, "loads": True, "next_offset": ref.next_offset,
                    "blob_sha256": sha(blob), "size": len(blob),
                    "resnapshot_sha256": sha(op.snapshot()),
                    "sketch_sha256": sha(op.sketch_bytes()) if hasattr(op, "sketch_bytes") else None,
                    "replay_snapshot_sha256": sha(replay.snapshot()),
                    "replay_sketch_sha256": sha(replay.sketch_bytes()) if hasattr(replay, "sketch_bytes") else None,
                }
        newest = store.restore(topology.operator_id, p)
        out["partitions"][str(p)] = {
            "generations": [gens[g] for g in sorted(gens)],
            "restored_generation": newest.ref.generation if newest.ref else None,
            "restored_sha256": sha(newest.blob),
        }
    store.close()
    if "alert_state" in topology.outputs:
        view = AlertView(bootstrap, topology.outputs["alert_state"], topology.overrides_topic)
        view.start(60)
        try:
            out["raised"] = sorted(b64(k) for k in view.raised())
        finally:
            view.stop()
    return out


def is_the_release() -> bool:
    """The imported package is the release commit's source (the version number alone does not say:
    the development tree carries 0.2.0 too until the next release)."""
    import grudge_stream

    pkg = Path(grudge_stream.__file__).parent
    root = Path(__file__).resolve().parents[1]
    for rel in ("cli.py", "checkpoint/format.py", "checkpoint/store.py", "operators/base.py", "topology.py"):
        want = subprocess.run(["git", "-C", str(root), "show", f"{COMMIT}:grudge_stream/{rel}"],
                              capture_output=True, check=True).stdout
        if not (pkg / rel).is_file() or (pkg / rel).read_bytes() != want:  # a module since split
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--out", required=True, help="the fixture folder (tests/data/upgrade-0.2.0)")
    ap.add_argument("--topology", action="append", help="only these (default: all of TOPOLOGIES)")
    args = ap.parse_args()
    if not args.bootstrap_servers:
        ap.error("--bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS")
    have = version("grudge-stream")
    if have != RELEASE or not is_the_release():
        raise SystemExit(f"this writes the state of grudge-stream {RELEASE} as released ({COMMIT}); the running "
                         f"Python ({sys.executable}) has {have} built from another tree. Run it with the venv "
                         "of tools/release_venv.py.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"grudge-upgrade-fixture-{uuid.uuid4().hex[:6]}"
    workdir.mkdir()
    venv_bin = Path(sys.executable).parent
    for name in args.topology or list(TOPOLOGIES):
        t0 = time.monotonic()
        got = run_topology(name, args.bootstrap_servers, workdir, venv_bin)
        doc = {"release": RELEASE, "commit": COMMIT, "written_by": f"grudge-stream {have}",
               "topology": name, "partitions": PARTITIONS, "settings": settings_of(name),
               "record_fields": RECORD_FIELDS, **got}
        path = out / f"{name}.json"
        path.write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")
        counts = {role: len(rs) for role, rs in got["records"].items()}
        print(f"{name}: {counts} -> {path} ({path.stat().st_size} bytes, {time.monotonic() - t0:.1f} s)")


if __name__ == "__main__":
    try:
        main()
    except KafkaException as exc:
        raise SystemExit(f"Kafka: {exc}") from None
