"""Kafka client configuration from settings (grudge_stream.kafkaconf): no broker needed."""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import shutil
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from grudge_stream import kafkaconf
from grudge_stream.exceptions import ConfigError
from grudge_stream.settings import COMMON, PASSTHROUGH_PREFIXES, Settings

SASL = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "alice",
        "sasl_password": "s3cret"}


def props(overrides=None, environ=None, bound=False) -> dict:
    s = Settings(overrides or {}, environ=environ or {})
    if bound:
        s.bind("abuse_scores", COMMON, PASSTHROUGH_PREFIXES)
    return kafkaconf.client_properties(s)


@pytest.fixture(scope="module")
def pem(tmp_path_factory) -> dict[str, str]:
    """A CA, and a client certificate and key (the key encrypted) signed by it."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    d = tmp_path_factory.mktemp("pem")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=unit-ca")
    run("req", "-newkey", "rsa:2048", "-keyout", "client.key", "-passout", "pass:keypw", "-out", "client.csr",
        "-subj", "/CN=client")
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "client.pem", "-days", "2")
    return {"ca": str(d / "ca.pem"), "cert": str(d / "client.pem"), "key": str(d / "client.key")}


# -- mapping ----------------------------------------------------------------------------------------


def test_plaintext_by_default_and_nothing_else() -> None:
    assert props() == {}
    assert props(bound=True) == {}  # declared defaults (PLAINTEXT, PLAIN) add nothing


def test_named_settings_map_to_librdkafka_properties(pem) -> None:
    got = props({**SASL, "ssl_ca_location": pem["ca"], "ssl_endpoint_identification": "none",
                 "ssl_certificate_location": pem["cert"], "ssl_key_location": pem["key"],
                 "ssl_key_password": "keypw"}, bound=True)
    assert got == {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
                   "sasl.username": "alice", "sasl.password": "s3cret", "ssl.ca.location": pem["ca"],
                   "ssl.endpoint.identification.algorithm": "none", "ssl.certificate.location": pem["cert"],
                   "ssl.key.location": pem["key"], "ssl.key.password": "keypw"}


def test_settings_from_the_environment_and_a_password_file(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("from-file\n")
    env = {"GRUDGE_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "GRUDGE_SASL_USERNAME": "bob",
           "GRUDGE_SASL_PASSWORD_FILE": str(pw)}
    for bound in (False, True):
        got = props(environ=env, bound=bound)
        assert got == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN", "sasl.username": "bob",
                       "sasl.password": "from-file"}


def test_sasl_mechanism_defaults_to_plain_not_librdkafkas_gssapi() -> None:
    got = props({"security_protocol": "SASL_SSL", "sasl_username": "a", "sasl_password": "b"})
    assert got["sasl.mechanisms"] == "PLAIN"


def test_client_config_carries_bootstrap_and_a_logger() -> None:
    conf = kafkaconf.client_config(Settings({**SASL, "bootstrap_servers": "h:1"}, environ={}))
    assert conf["bootstrap.servers"] == "h:1"
    assert isinstance(conf["logger"], logging.Logger)
    assert conf["sasl.password"] == "s3cret"


# -- pass-through -----------------------------------------------------------------------------------


def test_any_client_property_passes_through_by_name() -> None:
    env = {"GRUDGE_KAFKA_SOCKET_KEEPALIVE_ENABLE": "true", "GRUDGE_KAFKA_LOG_LEVEL": "3",
           "GRUDGE_KAFKA_FETCH_MAX_BYTES": "1000", "GRUDGE_OTHER__KAFKA_CLIENT_ID": "not-mine"}
    got = props({"kafka.fetch.max.bytes": "2000", "kafka.client.id": "me"}, environ=env)
    # Flags over environment; GRUDGE_KAFKA_LOG_LEVEL is log_level; another topology's scoped
    # variable does not apply.
    assert got == {"socket.keepalive.enable": "true", "log_level": "3", "fetch.max.bytes": "2000",
                   "client.id": "me"}


def test_scoped_pass_through_variables_apply_to_their_topology() -> None:
    got = props(environ={"GRUDGE_KAFKA_CLIENT_ID": "all", "GRUDGE_ABUSE_SCORES__KAFKA_CLIENT_ID": "mine"},
                bound=True)
    assert got == {"client.id": "mine"}


def test_tool_variables_are_not_client_properties(tmp_path: Path) -> None:
    f = tmp_path / "c.properties"
    f.write_text("client.id=x\n")
    env = {"GRUDGE_KAFKA_CACHE": "/x", "GRUDGE_KAFKA_VERSION": "4.4.0", "GRUDGE_KAFKA_HEAP": "1g",
           "GRUDGE_KAFKA_BACKEND": "local", "GRUDGE_KAFKA_IMAGE": "apache/kafka",
           "GRUDGE_KAFKA_PROPERTIES_FILE": str(f)}
    assert props(environ=env) == {"client.id": "x"}


def test_pass_through_can_carry_security_too() -> None:
    got = props({"kafka.security.protocol": "sasl_ssl", "kafka.sasl.mechanism": "SCRAM-SHA-256",
                 "kafka.sasl.username": "u", "kafka.sasl.password": "p"})
    assert got == {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "u",
                   "sasl.password": "p"}


def test_one_property_set_two_ways_is_refused() -> None:
    with pytest.raises(ConfigError, match="'sasl.username' is given twice"):
        props({**SASL, "kafka.sasl.username": "bob"})


@pytest.mark.parametrize("name, hint", [("group.id", "app_id"), ("bootstrap.servers", "--bootstrap-servers"),
                                        ("enable.auto.commit", "snapshots"), ("isolation.level", ""),
                                        ("message.timeout.ms", "retried"), ("delivery.timeout.ms", "retried"),
                                        ("transactional.id", "")])
def test_properties_the_runtimes_depend_on_cannot_be_passed_through(name: str, hint: str) -> None:
    with pytest.raises(ConfigError, match="is set by grudge-stream") as exc:
        props({f"kafka.{name}": "x"})
    assert hint in str(exc.value)


def test_callbacks_cannot_be_passed_through() -> None:
    with pytest.raises(ConfigError, match="callback"):
        props({"kafka.error_cb": "x"})


# -- the properties file ----------------------------------------------------------------------------


def test_properties_file_syntax() -> None:
    text = ("# comment\n! also a comment\n\n  security.protocol = SASL_SSL\nsasl.mechanisms:PLAIN\n"
            "sasl.username alice\nsasl.password=p\\=w\\\\d\\u00e9\nlong.value=a,\\\n    b,\\\n    c\n"
            "empty.value=\n")
    assert kafkaconf.parse_properties(text) == {
        "security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN", "sasl.username": "alice",
        "sasl.password": "p=w\\d\u00e9", "long.value": "a,b,c", "empty.value": ""}


def test_properties_file_is_the_lowest_layer(tmp_path: Path) -> None:
    f = tmp_path / "client.properties"
    f.write_text("bootstrap.servers=broker-a:9093\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
                 "sasl.username=file-user\nsasl.password=file-pw\nclient.id=from-file\n"
                 "session.timeout.ms=45000\n")
    for bound in (False, True):
        got = props({"kafka_properties_file": str(f), "sasl_username": "flag-user",
                     "kafka.client.id": "from-flag"}, bound=bound)
        # bootstrap.servers is the CLI's business; session.timeout.ms is ignored (with a warning).
        assert got == {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-256",
                       "sasl.username": "flag-user", "sasl.password": "file-pw", "client.id": "from-flag"}


def test_properties_file_names_the_brokers_when_nothing_else_does(tmp_path: Path) -> None:
    f = tmp_path / "client.properties"
    f.write_text("bootstrap.servers=broker-a:9093,broker-b:9093\n")
    s = Settings({"kafka_properties_file": str(f)}, environ={})
    kafkaconf.use_properties_file_bootstrap(s)
    assert s.bootstrap_servers == "broker-a:9093,broker-b:9093"
    for env in ({"KAFKA_BOOTSTRAP_SERVERS": "k:1"}, {"GRUDGE_BOOTSTRAP_SERVERS": "g:1"}):
        s = Settings({"kafka_properties_file": str(f)}, environ=env)
        kafkaconf.use_properties_file_bootstrap(s)
        assert s.bootstrap_servers in ("k:1", "g:1")
    s = Settings({"kafka_properties_file": str(f), "bootstrap_servers": "flag:1"}, environ={})
    kafkaconf.use_properties_file_bootstrap(s)
    assert s.bootstrap_servers == "flag:1"


def test_java_jaas_config_gives_user_and_password(tmp_path: Path) -> None:
    f = tmp_path / "java.properties"
    f.write_text('security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config='
                 'org.apache.kafka.common.security.scram.ScramLoginModule required username="svc" '
                 'password="p\\\\"w";\n')
    got = props({"kafka_properties_file": str(f)})
    assert got["sasl.username"] == "svc" and got["sasl.password"] == 'p\\"w'
    f.write_text("sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required;\n")
    with pytest.raises(ConfigError, match="only the PLAIN and SCRAM login modules"):
        props({"kafka_properties_file": str(f)})


def test_unreadable_properties_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kafka_properties_file '.*nope' cannot be read: No such file"):
        props({"kafka_properties_file": str(tmp_path / "nope")})


# -- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    ({"kafka.security.protocol": "TLS"}, "security_protocol must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ({"security_protocol": "SASL_SSL", "kafka.sasl.mechanisms": "GSSAPI", "sasl_username": "a",
      "sasl_password": "b"}, "sasl_mechanism must be one of"),
    ({"security_protocol": "SASL_SSL", "sasl_password": "b"}, "SASL_SSL with sasl_mechanism PLAIN needs sasl_username"),
    ({"security_protocol": "SASL_SSL", "sasl_username": "a"}, "needs sasl_password or sasl_password_file"),
    ({**SASL, "sasl_password_file": "/x"}, "either sasl_password or sasl_password_file"),
    ({"sasl_username": "a"}, "sasl_username is set but security_protocol is PLAINTEXT"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_username": "a", "sasl_password": "b", "ssl_ca_location": "/x"},
     "ssl_ca_location is set but security_protocol is SASL_PLAINTEXT"),
    ({"security_protocol": "SSL", "ssl_ca_location": "/nonexistent/ca.pem"},
     "ssl_ca_location '/nonexistent/ca.pem' cannot be read: No such file or directory"),
    ({"security_protocol": "SSL", "kafka.ssl.endpoint.identification.algorithm": "yes"},
     "ssl_endpoint_identification must be https or none"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
     "OAUTHBEARER needs kafka.sasl.oauthbearer.method=oidc"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "kafka.sasl.oauthbearer.method": "oidc"},
     "needs kafka.sasl.oauthbearer.client.id and kafka.sasl.oauthbearer.token.endpoint.url"),
    ({"kafka.bad name": "x"}, "is not a Kafka client property name"),
])
def test_bad_settings_are_one_line_config_errors(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        props(overrides)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)
    assert "s3cret" not in str(exc.value) and "'b'" not in str(exc.value)


def test_bound_settings_refuse_an_unknown_protocol_by_name() -> None:
    with pytest.raises(ConfigError, match="security_protocol.*must be one of"):
        props({"security_protocol": "TLS"}, bound=True)


def test_unreadable_password_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sasl_password_file '.*missing' cannot be read"):
        props({"security_protocol": "SASL_SSL", "sasl_username": "a", "sasl_password_file": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        props({"security_protocol": "SASL_SSL", "sasl_username": "a", "sasl_password_file": str(tmp_path / "empty")})


def test_certificate_without_key(pem) -> None:
    with pytest.raises(ConfigError, match="ssl_certificate_location and ssl_key_location go together"):
        props({"security_protocol": "SSL", "ssl_certificate_location": pem["cert"]})


def test_redacted_and_describe_never_show_secrets() -> None:
    s = Settings({**SASL, "kafka.sasl.oauthbearer.client.secret": "oidc-secret"}, environ={})
    shown = json.dumps(kafkaconf.redacted(kafkaconf.client_config(s)), default=str)
    assert "s3cret" not in shown and "oidc-secret" not in shown and "alice" in shown
    assert kafkaconf.describe(s) == "SASL_SSL (SCRAM-SHA-512 as 'alice')"


# -- the Faust runtime (aiokafka) -------------------------------------------------------------------


def test_faust_gets_sasl_credentials_with_an_ssl_context(pem) -> None:
    import faust

    s = Settings({**SASL, "ssl_ca_location": pem["ca"]}, environ={})
    creds = kafkaconf.faust_options(s)["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value, creds.protocol.value) == (
        "alice", "s3cret", "SCRAM-SHA-512", "SASL_SSL")
    assert creds.ssl_context.check_hostname and creds.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert "s3cret" not in repr(creds)


def test_faust_tls_options(pem) -> None:
    import faust

    s = Settings({"security_protocol": "SSL", "ssl_ca_location": pem["ca"], "ssl_endpoint_identification": "none",
                  "ssl_certificate_location": pem["cert"], "ssl_key_location": pem["key"],
                  "ssl_key_password": "keypw"}, environ={})
    creds = kafkaconf.faust_options(s)["broker_credentials"]
    assert isinstance(creds, faust.SSLCredentials) and not creds.context.check_hostname
    s = Settings({"security_protocol": "SSL", "ssl_certificate_location": pem["cert"], "ssl_key_location": pem["key"],
                  "ssl_key_password": "wrong"}, environ={})
    with pytest.raises(ConfigError, match="cannot load the client certificate"):
        kafkaconf.faust_options(s)


def test_faust_plaintext_needs_no_options() -> None:
    assert kafkaconf.faust_options(Settings({"kafka.client.id": "x"}, environ={})) == {}


def test_faust_refuses_security_it_cannot_apply() -> None:
    s = Settings({"security_protocol": "SSL", "kafka.ssl.keystore.location": "/x.p12"}, environ={})
    with pytest.raises(ConfigError, match="Faust runtime cannot apply the client property 'ssl.keystore.location'"):
        kafkaconf.faust_options(s)


def test_faust_oauthbearer_unsecured_jwt() -> None:
    import faust

    s = Settings({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "OAUTHBEARER",
                  "kafka.enable.sasl.oauthbearer.unsecure.jwt": "true",
                  "kafka.sasl.oauthbearer.config": "principal=svc lifeSeconds=60"}, environ={})
    creds = kafkaconf.faust_options(s)["broker_credentials"]
    assert isinstance(creds, faust.OAuthCredentials)
    token = asyncio.run(creds.oauth_cb.token())
    header, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "none"} and sig == ""
    assert claims["sub"] == "svc" and claims["exp"] - claims["iat"] == 60


def test_faust_oauthbearer_oidc_client_credentials() -> None:
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            seen.append((self.headers["Authorization"], body))
            out = json.dumps({"access_token": f"token-{len(seen)}", "expires_in": 3600}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        s = Settings({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                      "kafka.sasl.oauthbearer.method": "oidc", "kafka.sasl.oauthbearer.client.id": "svc",
                      "kafka.sasl.oauthbearer.client.secret": "oidc-secret", "kafka.sasl.oauthbearer.scope": "kafka",
                      "kafka.sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2",
                      "kafka.sasl.oauthbearer.token.endpoint.url": f"http://127.0.0.1:{server.server_port}/token"},
                     environ={})
        provider = kafkaconf.faust_options(s)["broker_credentials"].oauth_cb
        assert asyncio.run(provider.token()) == "token-1"
        assert asyncio.run(provider.token()) == "token-1"  # reused until 80% of its lifetime
        assert provider.extensions() == {"logicalCluster": "lkc-1", "identityPoolId": "pool-2"}
        auth, body = seen[0]
        assert auth == "Basic " + base64.b64encode(b"svc:oidc-secret").decode()
        assert body == "grant_type=client_credentials&scope=kafka"
    finally:
        server.shutdown()


# -- the startup check ------------------------------------------------------------------------------


def test_check_connection_reports_invalid_client_properties() -> None:
    s = Settings({"bootstrap_servers": "127.0.0.1:1", "kafka.no.such.property": "1"}, environ={})
    with pytest.raises(ConfigError, match="invalid Kafka client configuration: .*no.such.property"):
        kafkaconf.check_connection(s, timeout_s=1)


def test_check_connection_waits_boundedly_when_nobody_answers(caplog) -> None:
    from grudge_devkafka import free_port

    s = Settings({"bootstrap_servers": f"127.0.0.1:{free_port()}"}, environ={})
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="grudge_stream.kafkaconf"):
        with pytest.raises(ConfigError, match="did not answer within"):
            kafkaconf.check_connection(s, timeout_s=1.0, wait_s=3.0)
    assert time.monotonic() - t0 < 10
    assert any("no answer from Kafka" in r.getMessage() and "retrying for up to 3 s" in r.getMessage()
               for r in caplog.records)


def test_librdkafka_log_lines_are_rate_limited() -> None:
    from grudge_stream.kafkaconf.clients import _OncePer

    f = _OncePer(interval_s=60)

    def rec(msg: str) -> logging.LogRecord:
        return logging.LogRecord("grudge_stream.kafka", logging.ERROR, "", 0, msg, (), None)

    assert f.filter(rec("FAIL [rdkafka#consumer-1] sasl_ssl://h:9093/1: SASL authentication error (after 12ms)"))
    assert not f.filter(rec("FAIL [rdkafka#producer-7] sasl_ssl://h:9093/1: SASL authentication error (after 9ms)"))
    assert f.filter(rec("FAIL [rdkafka#consumer-1] something else"))



# -- a Faust app's own connection, for its embedded states ---------------------------------------------


def test_a_faust_apps_broker_list_becomes_bootstrap_servers() -> None:
    import faust

    app = faust.App("kc-brokers", broker="kafka://k1:19092;kafka://k2;kafka://10.0.0.3:29092")
    assert kafkaconf.faust_bootstrap(app) == "k1:19092,k2:9092,10.0.0.3:29092"
    assert kafkaconf.faust_client_properties(app) == ({}, None)
    with pytest.raises(ConfigError, match="not a Kafka one"):
        kafkaconf.faust_bootstrap(faust.App("kc-memory", broker="memory://"))


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_faust_apps_sasl_credentials_carry_over(mechanism) -> None:
    import faust

    app = faust.App("kc-sasl", broker="kafka://k1:9093", broker_credentials=faust.SASLCredentials(
        username="svc", password="pw", mechanism=mechanism))
    props, unmapped = kafkaconf.faust_client_properties(app)
    assert props == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism,
                     "sasl.username": "svc", "sasl.password": "pw"}
    assert unmapped is None


def test_a_faust_apps_ssl_context_gives_its_ca_and_verification_not_its_client_certificate(tmp_path) -> None:
    import ssl

    import faust

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    app = faust.App("kc-ssl", broker="kafka://k1:9093", broker_credentials=faust.SASLCredentials(
        username="svc", password="pw", mechanism="SCRAM-SHA-512", ssl_context=ctx))
    props, unmapped = kafkaconf.faust_client_properties(app)
    assert props["security.protocol"] == "SASL_SSL"
    assert props["enable.ssl.certificate.verification"] == "false"
    assert props["ssl.endpoint.identification.algorithm"] == "none"
    assert "client certificate" in unmapped
    ssl_only = faust.App("kc-ssl2", broker="kafka://k1:9093", broker_credentials=ssl.create_default_context())
    props, _ = kafkaconf.faust_client_properties(ssl_only)
    assert props["security.protocol"] == "SSL" and props["ssl.endpoint.identification.algorithm"] == "https"


def test_a_faust_apps_oauth_provider_is_refused_in_one_line() -> None:
    import faust
    from aiokafka.abc import AbstractTokenProvider

    class Tokens(AbstractTokenProvider):
        async def token(self) -> str:
            return "t"

    app = faust.App("kc-oauth", broker="kafka://k1:9093", broker_credentials=faust.OAuthCredentials(oauth_cb=Tokens()))
    with pytest.raises(ConfigError, match="OAuthCredentials"):
        kafkaconf.faust_client_properties(app)
