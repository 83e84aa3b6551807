"""Drive the example gateway: a client blocked for abuse, and later forgiven.

    python examples/gateway/drive.py        (or: make example)

Starts what it needs and stops it at the end: a local Kafka broker (unless
KAFKA_BOOTSTRAP_SERVERS is set), the ``abuse_scores`` topology's worker (batch
runtime, with a fast decay so forgiveness takes seconds, not minutes), and
``gateway.py``. Then twenty users log in normally while ``mallory`` guesses
passwords: each failure is a ``bad`` feedback event, and after about a dozen
the worker raises mallory and the gateway answers 403 without checking her
password, and ``grudge-stream score`` shows why. Mallory stops; her score decays; the worker clears her, the gateway's
view follows, and her next attempt is checked again (401, wrong password).
Finally an operator denies ``trudy`` by hand (``grudge-stream override``):
the gateway blocks her at once, without a single failed login.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))


def say(msg: str, t0: float) -> None:
    print(f"[{time.monotonic() - t0:5.1f}s] {msg}", flush=True)


def post(port: int, user: str, password: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/login", method="POST",
                                 data=json.dumps({"user": user, "password": password}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_http(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/blocked", timeout=1).read()
            return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.2)
    raise SystemExit("the gateway did not start")


def main() -> int:
    from grudge_devkafka import LocalKafka, free_port
    from grudge_stream.topics import ensure_topology_topics
    from grudge_stream.topology import Settings, load_topology

    t0 = time.monotonic()
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        say("starting a local Kafka broker...", t0)
        broker = LocalKafka(quiet=True)
        bootstrap = broker.start()
    run = uuid.uuid4().hex[:6]
    sets = {"source_topic": f"gw-{run}-logins", "alerts_topic": f"gw-{run}-alerts",
            "scores_topic": f"gw-{run}-scores", "dead_letter_topic": f"gw-{run}-dlq",
            "snapshot_topic": f"gw-{run}-snapshots", "app_name": f"gw-{run}",
            # Half-life ~7 s and a sweep every 2 s of event time: forgiveness in seconds.
            "decay_per_s": "0.1", "sweep_interval_ms": "2000", "checkpoint_interval_s": "2"}
    flags = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    env = {**os.environ, "GRUDGE_SEED": secrets.token_hex(16), "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    work = tempfile.mkdtemp(prefix="grudge-gateway-")
    procs: list[subprocess.Popen] = []
    try:
        topology = load_topology("abuse_scores", Settings({**sets, "bootstrap_servers": bootstrap},
                                                          environ={"GRUDGE_SEED": env["GRUDGE_SEED"]}))
        ensure_topology_topics(topology, bootstrap, partitions=4, create_source=True)
        exe = os.path.join(os.path.dirname(sys.executable), "grudge-stream")
        worker_port = free_port()
        with open(os.path.join(work, "worker.log"), "wb") as log:
            procs.append(subprocess.Popen(
                [exe, "worker", "abuse_scores", "--runtime", "batch", "--web-port", str(worker_port),
                 "--no-create-topics", "--loglevel", "warning", *flags, "--set", f"state_dir={work}/state"],
                stdout=log, stderr=subprocess.STDOUT, env=env))
        port = free_port()
        with open(os.path.join(work, "gateway.log"), "wb") as log:
            gw = subprocess.Popen([sys.executable, os.path.join(HERE, "gateway.py"), "--port", str(port), *flags],
                                  stdout=log, stderr=subprocess.STDOUT,
                                  env={k: v for k, v in env.items() if k != "GRUDGE_SEED"})
            procs.append(gw)
        wait_http(port, gw)
        say(f"broker {bootstrap}; worker and gateway (http://127.0.0.1:{port}) up", t0)

        users = [f"user-{i:02d}" for i in range(20)]
        i = 0

        def benign(n: int = 5) -> None:
            nonlocal i
            for _ in range(n):
                post(port, users[i % len(users)], "correct")
                i += 1

        # 1. Mallory guesses passwords until the gateway refuses her.
        blocked_at = None
        for attempt in range(1, 200):
            status, body = post(port, "mallory", f"guess-{attempt}")
            benign()
            if status == 403:
                blocked_at = attempt
                say(f"mallory attempt {attempt}: 403 {body['result']} (score {body['score']:.2f}, "
                    f"reason {body['reason']})", t0)
                break
            if attempt % 5 == 0 or attempt < 3:
                say(f"mallory attempt {attempt}: {status} {body['result']}", t0)
            time.sleep(0.1)
        if blocked_at is None:
            say("mallory was never blocked", t0)
            return 1
        status, body = post(port, "mallory", "correct")
        say(f"mallory with the right password: {status} {body['result']} (refused before any check)", t0)
        # Why? Ask the worker that owns mallory's partition (any worker would forward).
        out = subprocess.run([exe, "score", "abuse_scores", "mallory", "--url", f"http://127.0.0.1:{worker_port}"],
                             capture_output=True, text=True, env=env, timeout=30)
        say(f"grudge-stream score abuse_scores mallory: {out.stdout.strip() or out.stderr.strip()}", t0)

        # 2. Mallory stops; the others keep logging in (their events move event time on).
        say("mallory stops; twenty users keep logging in...", t0)
        forgiven = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            benign(10)
            time.sleep(0.2)
            blocked = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/blocked", timeout=5).read())
            if not any(b["user"] == "mallory" for b in blocked):
                status, body = post(port, "mallory", "guess-again")
                forgiven = status
                say(f"mallory forgiven: her next attempt is checked again: {status} {body['result']}", t0)
                break
        if forgiven is None or forgiven == 403:
            say("mallory was not forgiven in time", t0)
            return 1

        # 3. An operator denies trudy by hand: blocked at once, no failed login needed.
        out = subprocess.run([exe, "override", "abuse_scores", "deny", "trudy", "--for", "1h", "--reason",
                              "chargeback fraud", "--bootstrap-servers", bootstrap, *flags],
                             capture_output=True, text=True, env=env, timeout=60)
        say(f"grudge-stream override abuse_scores deny trudy --for 1h: {out.stdout.strip() or out.stderr.strip()}", t0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status, body = post(port, "trudy", "correct")
            if status == 403:
                say(f"trudy: 403 {body['result']} (reason {body['reason']})", t0)
                break
            time.sleep(0.1)
        else:
            say("trudy was not blocked", t0)
            return 1
        say("done: blocked after %d failed logins, forgiven after the decay, denied by hand" % blocked_at, t0)
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        shutil.rmtree(os.path.join(work, "state"), ignore_errors=True)
        if broker is not None:
            broker.stop()
        print(f"logs: {work}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
