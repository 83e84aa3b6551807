"""grudge-stream beside the tools a team would pick instead: Kafka Streams, Quix Streams, Faust.

The ``abuse_scores`` job (per-client score, bad +0.04 / good -0.001, exponential decay in
event time at 0.01/s, clamp to [0, 1], raised at 0.5 / cleared at 0.25, alerts on crossings)
run by each system over one source topic per size (8 partitions, bench_batch.py's
generator: uniform keys ``client-%08d``, every 5000th client abusive, 2% background bad,
plus --planted abusers ``abuser-%05d`` with 20 events each, 90% bad, at random positions,
so that every size has keys to raise):

  ks            Kafka Streams 4.4, Processor API, persistent RocksDB store + changelog,
                record cache on, at-least-once (benchmarks/peers/kstreams)
  ks-eos        the same application with processing.guarantee=exactly_once_v2
  quix          Quix Streams 3.28, stateful apply on its RocksDB state + changelog
                (benchmarks/peers/quix_app.py, run from its own venv)
  quix-grudge   the same Quix application with the score in grudge-stream's ScoreState
                (grudge_stream.quix; benchmarks/peers/quix_grudge_app.py, run with the
                project's interpreter): Quix's own state against ours, in a Quix app
  faust-table   the exact Faust Table worker (benchmarks/faust_baseline_worker.py --mode
                table), over the first --faust-events events only (it runs at ~4k/s)
  grudge-batch  `grudge-stream worker abuse_scores --runtime batch`
  grudge-lean   the same topology on the Faust runtime, drain=batch (the lean drain)

Every system's process runs on the same C allocator (--allocator): by default jemalloc where
its library loads (as in grudge-stream's container image; preloaded into the JVM, Quix and
grudge-stream alike), else the system's malloc.

Commit interval / checkpoint interval 5 s for all (--commit-s), Kafka Streams' record cache
10 MiB (its default), static group membership for all that have it (group.instance.id =
the run id: a restarted instance takes its partitions back at once instead of waiting out
the dead one's session timeout). Each round runs every system in turn (interleaved), and
for each:

  1. throughput: a fresh application id reads the topic from the beginning; the worker
     notes (in-process) the time and process CPU clock of the first record and of the
     N-th (events/s and CPU-s per million events over that window; also the process's
     whole CPU clock at the N-th, startup included); then we wait --settle-s (a
     commit/checkpoint), read peak RSS (VmHWM), the local
     state directory's size and the bytes of the run's changelog/snapshot topics in the
     broker's log directory, and kill -9 the worker;
  2. restart, state kept: one probe record per partition is appended, the worker is
     restarted on the same application id and state directory; restart time = kill -9 to
     its first processed record;
  3. restart, state lost: killed again, probe records appended, the local state directory
     deleted (a pod rescheduled to another node), restarted; the same timing.

Alerts (the throughput run's alert topic) give the raised-key sets: exact peers are
compared with each other, grudge-stream with Kafka Streams (precision / recall of raised
keys, detection delay in source offsets and event-time ms).

    .venv/bin/python benchmarks/peers/run_peers.py --sizes 10000:200000 --runs 1 --broker-data-dir DIR   # ~5 min
    make bench-peers PEERS_ARGS="--sizes 10000:500000,1000000:2000000 --runs 3"

Needs KAFKA_BOOTSTRAP_SERVERS and --broker-data-dir (the broker's log.dirs), as `make
bench-peers` sets up. Builds the Kafka Streams app (mvn -q package) and the Quix venv
(.cache/peers/quix-venv) on first use. Results: --out JSON (plot_peers.py draws it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from bench_batch import PARTS, produce  # noqa: E402  (the standard generator)
from bench_faust import TIMED_WORKER, BASELINE_WORKER, grudge_settings  # noqa: E402
from kafkabench import GOOD, Proc, create_topic, free_port, grudge_worker_cmd, loadavg, proc_status_kb, python  # noqa: E402

KSTREAMS = HERE / "kstreams"
CACHE = ROOT / ".cache" / "peers"
QUIX_VENV = CACHE / "quix-venv"
QUIX_VERSION = "3.28.1"
SYSTEMS = ("ks", "ks-eos", "quix", "quix-grudge", "faust-table", "grudge-batch", "grudge-lean")
# wall-clock epoch -> this process's monotonic clock (the Java and Quix workers print epoch ms)
EPOCH_TO_MONO = time.time() - time.monotonic()


# -- setup ----------------------------------------------------------------------------------------

def build_kstreams() -> None:
    jar = KSTREAMS / "target" / "abuse-scores-kstreams-1.0.jar"
    srcs = [KSTREAMS / "pom.xml", *KSTREAMS.joinpath("src").rglob("*.java")]
    if jar.exists() and (KSTREAMS / "target" / "lib").is_dir() and \
            all(s.stat().st_mtime < jar.stat().st_mtime for s in srcs):
        return
    print("# building the Kafka Streams app (mvn -q package)", flush=True)
    subprocess.run(["mvn", "-q", "-B", "package"], cwd=KSTREAMS, check=True)


def quix_python() -> str:
    py = QUIX_VENV / "bin" / "python"
    if not py.exists():
        print(f"# creating {QUIX_VENV} with quixstreams=={QUIX_VERSION} and matplotlib", flush=True)
        subprocess.run(["python3", "-m", "venv", str(QUIX_VENV)], check=True)
    r = subprocess.run([str(py), "-c", "import quixstreams, matplotlib"], capture_output=True)
    if r.returncode:
        subprocess.run([str(py), "-m", "pip", "install", "-q", f"quixstreams=={QUIX_VERSION}", "matplotlib"],
                       check=True)
    return str(py)


def versions(quix_py: str) -> dict:
    v = {"kafka-streams": "4.4.0", "python": sys.version.split()[0]}
    out = subprocess.run([quix_py, "-c", "import quixstreams; print(quixstreams.__version__)"],
                         capture_output=True, text=True)
    v["quixstreams"] = out.stdout.strip()
    out = subprocess.run([python(), "-c", "import faust, grudge_stream, confluent_kafka; "
                          "print(faust.__version__, grudge_stream.__version__, confluent_kafka.__version__)"],
                         capture_output=True, text=True, cwd="/")
    parts = out.stdout.split()
    if len(parts) == 3:
        v["faust-streaming"], v["grudge-stream"], v["confluent-kafka"] = parts
    j = subprocess.run(["java", "-version"], capture_output=True, text=True)
    v["java"] = (j.stderr.splitlines() or ["?"])[0]
    return v


# -- measuring helpers ----------------------------------------------------------------------------

def du_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def state_topic_bytes(data_dir: Path, marker: str) -> int:
    """Bytes on the broker's disk of the topics whose name holds ``marker`` and that hold state
    (changelogs, snapshots): segment files, before compaction (segments roll at 1 GiB)."""
    total = 0
    for d in data_dir.iterdir():
        name = d.name
        if marker in name and ("changelog" in name or "snapshot" in name or "-snap" in name):
            # segment files only (index files are preallocated sparse files)
            total += sum(f.stat().st_size for f in d.iterdir() if f.name.endswith(".log"))
    return total


class LogLines:
    """Tagged lines (``FIRST ...``, ``DONE ...``) printed by the Java and Quix workers."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.tags, self.buf = path, 0, {}, b""

    def poll(self) -> dict:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
                self.pos += len(data)
        except OSError:
            return self.tags
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            parts = line.decode(errors="replace").split()
            if parts and parts[0] in ("FIRST", "DONE", "START") and parts[0] not in self.tags:
                self.tags[parts[0]] = parts[1:]
        return self.tags


def newest_timestamp(bs: str, topic: str) -> int:
    """The newest record timestamp of the topic (ms)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": "peers-probe", "enable.auto.commit": False})
    ts = 0
    try:
        for p in range(PARTS):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if hi > lo:
                c.assign([TopicPartition(topic, p, hi - 1)])
                m = c.poll(10)
                if m is not None and m.error() is None:
                    ts = max(ts, m.timestamp()[1])
    finally:
        c.close()
    return ts


_PRODUCER = None


def probe(bs: str, topic: str, tag: str, ts: int) -> None:
    """One ``good`` record per partition under new keys, stamped with the topic's newest event
    time (so no stream time jumps): something to process after a restart."""
    global _PRODUCER
    from confluent_kafka import Producer

    if _PRODUCER is None:
        _PRODUCER = Producer({"bootstrap.servers": bs, "linger.ms": 0})
    for p in range(PARTS):
        _PRODUCER.produce(topic, key=f"probe-{tag}-{p}".encode(), value=GOOD, partition=p, timestamp=ts)
    _PRODUCER.flush(30)


def read_alerts(bs: str, topic: str) -> list[dict]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": f"peers-read-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    out = []
    try:
        md = c.list_topics(topic, timeout=30).topics.get(topic)
        if md is None or md.error is not None:
            return []
        tps, ends = [], {}
        for p in md.partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if hi > lo:
                tps.append(TopicPartition(topic, p, lo))
                ends[p] = hi
        if not tps:
            return []
        c.assign(tps)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            msgs = c.consume(10_000, timeout=1.0)
            for m in msgs:
                if m.error() is None:
                    try:
                        out.append(json.loads(m.value()))
                    except (TypeError, ValueError):
                        pass
            # positions pass transaction markers too
            if not msgs and all(tp.offset >= ends[tp.partition]
                                for tp in c.position([TopicPartition(topic, p) for p in ends])):
                break
    finally:
        c.close()
    return out


def raised_keys(alerts: list[dict]) -> dict[str, dict]:
    """key -> its first ``raised`` alert."""
    first: dict[str, dict] = {}
    for a in alerts:
        if a.get("state") == "raised" and a.get("key") and a["key"] not in first:
            first[a["key"]] = a
    return first


def agreement(got: dict[str, dict], exact: dict[str, dict]) -> dict:
    common = set(got) & set(exact)
    d_off, d_ms = [], []
    for k in common:
        g, e = got[k], exact[k]
        if g["source"]["partition"] == e["source"]["partition"]:
            d_off.append(g["source"]["offset"] - e["source"]["offset"])
        d_ms.append(g["event_time_ms"] - e["event_time_ms"])
    return {
        "raised": len(got), "exact_raised": len(exact), "common": len(common),
        "precision": len(common) / len(got) if got else (1.0 if not exact else 0.0),
        "recall": len(common) / len(exact) if exact else 1.0,
        "extra": len(set(got) - set(exact)), "missed": len(set(exact) - set(got)),
        "delay_offsets_median": statistics.median(d_off) if d_off else None,
        "delay_offsets_max": max(d_off) if d_off else None,
        "delay_ms_median": statistics.median(d_ms) if d_ms else None,
        "delay_ms_max": max(d_ms) if d_ms else None,
    }


# -- the systems ----------------------------------------------------------------------------------

class System:
    """One peer: how to start it, and when it processed its first / N-th record."""

    def __init__(self, name: str, args, bs: str, topic: str, quix_py: str) -> None:
        self.name, self.args, self.bs, self.topic, self.quix_py = name, args, bs, topic, quix_py

    def setup(self, run_id: str) -> None:
        self.run_id = run_id
        self.work = Path(tempfile_dir(f"peers-{self.name}-"))
        self.state_dir = self.work / "state"
        self.state_dir.mkdir()
        self.alerts_topic = f"{run_id}-alerts"
        # one web port for every phase: with static membership Faust's assignor finds the
        # previous member's URL in its assignment and asserts it is its own
        self.port = free_port()
        if self.name in ("ks", "ks-eos", "quix"):
            # Kafka Streams does not create its sink topics (the broker does not auto-create)
            create_topic(self.bs, self.alerts_topic, PARTS)

    def events(self, n: int) -> int:
        return min(n, self.args.faust_events) if self.name == "faust-table" else n

    def start(self, phase: str, expected: int) -> tuple[Proc, object]:
        a, n = self.args, self.name
        out = self.work / f"{phase}.json"
        env = None
        if n in ("ks", "ks-eos"):
            cp = f"{KSTREAMS / 'target' / 'classes'}:{KSTREAMS / 'target' / 'lib'}/*"
            cmd = ["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", cp, "grudge.peers.AbuseScores",
                   "--bootstrap", self.bs, "--topic", self.topic, "--app-id", self.run_id,
                   "--alerts-topic", self.alerts_topic, "--state-dir", str(self.state_dir),
                   "--expected", str(expected), "--commit-ms", str(int(a.commit_s * 1000)),
                   "--eos", "true" if n == "ks-eos" else "false", "--instance-id", self.run_id]
            w = LogLines(self.work / f"{phase}.log")
        elif n == "quix":
            cmd = [self.quix_py, str(HERE / "quix_app.py"), "--bootstrap", self.bs, "--topic", self.topic,
                   "--app-id", self.run_id, "--alerts-topic", self.alerts_topic, "--state-dir", str(self.state_dir),
                   "--expected", str(expected), "--commit-interval", str(a.commit_s), "--instance-id", self.run_id]
            w = LogLines(self.work / f"{phase}.log")
        elif n == "quix-grudge":
            cmd = [python(), str(HERE / "quix_grudge_app.py"), "--bootstrap", self.bs, "--topic", self.topic,
                   "--app-id", self.run_id, "--alerts-topic", self.alerts_topic, "--state-dir", str(self.state_dir),
                   "--expected", str(expected), "--commit-interval", str(a.commit_s), "--instance-id", self.run_id]
            w = LogLines(self.work / f"{phase}.log")
        elif n == "faust-table":
            cmd = [python(), str(BASELINE_WORKER), "--bootstrap", self.bs, "--topic", self.topic,
                   "--partitions", str(PARTS), "--expected", str(expected), "--app-id", self.run_id,
                   "--mode", "table", "--out", str(out), "--timeout", str(a.timeout)]
            w = out
        else:
            extra = {"state_dir": str(self.state_dir), "checkpoint_interval_s": a.commit_s,
                     "group_instance_id": self.run_id}
            drain = "batch" if n == "grudge-lean" else None
            settings = grudge_settings(self.run_id, self.topic, drain, extra)
            cli = grudge_worker_cmd("abuse_scores", self.bs, self.port, settings,
                                    runtime="batch" if n == "grudge-batch" else None)
            cmd = [python(), str(TIMED_WORKER), "--out", str(out), "--expected", str(expected), "--"] + cli[3:]
            w = out
        cwd = self.work if n != "faust-table" else self.state_dir  # Faust's data dir is ./faust-data
        if a.preload:  # the same allocator for every system (the JVM's and RocksDB's mallocs too)
            env = {**(env or {}), "LD_PRELOAD": a.preload}
        return Proc(cmd, self.work / f"{phase}.log", cwd, env), w

    @staticmethod
    def times(w) -> dict | None:
        """first / done (monotonic s) and CPU seconds between them, once known."""
        if isinstance(w, LogLines):
            t = w.poll()
            r = {}
            if "FIRST" in t:
                r["t_first"] = int(t["FIRST"][0]) / 1000 - EPOCH_TO_MONO
                r["cpu_first"] = int(t["FIRST"][1]) / 1e9
            if "DONE" in t:
                r["events"] = int(t["DONE"][0])
                r["t_last"] = int(t["DONE"][1]) / 1000 - EPOCH_TO_MONO
                r["cpu_last"] = int(t["DONE"][2]) / 1e9
            return r
        if w.exists():
            d = json.loads(w.read_text())
            return d
        return {}


def tempfile_dir(prefix: str) -> str:
    import tempfile

    base = os.environ.get("PEERS_SCRATCH")
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=base)


JEMALLOC = "libjemalloc.so.2"


def allocator_preload(choice: str) -> str | None:
    """The LD_PRELOAD for --allocator (None: the system's malloc); jemalloc asked and missing
    ends the run."""
    if choice == "system":
        return None
    probe = subprocess.run([sys.executable, "-c", "pass"], env={**os.environ, "LD_PRELOAD": JEMALLOC},
                           capture_output=True, timeout=60)
    if probe.returncode != 0 or b"cannot be preloaded" in probe.stderr:
        if choice == "jemalloc":
            sys.exit(f"--allocator jemalloc: {JEMALLOC} does not load here (Debian: apt-get install libjemalloc2)")
        return None
    return JEMALLOC


def wait_for(proc: Proc, w, key: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        t = System.times(w)
        if t and t.get(key) is not None:
            return t
        if not proc.alive():
            # faust_baseline_worker writes its result and stops itself
            t = System.times(w)
            if t and t.get(key) is not None:
                return t
            raise RuntimeError(f"worker exited ({proc.proc.returncode}); log:\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {key}; log:\n{proc.log_tail()}")
        time.sleep(0.05)


def run_system(sys_: System, run_id: str, n: int, args, data_dir: Path) -> dict:
    sys_.setup(run_id)
    expected = sys_.events(n)
    res: dict = {"system": sys_.name, "run_id": run_id, "events": expected, "load_before": loadavg()}
    # 1. throughput
    p, w = sys_.start("run", expected)
    try:
        t = wait_for(p, w, "t_last", args.timeout)
        if sys_.name == "faust-table":
            # it wrote its result and stops itself (SIGTERM, Faust's graceful path)
            p.proc.wait(120)
            t_kill = time.monotonic()
            res["hwm_kb"] = t.get("hwm_kb")
            res["stop"] = "graceful (self SIGTERM)"
        else:
            time.sleep(args.settle_s)
            res["hwm_kb"] = proc_status_kb(p.pid, "VmHWM")
            res["rss_kb"] = proc_status_kb(p.pid, "VmRSS")
        res["state_dir_bytes"] = du_bytes(sys_.state_dir)
        res["state_topic_bytes"] = state_topic_bytes(data_dir, run_id)
        if sys_.name != "faust-table":
            p.kill()
            t_kill = time.monotonic()
            res["stop"] = "kill -9"
    finally:
        p.kill()
    secs = t["t_last"] - t["t_first"]
    res.update(seconds=secs, rate=expected / secs, cpu_s=t["cpu_last"] - t["cpu_first"])
    # the process's CPU clock from its start (imports, JVM, joining, prefetch) to the N-th record
    res["cpu_total_s"] = t["cpu_last"]
    res["cpu_total_s_per_M"] = t["cpu_last"] / expected * 1e6
    res["cpu_s_per_M"] = res["cpu_s"] / expected * 1e6
    res["events_per_cpu_s"] = expected / res["cpu_s"] if res["cpu_s"] > 0 else None
    # 2. and 3. restarts
    if not args.no_restart:
        for phase in ("kept", "lost"):
            probe(sys_.bs, sys_.topic, f"{run_id}-{phase}", args.newest_ts)
            if phase == "lost":
                shutil.rmtree(sys_.state_dir, ignore_errors=True)
                sys_.state_dir.mkdir()
            t_restart = time.monotonic()
            p, w = sys_.start(phase, 1)
            try:
                t = wait_for(p, w, "t_first", args.restore_timeout)
                res[f"restart_{phase}_s"] = t["t_first"] - t_kill
                res[f"restart_{phase}_from_spawn_s"] = t["t_first"] - t_restart
            except RuntimeError as exc:
                res[f"restart_{phase}_s"] = None
                res[f"restart_{phase}_error"] = str(exc)[-500:]
            finally:
                p.kill()
                t_kill = time.monotonic()
    # read after the restarts, so that reading does not sit between kill -9 and restart
    # (the restarts only add probe records, which raise nobody)
    alerts = read_alerts(sys_.bs, sys_.alerts_topic) if sys_.name != "faust-table" else None
    res["raised"] = raised_keys(alerts) if alerts is not None else None
    shutil.rmtree(sys_.work, ignore_errors=True)
    return res


def fmt(x, spec=",.0f") -> str:
    return "–" if x is None else format(x, spec)


def size_key(keys: int, events: int) -> str:
    """A size's entry in the results JSON: keys and events, so 10k x 0.5M and 10k x 10M are two."""
    return f"{keys}:{events}"


def summarize(all_res: dict, sizes, systems) -> dict:
    summary: dict = {}
    for keys, n in sizes:
        sk = size_key(keys, n)
        summary[sk] = {}
        for s in systems:
            rs = [r for r in all_res.get(sk, {}).get(s, []) if "rate" in r]
            if not rs:
                continue

            def med(k):
                v = [r[k] for r in rs if r.get(k) is not None]
                return statistics.median(v) if v else None

            summary[sk][s] = {"runs": len(rs), "events": rs[0]["events"],
                              **{k: med(k) for k in ("rate", "cpu_s_per_M", "events_per_cpu_s", "hwm_kb",
                                                     "cpu_total_s_per_M", "restart_kept_from_spawn_s", "restart_lost_from_spawn_s",
                                                     "state_dir_bytes", "state_topic_bytes", "restart_kept_s",
                                                     "restart_lost_s")}}
        ex = all_res.get(sk, {})
        exact = next((ex[s][0]["raised"] for s in ("ks", "quix", "ks-eos") if ex.get(s) and ex[s][0].get("raised")
                      is not None), None)
        if exact is not None:
            summary[sk]["agreement_vs"] = next(s for s in ("ks", "quix", "ks-eos")
                                               if ex.get(s) and ex[s][0].get("raised") is not None)
            for s in systems:
                if ex.get(s) and ex[s][0].get("raised") is not None and s in summary[sk]:
                    summary[sk][s]["agreement"] = agreement(ex[s][0]["raised"], exact)
    return summary


def print_table(summary: dict) -> None:
    print("\n| keys | system | events | runs | events/s | CPU-s / M events | events / CPU-s | peak RSS MiB | "
          "state on disk MiB | changelog/snapshot MiB | restart, state kept s | restart, state lost s | "
          "raised (P / R vs exact) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for keys, ss in summary.items():
        for s, m in ss.items():
            if not isinstance(m, dict) or "rate" not in m:
                continue
            ag = m.get("agreement")
            agt = "–" if not ag else f"{ag['raised']} ({ag['precision']:.2f} / {ag['recall']:.2f})"
            print(f"| {int(str(keys).split(':')[0]):,} | {s} | {m['events']:,} | {m['runs']} | {fmt(m['rate'])} | "
                  f"{fmt(m['cpu_s_per_M'], '.1f')} | {fmt(m['events_per_cpu_s'])} | "
                  f"{fmt(m['hwm_kb'] and m['hwm_kb'] / 1024)} | {fmt(m['state_dir_bytes'] / 2**20, '.1f')} | "
                  f"{fmt(m['state_topic_bytes'] / 2**20, '.1f')} | {fmt(m['restart_kept_s'], '.1f')} | "
                  f"{fmt(m['restart_lost_s'], '.1f')} | {agt} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000:1000000",
                    help="comma-separated KEYS:EVENTS (distinct-key universe : events), e.g. "
                         "10000:1000000,1000000:3000000,10000000:10000000")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--faust-events", type=int, default=100_000,
                    help="faust-table is timed over the first N events of the topic (it runs at ~4k/s)")
    ap.add_argument("--commit-s", type=float, default=5.0, help="commit / checkpoint interval for all")
    ap.add_argument("--settle-s", type=float, default=7.0, help="wait after the N-th record before kill -9")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--restore-timeout", type=float, default=1800.0)
    ap.add_argument("--no-restart", action="store_true")
    ap.add_argument("--planted", type=int, default=100,
                    help="planted abusers (20 events each, 90%% bad) at every size, so the raised sets "
                         "compare at a million keys too (0: the plain generator)")
    ap.add_argument("--broker-data-dir", type=Path, required=True, help="the broker's log.dirs")
    ap.add_argument("--out", type=Path, default=CACHE / "results.json",
                    help="results JSON (merged into an existing file: one entry per keys:events size)")
    ap.add_argument("--allocator", choices=("auto", "system", "jemalloc"), default="auto",
                    help="the C allocator of every system's process: jemalloc preloaded (LD_PRELOAD), the "
                    "system's malloc, or auto: jemalloc where its library loads (the container image's)")
    args = ap.parse_args()
    args.preload = allocator_preload(args.allocator)
    # SIGTERM unwinds like Ctrl-C, so every worker started here is killed on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bs = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bs:
        sys.exit("set KAFKA_BOOTSTRAP_SERVERS (make bench-peers starts a broker)")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            sys.exit(f"unknown system {s!r}; one of {SYSTEMS}")
    sizes = [tuple(int(x) for x in s.split(":")) for s in args.sizes.split(",")]
    if any(s.startswith("ks") for s in systems):
        build_kstreams()
    qpy = quix_python()
    vers = versions(qpy)
    print(f"# versions {vers}", flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"sizes": {}}
    doc["versions"] = vers
    print(f"# allocator: {'jemalloc (LD_PRELOAD) for every system' if args.preload else 'the system malloc'}",
          flush=True)
    all_res: dict = {}
    for keys, n in sizes:
        topic = f"peers-{uuid.uuid4().hex[:6]}-events"
        t0 = time.time()
        produce(bs, topic, n, keys, planted=args.planted)
        args.newest_ts = newest_timestamp(bs, topic)
        distinct = round(keys * (1 - (1 - 1 / keys) ** n))
        print(f"# {topic}: {n:,} events over {keys:,} keys (~{distinct:,} distinct) produced in "
              f"{time.time() - t0:.0f}s", flush=True)
        sk = size_key(keys, n)
        all_res[sk] = {s: [] for s in systems}
        for r in range(args.runs):
            for s in systems:
                rid = f"peers-{uuid.uuid4().hex[:6]}-{s}"
                try:
                    res = run_system(System(s, args, bs, topic, qpy), rid, n, args, args.broker_data_dir)
                except RuntimeError as exc:
                    print(f"run {r + 1} {s}: FAILED {str(exc)[-1500:]}", flush=True)
                    all_res[sk][s].append({"system": s, "error": str(exc)[-1500:]})
                    continue
                all_res[sk][s].append(res)
                print(f"{keys:>10,} run {r + 1}/{args.runs} {s:13s} {res['rate']:>11,.0f} ev/s  "
                      f"{res['cpu_s_per_M']:7.1f} CPU-s/M  HWM {fmt(res['hwm_kb'] and res['hwm_kb'] / 1024)} MiB  "
                      f"disk {res['state_dir_bytes'] / 2**20:.1f} MiB  topics {res['state_topic_bytes'] / 2**20:.1f} "
                      f"MiB  restart kept {fmt(res.get('restart_kept_s'), '.1f')}s lost "
                      f"{fmt(res.get('restart_lost_s'), '.1f')}s  raised "
                      f"{len(res['raised']) if res['raised'] is not None else '–'}  "
                      f"load {res['load_before'][0]:.2f}", flush=True)
        summ = summarize(all_res, [(keys, n)], systems)[sk]
        doc["sizes"][sk] = {"keys": keys, "events": n, "distinct_expected": distinct, "topic": topic,
                            "runs": args.runs, "summary": summ,
                            "allocator": "jemalloc" if args.preload else "system",
                            "raw": {s: [{k: v for k, v in r.items() if k != "raised"} | (
                                {"raised_keys": sorted(r["raised"])} if r.get("raised") is not None else {})
                                for r in rs] for s, rs in all_res[sk].items()}}
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True))
        print_table({sk: summ})
    print(f"\n# results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
