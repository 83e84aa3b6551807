"""Both runtimes against a SASL_SSL listener of the real broker (docs/security.md,
"Connecting to a secured cluster").

The module starts its own dev broker with an extra SASL_SSL listener (SCRAM-SHA-512 and PLAIN
users, a broker certificate signed by a throw-away CA made here with openssl and keytool,
client certificates requested and checked when presented). Workers run through the CLI from a
scratch directory, as a deployment runs them; the test reads their alerts and snapshots with
its own authenticated client, configured by hand (not through grudge_stream.kafkaconf).
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from grudge_devkafka import LocalKafka, SaslSslListener, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BAD, GOOD = b'{"outcome":"bad"}', b'{"outcome":"good"}'
ABUSERS = [f"abuser-{i}" for i in range(3)]


@dataclass
class Pki:
    ca: Path                 # CA certificate (PEM): ssl_ca_location
    keystore: Path           # the broker's key and chain (PKCS12)
    truststore: Path         # the CA, for the broker to check client certificates (PKCS12)
    client_cert: Path        # a client certificate (PEM) signed by the CA
    client_key: Path         # its key (PEM, encrypted with key_password)
    store_password: str
    key_password: str


def make_pki(d: Path) -> Pki:
    """A CA; a broker certificate for 127.0.0.1 / localhost in a PKCS12 keystore (openssl); a
    truststore holding the CA (keytool); a client certificate with an encrypted key."""
    d.mkdir(parents=True, exist_ok=True)
    store_pw, key_pw = secrets.token_hex(8), secrets.token_hex(8)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=grudge-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
            "-subj", "/CN=localhost")
    (d / "broker.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "broker.pem", "-days", "2", "-extfile", "broker.ext")
    openssl("pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key", "-certfile", "ca.pem",
            "-name", "broker", "-out", "broker.p12", "-passout", f"pass:{store_pw}")
    subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "grudge-test-ca", "-file", "ca.pem",
                    "-keystore", "truststore.p12", "-storetype", "PKCS12", "-storepass", store_pw],
                   cwd=d, check=True, capture_output=True, timeout=60)
    openssl("req", "-newkey", "rsa:2048", "-keyout", "client.key", "-passout", f"pass:{key_pw}",
            "-out", "client.csr", "-subj", "/CN=grudge-worker")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "client.pem", "-days", "2", "-extfile", "client.ext")
    return Pki(d / "ca.pem", d / "broker.p12", d / "truststore.p12", d / "client.pem", d / "client.key",
               store_pw, key_pw)


@dataclass
class SecureKafka:
    plain: str      # the PLAINTEXT listener (broker-internal use, not used by the tests' clients)
    sasl: str       # the SASL_SSL listener
    pki: Pki
    users: dict[str, str]

    def client(self, user: str = "alice", mechanism: str = "SCRAM-SHA-512") -> dict:
        """An authenticated librdkafka configuration for the test's own clients."""
        return {"bootstrap.servers": self.sasl, "security.protocol": "SASL_SSL", "sasl.mechanisms": mechanism,
                "sasl.username": user, "sasl.password": self.users[user], "ssl.ca.location": str(self.pki.ca)}


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory) -> SecureKafka:
    for tool in ("openssl", "keytool"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    base = tmp_path_factory.mktemp("secure-kafka")
    pki = make_pki(base / "pki")
    users = {"alice": secrets.token_urlsafe(12), "bob": secrets.token_urlsafe(12)}
    # OAUTHBEARER with Kafka's unsecured validator: it checks the token's claims, not a signature.
    listener = SaslSslListener(keystore=pki.keystore, keystore_password=pki.store_password, users=users,
                               mechanisms=("SCRAM-SHA-512", "PLAIN", "OAUTHBEARER"), truststore=pki.truststore,
                               truststore_password=pki.store_password, client_auth="requested")
    with LocalKafka(base / "broker", sasl_ssl=listener, heap="512m", quiet=True) as kafka:
        assert kafka.sasl_ssl_bootstrap is not None
        yield SecureKafka(kafka.bootstrap, kafka.sasl_ssl_bootstrap, pki, users)


class TokenEndpoint:
    """An OAuth token endpoint (client credentials grant) issuing unsigned JWTs, which the
    test broker's unsecured OAUTHBEARER validator accepts."""

    def __init__(self, client_id: str, client_secret: str) -> None:
        self.client_id, self.client_secret = client_id, client_secret
        self.requests = 0
        outer = self
        want = "Basic " + base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                outer.requests += 1
                if self.headers.get("Authorization") != want or "grant_type=client_credentials" not in body:
                    self.send_response(401)
                    self.end_headers()
                    return
                now = int(time.time())

                def b64(obj: dict) -> str:
                    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

                token = f"{b64({'alg': 'none'})}.{b64({'sub': client_id, 'iat': now, 'exp': now + 600})}."
                out = json.dumps({"access_token": token, "token_type": "bearer", "expires_in": 600}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/oauth/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def token_endpoint():
    ep = TokenEndpoint("grudge-worker", secrets.token_hex(8))
    yield ep
    ep.server.shutdown()


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRUDGE_", "KAFKA_BOOTSTRAP"))}
    env["GRUDGE_SEED"] = secrets.token_hex(16)
    env.update(extra)
    return env


def topic_settings() -> dict[str, str]:
    run = uuid.uuid4().hex[:8]
    return {"source_topic": f"sec-{run}-events", "alerts_topic": f"sec-{run}-alerts",
            "scores_topic": f"sec-{run}-scores", "dead_letter_topic": f"sec-{run}-dlq",
            "snapshot_topic": f"sec-{run}-snapshots", "operator_id": f"abuse-{run}",
            "cells_per_level": "5000", "checkpoint_interval_s": "1.0",
            # Snapshots every second (the tests wait for them), not when a replay budget is spent.
            "snapshot_replay_budget_s": "0"}


def sets(settings: dict[str, str]) -> list[str]:
    return [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]


def produce_events(conf: dict, topic: str, n: int = 3000) -> None:
    p = Producer({**conf, "linger.ms": 5})
    t = time.time_ns() // 1_000_000 - 60_000
    for i in range(n):
        key = ABUSERS[i % len(ABUSERS)] if i % 4 == 0 else f"user-{i % 500}"
        p.produce(topic, key=key.encode(), value=BAD if key.startswith("abuser") else GOOD, timestamp=t + i * 10)
    assert p.flush(30) == 0


def read_raised(conf: dict, topic: str, want: set[str], timeout: float = 60.0) -> set[str]:
    c = Consumer({**conf, "group.id": f"sec-reader-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    raised: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while raised != want and time.monotonic() < deadline:
            for m in c.consume(100, timeout=0.5):
                if m.error() is None:
                    alert = json.loads(m.value())
                    if alert["state"] == "raised":
                        raised.add(alert["key"])
    finally:
        c.close()
    return raised


def end_offsets(conf: dict, topic: str, partitions: int) -> list[int]:
    c = Consumer({**conf, "group.id": "sec-watermarks"})
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                        for p in range(partitions)]
            except KafkaException as exc:
                # A topic created a moment ago may not have its leader elected yet.
                if exc.args[0].code() != KafkaError.NOT_LEADER_FOR_PARTITION or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        c.close()


def run_cli(args: list[str], env: dict, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grudge_stream.cli", *args], capture_output=True, text=True,
                          env=env, cwd=str(cwd), timeout=timeout)


def stop(proc: subprocess.Popen, timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise


def test_tls_setup_of_the_dev_broker(secure_kafka: SecureKafka) -> None:
    """The certificate names 127.0.0.1 (hostname verification on), SCRAM and PLAIN both log in,
    and the PLAINTEXT listener stays for the default path."""
    from confluent_kafka.admin import AdminClient

    for mech in ("SCRAM-SHA-512", "PLAIN"):
        md = AdminClient(secure_kafka.client("bob", mech)).list_topics(timeout=20)
        assert md.brokers
    assert AdminClient({"bootstrap.servers": secure_kafka.plain}).list_topics(timeout=20).brokers


@pytest.mark.parametrize("runtime, auth", [("batch", "scram"), ("faust", "scram"), ("batch", "oidc"),
                                           ("faust", "oidc")])
def test_worker_runs_against_a_sasl_ssl_listener(secure_kafka: SecureKafka, token_endpoint: TokenEndpoint,
                                                 runtime: str, auth: str, tmp_path: Path) -> None:
    """``topics`` creates the topics and the worker processes events, over SASL_SSL only.

    batch/scram: SCRAM-SHA-512, everything from a client properties file named in the
    environment. faust/scram: SCRAM-SHA-512 from --set flags, the password from a file, and a
    client certificate with an encrypted key (mutual TLS), for aiokafka and the
    confluent-kafka clients alike. oidc: OAUTHBEARER with tokens from an OAuth token
    endpoint (client credentials), from environment variables."""
    k = secure_kafka
    settings = topic_settings()
    password = k.users["alice"]
    if auth == "oidc":
        ep = token_endpoint
        before = ep.requests
        password = ep.client_secret
        env = cli_env(GRUDGE_SECURITY_PROTOCOL="SASL_SSL", GRUDGE_SASL_MECHANISM="OAUTHBEARER",
                      GRUDGE_SSL_CA_LOCATION=str(k.pki.ca), GRUDGE_KAFKA_SASL_OAUTHBEARER_METHOD="oidc",
                      GRUDGE_KAFKA_SASL_OAUTHBEARER_CLIENT_ID=ep.client_id,
                      GRUDGE_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET=ep.client_secret,
                      GRUDGE_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL=ep.url)
        connect: list[str] = ["--bootstrap-servers", k.sasl]
    elif runtime == "batch":
        props = tmp_path / "client.properties"
        props.write_text(f"# a librdkafka client properties file\nbootstrap.servers={k.sasl}\n"
                         "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=alice\n"
                         f"sasl.password={password}\nssl.ca.location={k.pki.ca}\n"
                         "socket.keepalive.enable=true\n")
        env = cli_env(GRUDGE_KAFKA_PROPERTIES_FILE=str(props), GRUDGE_KAFKA_CLIENT_ID="sec-test-batch")
        connect = []  # the brokers come from the file
    else:
        pw_file = tmp_path / "sasl-password"
        pw_file.write_text(password + "\n")
        env = cli_env()
        connect = ["--bootstrap-servers", k.sasl, *sets({
            "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "alice",
            "sasl_password_file": str(pw_file), "ssl_ca_location": str(k.pki.ca),
            "ssl_certificate_location": str(k.pki.client_cert), "ssl_key_location": str(k.pki.client_key),
            "ssl_key_password": k.pki.key_password, "kafka.client.id": "sec-test-faust"})]
    t0 = time.monotonic()
    res = run_cli(["topics", "abuse_scores", "--partitions", "2", *connect, *sets(settings)], env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"{settings['source_topic']}: 2 partitions" in res.stdout
    conf = k.client()
    assert end_offsets(conf, settings["snapshot_topic"], 2) == [0, 0]  # created, over SASL_SSL
    produce_events(conf, settings["source_topic"])

    port = free_port()
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grudge_stream.cli", "worker", "abuse_scores", "--runtime", runtime,
             "--web-port", str(port), "--loglevel", "info", *connect, *sets(settings),
             "--set", f"state_dir={tmp_path / 'state'}"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path))
    try:
        raised = read_raised(conf, settings["alerts_topic"], set(ABUSERS))
        assert raised == set(ABUSERS), log_path.read_text()[-4000:]
        deadline = time.monotonic() + 30
        while not all(end_offsets(conf, settings["snapshot_topic"], 2)):
            assert time.monotonic() < deadline, log_path.read_text()[-4000:]
            time.sleep(0.5)
    finally:
        rc = stop(proc)
    text = log_path.read_text(errors="replace")
    assert rc == 0, text[-4000:]
    assert password not in text and k.pki.key_password not in text
    assert "Traceback" not in text, text[-4000:]
    if runtime == "faust":  # aiokafka's own connection
        want = "Authenticated via OAUTHBEARER" if auth == "oidc" else "Authenticated as alice via SCRAM-SHA-512"
        assert want in text
    if auth == "oidc":
        assert token_endpoint.requests > before
    assert time.monotonic() - t0 < 90


def test_faust_connection_presents_the_client_certificate(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    """The Faust runtime's aiokafka clients get the TLS client certificate: the broker (client
    certificates requested) accepts ours and refuses one from a CA it does not trust."""
    from aiokafka import AIOKafkaProducer
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from grudge_stream.kafkaconf import faust_options
    from grudge_stream.settings import Settings

    k = secure_kafka
    other = make_pki(tmp_path / "other-pki")

    async def connect(pki: Pki) -> None:
        settings = Settings({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "bob",
                             "sasl_password": k.users["bob"], "ssl_ca_location": str(k.pki.ca),
                             "ssl_certificate_location": str(pki.client_cert),
                             "ssl_key_location": str(pki.client_key), "ssl_key_password": pki.key_password},
                            environ={})
        auth = credentials_to_aiokafka_auth(faust_options(settings)["broker_credentials"])
        producer = AIOKafkaProducer(bootstrap_servers=k.sasl, request_timeout_ms=10_000, **auth)
        try:
            await asyncio.wait_for(producer.start(), 20)
        finally:
            await producer.stop()

    asyncio.run(connect(k.pki))
    with pytest.raises(Exception):  # noqa: B017 - aiokafka reports it as KafkaConnectionError or SSLError
        asyncio.run(connect(other))


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_wrong_password_fails_fast_with_one_line(secure_kafka: SecureKafka, runtime: str, tmp_path: Path) -> None:
    k = secure_kafka
    wrong = "not-" + k.users["alice"]
    t0 = time.monotonic()
    res = run_cli(["worker", "abuse_scores", "--runtime", runtime, "--bootstrap-servers", k.sasl,
                   *sets({**topic_settings(), "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                          "sasl_username": "alice", "ssl_ca_location": str(k.pki.ca)})],
                  cli_env(GRUDGE_SASL_PASSWORD=wrong), tmp_path, timeout=60)
    took = time.monotonic() - t0
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "authentication failed" in lines[0] and k.sasl in lines[0], lines[0]
    assert lines[0].startswith("grudge-stream worker: ")
    assert wrong not in res.stderr + res.stdout
    assert took < 15, took


def test_wrong_ca_and_wrong_password_on_topics_are_one_line(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    k = secure_kafka
    other = make_pki(tmp_path / "other-pki")  # a CA that did not sign the broker's certificate
    base = {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "bob"}
    res = run_cli(["topics", "abuse_scores", "--bootstrap-servers", k.sasl,
                   *sets({**topic_settings(), **base, "ssl_ca_location": str(other.ca)})],
                  cli_env(GRUDGE_SASL_PASSWORD=k.users["bob"]), tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "TLS handshake failed" in res.stderr and "certificate verify failed" in res.stderr
    res = run_cli(["topics", "abuse_scores", "--bootstrap-servers", k.sasl,
                   *sets({**topic_settings(), **base, "ssl_ca_location": str(k.pki.ca)})],
                  cli_env(GRUDGE_SASL_PASSWORD="wrong-password"), tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "authentication failed" in res.stderr and "Invalid username or password" in res.stderr


SASL_FAUST_APP = '''
import os
import ssl

import faust
from grudge_stream import faust as grudge
from grudge_stream.hashkey import HashKey
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

app = faust.App(os.environ["APP_ID"], broker="kafka://" + os.environ["BROKER"], store="memory://",
                topic_partitions=2,
                broker_credentials=faust.SASLCredentials(
                    username="alice", password=os.environ["ALICE_PASSWORD"], mechanism="SCRAM-SHA-512",
                    ssl_context=ssl.create_default_context(cafile=os.environ["CA_FILE"])))
logins = app.topic(os.environ["SOURCE"], key_type=bytes, value_type=bytes, key_serializer="raw",
                   value_serializer="raw")
abuse = grudge.scores(app, os.environ["APP_ID"] + "-abuse", source=logins,
                      hash_key=HashKey.parse(os.environ["GRUDGE_SEED"]),
                      sketch=ScoreSketchConfig(levels=2, cells_per_level=1000, decay=Exponential(0.01),
                                               hasher="siphash"),
                      raise_at=0.5, clear_at=0.25)


@app.agent(logins)
async def judge(stream):
    async for event in stream.events():
        abuse.update(event.key, 0.04 if event.value == b"bad" else -0.001)


if __name__ == "__main__":
    app.main()
'''


def test_embedded_state_takes_a_faust_apps_sasl_ssl_credentials(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    """A state in a Faust app on SASL_SSL (SCRAM, the CA in the app's SSL context) connects with
    the app's credentials: no bootstrap_servers, client_config or GRUDGE_* security setting."""
    from grudge_stream.topics import create_topics

    k = secure_kafka
    run = uuid.uuid4().hex[:6]
    app_id, source = f"sasl-app-{run}", f"sasl-logins-{run}"
    conf = k.client()
    create_topics(k.sasl, {source: (2, {})}, client_config=conf)
    script = tmp_path / "sasl_app.py"
    script.write_text(SASL_FAUST_APP)
    env = {key: v for key, v in os.environ.items()
           if key != "KAFKA_BOOTSTRAP_SERVERS" and not key.startswith("GRUDGE_") and key != "PYTHONPATH"}
    env.update({"APP_ID": app_id, "SOURCE": source, "BROKER": k.sasl, "ALICE_PASSWORD": k.users["alice"],
                "CA_FILE": str(k.pki.ca), "GRUDGE_SEED": secrets.token_hex(16)})
    log = tmp_path / "sasl_app.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), "worker", "-l", "info", "--web-port", str(free_port())],
                                env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        p = Producer(conf)
        for _ in range(20):
            p.produce(source, key=b"mallory", value=b"bad")
        assert p.flush(30) == 0
        assert read_raised(conf, f"{app_id}-abuse-alerts", {"mallory"}, timeout=90) == {"mallory"}, \
            log.read_text()[-4000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert "client certificate in the app's SSL context" in text  # what was not carried over, said once


def test_embedded_state_takes_a_kafka_section(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    """A state of one's own loop on SASL_SSL from a ``kafka=KafkaClient(...)`` section (the
    password in a file): it connects and creates its topics; a wrong password is one line."""
    from grudge_stream.exceptions import ConfigError
    from grudge_stream.hashkey import HashKey
    from grudge_stream.sections import KafkaClient
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
    from grudge_stream.state import ScoreState
    from grudge_stream.topics import create_topics

    k = secure_kafka
    run = uuid.uuid4().hex[:6]
    source = f"section-logins-{run}"
    conf = k.client()
    create_topics(k.sasl, {source: (2, {})}, client_config=conf)
    password = tmp_path / "password"
    password.write_text(k.users["alice"] + "\n")

    def state(name: str, password_file: Path) -> ScoreState:
        return ScoreState(name, source_topic=source, hash_key=HashKey.parse(secrets.token_hex(16)),
                          sketch=ScoreSketchConfig(levels=2, cells_per_level=1000, decay=Exponential(0.01),
                                                   hasher="siphash"), raise_at=0.5, clear_at=0.25,
                          kafka=KafkaClient(bootstrap_servers=k.sasl, security_protocol="SASL_SSL",
                                            sasl_mechanism="SCRAM-SHA-512", sasl_username="alice",
                                            sasl_password_file=str(password_file), ssl_ca_location=str(k.pki.ca)),
                          broker_wait_s=10)

    s = state(f"section-{run}", password).start()
    try:
        assert s.assign([0, 1]) == {0: None, 1: None}
        s.update(b"mallory", 0.1, partition=0, offset=0, timestamp_ms=int(time.time() * 1000))
        s.checkpoint({0: 1})
    finally:
        s.close()
    from confluent_kafka.admin import AdminClient

    topics = AdminClient(conf).list_topics(timeout=10).topics
    assert f"section-{run}-snapshots" in topics and f"section-{run}-alerts" in topics
    wrong = tmp_path / "wrong"
    wrong.write_text("not-" + k.users["alice"])
    with pytest.raises(ConfigError) as refused:
        state(f"section-wrong-{run}", wrong).start()
    assert len(str(refused.value).splitlines()) == 1 and "authentication failed" in str(refused.value)
