"""`grudge-stream demo`: a local broker, the abuse-score topology, traffic, and the alerts.

Starts a single-node Kafka broker on 127.0.0.1 (unless KAFKA_BOOTSTRAP_SERVERS
is set; the dev broker of tools/devkafka, which ``make demo`` installs beside the
package), creates the topology's topics, runs `grudge-stream worker
abuse_scores` as a child process, produces traffic in which a handful of
abusive clients hide among thousands of well-behaved ones, and prints every
alert as it arrives on the alert topic. Stops everything it started after
``--seconds``. Writes nothing to the working directory: the worker's log and
state directory go to a temporary directory (the state is removed at the end,
the log kept).

``--keep`` keeps the data for the next steps (``grudge-stream alerts``, ``replay``,
``worker``, ``score``): the topology's own topic names instead of random ones, the
dev broker of ``make broker-start`` (started if it is not running, left running;
``make broker-stop`` stops it), a hash key kept in a file beside it, and an
``export`` line that points those commands at all of it.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

from confluent_kafka import Consumer, Producer

ABUSERS = [f"client-abuse-{i}" for i in range(5)]


def _say(msg: str) -> None:
    print(msg, flush=True)


def _console_script() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "grudge-stream")
    if not os.path.exists(path):
        raise SystemExit(f"{path} not found: install grudge-stream (make install) to run the demo")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_broker(keep: bool = False):
    """The dev broker (tools/devkafka, not part of the grudge-stream wheel), started; with
    ``keep`` the one of ``make broker-start`` (adopted if it runs), left running."""
    from grudge_stream.exceptions import ConfigError, GrudgeError

    try:
        from grudge_devkafka import DevKafkaError, LocalKafka
    except ModuleNotFoundError as exc:
        if exc.name != "grudge_devkafka":
            raise
        raise ConfigError(
            "no Kafka broker: set KAFKA_BOOTSTRAP_SERVERS, or install the dev broker "
            "(pip install ./tools/devkafka from a grudge-stream checkout; `make demo` does it)"
        ) from None
    _say("starting a local Kafka broker (the first run fetches its jars with Maven)...")
    if keep:
        from grudge_devkafka import default_state_dir

        broker = LocalKafka(default_state_dir(), quiet=True, die_with_parent=False)
    else:
        broker = LocalKafka(quiet=True)
    try:
        return broker, broker.start()
    except DevKafkaError as exc:
        raise GrudgeError(f"the local Kafka broker did not start: {exc}") from exc


# The demo's settings beside the topology's defaults: a fast decay (half-life ~7 s) so it
# also shows keys clearing once abuse stops.
DEMO_SETTINGS = {"decay_per_s": "0.1", "sweep_interval_ms": "2000"}


def run_demo(seconds: float = 45.0, partitions: int = 4, rate: float = 2000.0, keep: bool = False) -> int:
    from grudge_stream.kafkaconf import client_config
    from grudge_stream.topics import ensure_topology_topics
    from grudge_stream.topology import Settings, load_topology

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        broker, bootstrap = _local_broker(keep)
    run = uuid.uuid4().hex[:6]
    if keep:
        # The topology's own topic names: the next commands need no --set for them.
        overrides = {**DEMO_SETTINGS, "bootstrap_servers": bootstrap}
    else:
        overrides = {
            "source_topic": f"demo-{run}-events",
            "alerts_topic": f"demo-{run}-alerts",
            "scores_topic": f"demo-{run}-scores",
            "dead_letter_topic": f"demo-{run}-dead-letters",
            "snapshot_topic": f"demo-{run}-snapshots",
            "app_name": f"demo-{run}",
            **DEMO_SETTINGS,
            "bootstrap_servers": bootstrap,
        }
    worker = None
    work = tempfile.mkdtemp(prefix=f"grudge-demo-{run}-")
    state = os.path.join(work, "state")
    if keep:
        # One hash key for every kept run (the snapshots are hashed under it), in a file.
        seed_file = os.path.join(os.path.expanduser("~"), ".config", "grudge-stream", "demo.seed")
        if not os.path.exists(seed_file):
            os.makedirs(os.path.dirname(seed_file), exist_ok=True)
            fd = os.open(seed_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(16) + "\n")
        with open(seed_file) as f:
            seed = f.read().strip()
    else:
        # A fresh secret hash key per demo run, handed to the worker through its environment.
        seed = secrets.token_hex(16)
    try:
        settings = Settings(overrides, environ={**os.environ, "GRUDGE_SEED": seed})
        topology = load_topology("abuse_scores", settings)
        # A secured cluster (KAFKA_BOOTSTRAP_SERVERS plus the security settings in the
        # environment, which the worker inherits): the demo's own clients use them too.
        conf = client_config(settings)
        ensure_topology_topics(topology, bootstrap, partitions=partitions, create_source=True, client_config=conf)
        port = _free_port()
        # The installed console script, not `python -m`: that would put the working directory
        # (a source checkout, say) ahead of the installed package on sys.path.
        cmd = [_console_script(), "worker", "abuse_scores",
               "--bootstrap-servers", bootstrap, "--web-port", str(port), "--loglevel", "warning"]
        for k, v in overrides.items():
            if k != "bootstrap_servers":
                cmd += ["--set", f"{k}={v}"]
        cmd += ["--set", f"state_dir={state}"]  # Faust's data directory: not in the cwd
        _say(f"broker {bootstrap}; worker: grudge-stream worker abuse_scores "
             f"(metrics on http://127.0.0.1:{port}/metrics)")
        log_path = os.path.join(work, "worker.log")
        with open(log_path, "wb") as log_file:
            worker = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                      env={**os.environ, "GRUDGE_SEED": seed})
        _traffic_and_alerts(bootstrap, topology, seconds, rate, conf)
        _say(f"worker log: {log_path}")
        if keep:
            env = " ".join(f"GRUDGE_{k.upper()}={v}" for k, v in DEMO_SETTINGS.items())
            _say(f"kept: the broker at {bootstrap}"
                 + (f" (stop it: make broker-stop, or python -m grudge_devkafka stop --dir {broker.state_dir})"
                    if broker is not None else "")
                 + f", the topics {topology.source_topic}, {topology.outputs['alerts']}, ..., and the hash key "
                 f"in {seed_file}. Next:\n"
                 f"  export KAFKA_BOOTSTRAP_SERVERS={bootstrap} GRUDGE_SEED_FILE={seed_file} {env}\n"
                 "  grudge-stream alerts abuse_scores                       # the raised set\n"
                 "  grudge-stream replay abuse_scores --output stdout       # the history again, as a dry run\n"
                 "  grudge-stream worker abuse_scores                       # restores from its snapshots; then:\n"
                 "  grudge-stream score abuse_scores client-abuse-0          # a key's live score")
        return 0
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
        shutil.rmtree(state, ignore_errors=True)
        if broker is not None and not keep:
            broker.stop()


def _traffic_and_alerts(bootstrap: str, topology, seconds: float, rate: float, conf: dict | None = None) -> None:
    conf = {"bootstrap.servers": bootstrap, **(conf or {})}
    # Kafka's default partitioner (murmur2), as the workers' score queries assume.
    producer = Producer({"linger.ms": 5, "partitioner": "murmur2_random", **conf})
    consumer = Consumer({"auto.offset.reset": "earliest", "fetch.queue.backoff.ms": 10, **conf,
                         "group.id": f"demo-alert-reader-{uuid.uuid4().hex[:6]}"})
    consumer.subscribe([topology.outputs["alerts"]])
    rnd = random.Random(7)
    users = [f"user-{i:05d}" for i in range(5000)]
    quiet_at = seconds * 0.5
    _say(f"producing ~{rate:.0f} events/s for {seconds:.0f}s: 5000 users (2% bad), "
         f"{len(ABUSERS)} abusers (85% bad) who stop after {quiet_at:.0f}s — alerts from "
         f"{topology.outputs['alerts']}:")
    start = time.monotonic()
    sent = 0
    raised: dict[str, float] = {}
    cleared: set[str] = set()
    tick = 0.05
    while time.monotonic() - start < seconds:
        t0 = time.monotonic()
        for _ in range(int(rate * tick)):
            if rnd.random() < 0.02 and time.monotonic() - start < quiet_at:
                key, bad = rnd.choice(ABUSERS), rnd.random() < 0.85
            else:
                key, bad = rnd.choice(users), rnd.random() < 0.02
            producer.produce(topology.source_topic, key=key.encode(),
                             value=json.dumps({"outcome": "bad" if bad else "good"}).encode())
            sent += 1
        if rnd.random() < 0.01:  # a malformed record now and then: it goes to the dead-letter topic
            producer.produce(topology.source_topic, key=b"user-00001", value=b"{not json")
        producer.poll(0)
        for msg in consumer.consume(num_messages=100, timeout=0):
            if msg.error():
                continue
            alert = json.loads(msg.value())
            key = alert.get("key")
            mark = "RAISED " if alert["state"] == "raised" else "cleared"
            _say(f"  [{time.monotonic() - start:5.1f}s] {mark} {key:<18} score={alert['score']:.3f} "
                 f"threshold={alert['threshold']} partition={alert['source']['partition']} "
                 f"offset={alert['source']['offset']}")
            if alert["state"] == "raised":
                raised[key] = alert["score"]
            else:
                cleared.add(key)
        time.sleep(max(0.0, tick - (time.monotonic() - t0)))
    producer.flush(10)
    consumer.close()
    abusive = sorted(k for k in raised if k in ABUSERS)
    innocent = sorted(k for k in raised if k not in ABUSERS)
    _say(f"sent {sent} events; raised {len(raised)} keys: {len(abusive)}/{len(ABUSERS)} abusers "
         f"{abusive}, {len(innocent)} others {innocent[:10]}; cleared {len(cleared)}")
