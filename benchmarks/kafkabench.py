"""Helpers for the benchmarks that need a real broker and worker processes.

- ``broker()``: the broker of ``KAFKA_BOOTSTRAP_SERVERS``, else a throwaway local
  KRaft broker (``grudge_devkafka.LocalKafka``, tools/devkafka) for the duration of the script;
- ``produce_events()``: a fixed event topic (JSON outcomes keyed by 16-byte client ids,
  record timestamp = event time) written once with confluent-kafka;
- ``Proc``: a worker subprocess started in its own scratch directory (never the source
  tree, whose uncompiled package would shadow the installed one), with CPU time and RSS
  read from ``/proc/PID/{stat,status}`` and a stop that always ends it;
- ``metrics_sum()`` / ``http_get()``: polling a grudge-stream worker's web pages;
- ``loadavg()``.

Nothing here talks to anything but 127.0.0.1 (the broker address given, and worker ports).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
BASE_TS_MS = 1_700_000_000_000

BAD = b'{"outcome":"bad"}'
GOOD = b'{"outcome":"good"}'


# -- broker ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def broker() -> Iterator[str]:
    """Yield a bootstrap address: $KAFKA_BOOTSTRAP_SERVERS, or a local broker started here."""
    bs = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bs:
        yield bs
        return
    from grudge_devkafka import LocalKafka

    with LocalKafka() as kafka:
        print(f"# started a local broker at {kafka.bootstrap} (set KAFKA_BOOTSTRAP_SERVERS to reuse one)",
              flush=True)
        yield kafka.bootstrap


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict | None = None) -> None:
    from grudge_stream.topics import create_topics

    create_topics(bootstrap, {topic: (partitions, dict(config or {}))})


def delete_topics(bootstrap: str, prefix: str) -> int:
    """Delete every topic whose name starts with ``prefix`` (best effort)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    names = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix)]
    if names:
        for fut in admin.delete_topics(names, operation_timeout=30).values():
            try:
                fut.result(60)
            except Exception as exc:  # noqa: BLE001 - cleanup is best effort
                print(f"# could not delete a topic: {exc}", file=sys.stderr)
    return len(names)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1]
                for p in range(partitions)}
    finally:
        c.close()


def client_keys(n: int, seed: int = 7) -> list[bytes]:
    """``n`` distinct 16-byte ASCII client ids (hex of a random permutation, so no collisions)."""
    rng = np.random.default_rng(seed)
    # A random odd multiplier and offset make i -> ids distinct in 2^64 and scattered.
    mult = int(rng.integers(1, 2**62)) * 2 + 1
    off = int(rng.integers(0, 2**63))
    mask = (1 << 64) - 1
    return [format((i * mult + off) & mask, "016x").encode() for i in range(n)]


# Event topics keep their records whatever their timestamps: the broker's default
# retention (7 days, judged by record timestamps) would otherwise delete a stream stamped
# in the past while a worker reads it, and the consumer would silently jump to the end.
EVENT_TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1"}


def produce_events(bootstrap: str, topic: str, *, partitions: int, records: int, keys: int,
                   bad_fraction: float = 0.1, step_ms: float = 1.0, seed: int = 11,
                   create: bool = True, end_ms: int | None = None) -> dict:
    """Write ``records`` events over ``keys`` distinct keys to a new topic; return a summary.

    Key ``i`` of record ``i`` is ``ids[perm[i % keys]]``: with ``keys == records`` every key
    appears once; with fewer keys each appears ``records / keys`` times. Event time advances
    ``step_ms`` per record and the last record is stamped ``end_ms`` (default: now), so
    every run of a script reads the same stream, and it looks like recent traffic.
    """
    from confluent_kafka import Producer

    if create:
        create_topic(bootstrap, topic, partitions, EVENT_TOPIC_CONFIG)
    if end_ms is None:
        end_ms = time.time_ns() // 1_000_000
    base_ms = end_ms - int((records - 1) * step_ms)
    ids = client_keys(keys, seed)
    rng = np.random.default_rng(seed + 1)
    perm = rng.permutation(keys)
    bad = rng.random(records) < bad_fraction
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000,
                         "enable.idempotence": True})
    t0 = time.perf_counter()
    produce = producer.produce
    for i in range(records):
        key = ids[perm[i % keys]]
        ts = base_ms + int(i * step_ms)
        while True:
            try:
                produce(topic, value=BAD if bad[i] else GOOD, key=key, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 100_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} records undelivered")
    seconds = time.perf_counter() - t0
    ends = end_offsets(bootstrap, topic, partitions)
    total = sum(ends.values())
    if total != records:
        raise RuntimeError(f"topic {topic} holds {total} records, expected {records}")
    return {"topic": topic, "records": records, "keys": keys, "partitions": partitions, "base_ms": base_ms,
            "produce_seconds": round(seconds, 2), "per_partition": ends}


# -- processes ------------------------------------------------------------------------------------

def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def proc_status_kb(pid: int, field: str) -> int | None:
    """A ``kB`` field of /proc/PID/status (VmRSS, VmHWM, ...)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def free_port() -> int:
    from grudge_devkafka import free_port as fp

    return fp()


class Proc:
    """A benchmark subprocess, started in a scratch directory, stopped on exit whatever happens."""

    def __init__(self, cmd: Sequence[str], log_path: Path, cwd: Path, env: dict | None = None) -> None:
        self.cmd = list(cmd)
        self.log_path = log_path
        self._log = open(log_path, "wb")
        environ = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
        environ.update(env or {})
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(cwd),
                                     env=environ)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu(self) -> float | None:
        return proc_cpu_seconds(self.pid)

    def rss_kb(self) -> int | None:
        return proc_status_kb(self.pid, "VmRSS")

    def hwm_kb(self) -> int | None:
        return proc_status_kb(self.pid, "VmHWM")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (graceful), then SIGKILL after ``timeout``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def scratch_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def python() -> str:
    return sys.executable


# -- grudge-stream worker pages -------------------------------------------------------------------

def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, OSError):
        return 0, b""


_SAMPLE = re.compile(rb"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", re.M)


def metrics_sum(text: bytes, name: str) -> float:
    """Sum of every sample of metric ``name`` in Prometheus text."""
    total = 0.0
    want = name.encode()
    for m in _SAMPLE.finditer(text):
        if m.group(1) == want:
            total += float(m.group(3))
    return total


def metric_samples(text: bytes, name: str) -> list[tuple[str, float]]:
    want = name.encode()
    return [((m.group(2) or b"").decode(), float(m.group(3))) for m in _SAMPLE.finditer(text)
            if m.group(1) == want]


def grudge_worker_cmd(topology: str, bootstrap: str, web_port: int, settings: dict,
                      loglevel: str = "warning", runtime: str | None = None) -> list[str]:
    cmd = [python(), "-m", "grudge_stream.cli", "worker", topology, "--bootstrap-servers", bootstrap,
           "--web-port", str(web_port), "--loglevel", loglevel]
    if runtime:
        cmd += ["--runtime", runtime]
    for k, v in settings.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"
