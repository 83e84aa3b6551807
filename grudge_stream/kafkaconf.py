"""Kafka client configuration: security (SASL, TLS), a client properties file, and any client
property passed through by name, for every Kafka client of both runtimes.

One merged set of librdkafka properties is built from the settings
(docs/security.md, "Connecting to a secured cluster"), lowest first:

1. ``kafka_properties_file``: a Java-style ``key=value`` client properties file with
   librdkafka property names (``security.protocol``, ``sasl.mechanisms``, ``ssl.ca.location``,
   ...; Java's ``sasl.jaas.config`` with a PLAIN / SCRAM login module is read for its user
   name and password);
2. the named settings (``security_protocol``, ``sasl_mechanism``, ``sasl_username``,
   ``sasl_password`` / ``sasl_password_file``, ``ssl_ca_location``,
   ``ssl_certificate_location``, ``ssl_key_location``, ``ssl_key_password``,
   ``ssl_endpoint_identification``) and the pass-through of any client property by name:
   ``--set kafka.<property>=<value>`` or ``GRUDGE_KAFKA_<PROPERTY>`` (dots as underscores).
   Setting one property both ways is refused.

``client_config(settings)`` gives the confluent-kafka clients (consumers, producers, admin
clients, the snapshot store, the output publisher) that dict; ``faust_options(settings)``
gives the Faust runtime's aiokafka connection the same security as ``broker_credentials``
(with an ``ssl.SSLContext`` made by the stdlib); ``check_connection(settings)`` is the
startup check that turns a wrong password into one line instead of endless retries.

Secrets (passwords, the OIDC client secret) are never logged: ``redacted`` masks them
wherever a configuration is shown.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import ssl
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Mapping

from grudge_stream.exceptions import ConfigError

log = logging.getLogger("grudge_stream.kafkaconf")

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
PASSTHROUGH_PREFIX = "kafka."

# Named setting -> librdkafka property.
NAMED: dict[str, str] = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanisms",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
    "ssl_ca_location": "ssl.ca.location",
    "ssl_certificate_location": "ssl.certificate.location",
    "ssl_key_location": "ssl.key.location",
    "ssl_key_password": "ssl.key.password",
    "ssl_endpoint_identification": "ssl.endpoint.identification.algorithm",
}
# Other spellings librdkafka (or Java) accepts for one property: normalised so that two
# layers setting the same property under two names cannot both apply.
ALIASES: dict[str, str] = {
    "sasl.mechanism": "sasl.mechanisms",
    "metadata.broker.list": "bootstrap.servers",
    "delivery.timeout.ms": "message.timeout.ms",
    "request.required.acks": "acks",
    # Environment variables cannot tell dots from underscores: GRUDGE_KAFKA_LOG_LEVEL.
    "log.level": "log_level",
}
# Properties grudge-stream sets itself because its guarantees depend on them.
PROTECTED: dict[str, str] = {
    "bootstrap.servers": "give the brokers with --bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS",
    "group.id": "it is the setting app_id",
    "group.instance.id": "it is the setting group_instance_id",
    "transactional.id": "it is derived from app_id and group_instance_id",
    "enable.auto.commit": "offsets are committed only behind durable snapshots",
    "enable.auto.offset.store": "offsets are committed only behind durable snapshots",
    "isolation.level": "restores and exactly-once depend on it",
    "enable.idempotence": "outputs and snapshots depend on it",
    "acks": "outputs and snapshots are written with acks=all",
    "message.timeout.ms": "outputs are retried without a deadline (docs/runtime.md)",
    "transaction.timeout.ms": "it is the setting transaction_timeout_s",
    "session.timeout.ms": "it is the setting session_timeout_s",
    "heartbeat.interval.ms": "it is the setting heartbeat_interval_s",
    "auto.offset.reset": "positions come from snapshots",
    "enable.partition.eof": "the runtimes depend on it",
}
CALLBACKS = ("error_cb", "throttle_cb", "stats_cb", "logger", "oauth_cb", "on_delivery", "on_commit",
             "on_revoke", "on_assign")
# Shown as "***" by ``redacted``.
SECRET_PROPERTIES = ("sasl.password", "ssl.key.password", "sasl.oauthbearer.client.secret",
                     "ssl.keystore.password", "ssl.key.pem", "sasl.oauthbearer.config",
                     "sasl.oauthbearer.assertion.private.key.passphrase",
                     "sasl.oauthbearer.assertion.private.key.pem", "sasl.jaas.config")
# Security properties the Faust runtime's aiokafka connection can apply (the others would
# be silently dropped there, so the Faust runtime refuses them).
FAUST_SECURITY = {
    "security.protocol", "sasl.mechanisms", "sasl.username", "sasl.password", "ssl.ca.location",
    "ssl.ca.pem", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
    "sasl.oauthbearer.method", "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions",
    "enable.sasl.oauthbearer.unsecure.jwt", "sasl.oauthbearer.config", "https.ca.location",
}


def _security_property(name: str) -> bool:
    return name.startswith(("ssl.", "sasl.", "ssl_", "enable.ssl.", "enable.sasl.", "https."))


# -- reading the settings -------------------------------------------------------------------------


def _given(settings, name: str) -> Any:
    """A setting's value if it was given (flag or environment), else None — declared
    defaults do not count, so a properties file is not overridden by them."""
    sources = getattr(settings, "sources", None) or {}
    if name in sources:
        return None if sources[name] == "default" else settings.values.get(name)
    return settings.get(name, None)


# Variables that start like a pass-through one (GRUDGE_KAFKA_...) but are a setting
# (kafka_properties_file) or belong to the dev broker and test tooling (docs/dev-broker.md).
_NOT_PASSTHROUGH = ("PROPERTIES_FILE", "CACHE", "VERSION", "HEAP", "BACKEND", "IMAGE")


def _env_passthrough(environ: Mapping[str, str], scope: str = "") -> dict[str, str]:
    prefix = "GRUDGE_" + scope + PASSTHROUGH_PREFIX.upper().replace(".", "_")
    out = {}
    for var, value in environ.items():
        if not var.startswith(prefix):
            continue
        rest = var[len(prefix):]
        if rest in _NOT_PASSTHROUGH or "__" in rest or (not scope and "__" in var):
            continue  # another topology's scoped variable
        out[rest.lower().replace("_", ".")] = value
    return out


def passthrough(settings) -> dict[str, str]:
    """Client properties given by name: ``--set kafka.<property>=<value>`` flags over
    ``GRUDGE_<TOPOLOGY>__KAFKA_<PROPERTY>`` over ``GRUDGE_KAFKA_<PROPERTY>`` variables (dots
    as underscores; ``GRUDGE_KAFKA_LOG_LEVEL`` is ``log_level``)."""
    out = _env_passthrough(settings.environ)
    topology = getattr(settings, "topology", None)
    if topology:
        out.update(_env_passthrough(settings.environ, topology.upper() + "__"))
    for name, value in settings.overrides.items():
        if name.startswith(PASSTHROUGH_PREFIX):
            out[name[len(PASSTHROUGH_PREFIX):]] = value
    return {_canonical(k): str(v) for k, v in out.items()}


def _canonical(name: str) -> str:
    name = name.strip()
    return ALIASES.get(name, name)


# -- the properties file --------------------------------------------------------------------------


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            n = text[i + 1]
            if n == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2:i + 6] or ""):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_properties(text: str, where: str = "properties") -> dict[str, str]:
    """Java ``.properties`` text: ``key=value``, ``key: value`` or ``key value``; ``#`` and
    ``!`` comments; a trailing backslash continues a line; backslash escapes."""
    props: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip()
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip()
            i += 1
        if _continues(line):
            line = line[:-1]
        m = re.match(r"((?:\\.|[^\\=:\s])+)\s*(?:[=:]\s*|\s+|$)(.*)$", line, re.S)
        if m is None:
            raise ConfigError(f"{where}: cannot read line {i}: {line[:40]!r}")
        key, value = _unescape(m.group(1)), _unescape(m.group(2).rstrip() if m.group(2) else "")
        props[key] = value
    return props


def _continues(line: str) -> bool:
    n = len(line) - len(line.rstrip("\\"))
    return n % 2 == 1


_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": ("PLAIN",),
    "org.apache.kafka.common.security.scram.ScramLoginModule": ("SCRAM-SHA-256", "SCRAM-SHA-512"),
}


def _from_jaas(jaas: str, where: str) -> dict[str, str]:
    """User name and password from a Java ``sasl.jaas.config`` (PLAIN or SCRAM login module)."""
    module = jaas.strip().split(None, 1)[0] if jaas.strip() else ""
    if module not in _JAAS_MODULES:
        raise ConfigError(f"{where}: sasl.jaas.config with {module or 'no login module'!r} is not supported "
                          "(only the PLAIN and SCRAM login modules: give sasl.username and sasl.password)")
    fields = dict(re.findall(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"', jaas))
    out = {}
    if "username" in fields:
        out["sasl.username"] = fields["username"]
    if "password" in fields:
        out["sasl.password"] = fields["password"]
    return out


def read_properties_file(path: str) -> dict[str, str]:
    """The client properties of ``kafka_properties_file`` (``bootstrap.servers`` included)."""
    where = f"kafka_properties_file {path!r}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text") from None
    props = {_canonical(k): v for k, v in parse_properties(text, where).items()}
    jaas = props.pop("sasl.jaas.config", None)
    if jaas is not None:
        for k, v in _from_jaas(jaas, where).items():
            props.setdefault(k, v)
    return props


def properties_file_bootstrap(settings) -> str | None:
    """``bootstrap.servers`` of the properties file, if there is one and it names them."""
    path = _given(settings, "kafka_properties_file")
    if not path:
        return None
    return read_properties_file(path).get("bootstrap.servers") or None


def use_properties_file_bootstrap(settings) -> None:
    """Take the brokers from the properties file's ``bootstrap.servers`` when nothing else
    names them (``--bootstrap-servers``, ``GRUDGE_BOOTSTRAP_SERVERS``,
    ``KAFKA_BOOTSTRAP_SERVERS``). For a ``Settings`` before it is bound (the CLI)."""
    env = settings.environ
    if "bootstrap_servers" in settings.overrides or "KAFKA_BOOTSTRAP_SERVERS" in env or any(
            v == "GRUDGE_BOOTSTRAP_SERVERS" or v.endswith("__BOOTSTRAP_SERVERS") for v in env):
        return
    found = properties_file_bootstrap(settings)
    if found:
        settings.overrides["bootstrap_servers"] = found


# -- the merged client properties -----------------------------------------------------------------


def _read_secret_file(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"{what} {path!r} cannot be read: {exc.strerror or exc}") from None
    text = text.rstrip("\r\n")
    if not text:
        raise ConfigError(f"{what} {path!r} is empty")
    return text


def _check_readable(path: str, what: str, directory_ok: bool = False) -> None:
    if directory_ok and os.path.isdir(path):
        return
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{what} {path!r} cannot be read: {exc.strerror or exc}") from None


def _check_name(name: str, origin: str) -> None:
    if not name or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ConfigError(f"{origin}: {name!r} is not a Kafka client property name")
    if name in CALLBACKS:
        raise ConfigError(f"{origin}: {name!r} is a callback and cannot be set from settings")
    if name in PROTECTED:
        raise ConfigError(f"{origin}: the client property {name!r} is set by grudge-stream ({PROTECTED[name]})")


_warned: set = set()


def client_properties(settings) -> dict[str, str]:
    """The merged, checked librdkafka properties (no ``bootstrap.servers``, no callbacks).

    Raises ConfigError (one line) for an unknown protocol or mechanism, SASL without a user
    name or password, TLS files that cannot be read, a property set twice, or a property
    grudge-stream must set itself."""
    props: dict[str, str] = {}
    path = _given(settings, "kafka_properties_file")
    if path:
        ignored = []
        for k, v in read_properties_file(path).items():
            if k == "bootstrap.servers":
                continue  # used by the CLI when no other source names the brokers
            if k in PROTECTED:
                ignored.append(k)
                continue
            _check_name(k, f"kafka_properties_file {path!r}")
            props[k] = v
        if ignored and (path, tuple(ignored)) not in _warned:
            _warned.add((path, tuple(ignored)))
            log.warning("kafka_properties_file %r: ignoring %s (grudge-stream sets them itself)",
                        path, ", ".join(ignored))
    named: dict[str, tuple[str, str]] = {}
    for setting, prop in NAMED.items():
        value = _given(settings, setting)
        if value is not None and str(value) != "":
            named[prop] = (setting, str(value))
    pw_file = _given(settings, "sasl_password_file")
    if pw_file:
        if "sasl.password" in named:
            raise ConfigError("set either sasl_password or sasl_password_file, not both")
        named["sasl.password"] = ("sasl_password_file", _read_secret_file(pw_file, "sasl_password_file"))
    given = passthrough(settings)
    for k in given:
        _check_name(k, f"setting {PASSTHROUGH_PREFIX + k!r}")
        if k in named:
            raise ConfigError(f"the client property {k!r} is given twice: as {named[k][0]} and as "
                              f"{PASSTHROUGH_PREFIX + k}; set it once")
    props.update(given)
    props.update({prop: value for prop, (_, value) in named.items()})
    _normalise_and_check(props)
    return props


def _normalise_and_check(props: dict[str, str]) -> None:
    proto = props.get("security.protocol", "PLAINTEXT").strip().upper()
    if proto not in SECURITY_PROTOCOLS:
        raise ConfigError(f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, got "
                          f"{props['security.protocol']!r}")
    if "security.protocol" in props:
        props["security.protocol"] = proto
    sasl = proto.startswith("SASL_")
    tls = proto in ("SSL", "SASL_SSL")
    mech = props.get("sasl.mechanisms", "").strip().upper()
    if sasl:
        mech = mech or "PLAIN"  # librdkafka's own default would be GSSAPI
        if mech not in SASL_MECHANISMS:
            raise ConfigError(f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, got "
                              f"{props['sasl.mechanisms']!r}")
        props["sasl.mechanisms"] = mech
        if mech == "OAUTHBEARER":
            method = props.get("sasl.oauthbearer.method", "default").lower()
            unsecure = props.get("enable.sasl.oauthbearer.unsecure.jwt", "false").lower() == "true"
            if method == "oidc":
                missing = [p for p in ("sasl.oauthbearer.client.id", "sasl.oauthbearer.token.endpoint.url")
                           if not props.get(p)]
                if missing:
                    raise ConfigError("sasl_mechanism OAUTHBEARER with sasl.oauthbearer.method=oidc needs "
                                      + " and ".join(PASSTHROUGH_PREFIX + p for p in missing))
            elif not unsecure:
                raise ConfigError(
                    "sasl_mechanism OAUTHBEARER needs kafka.sasl.oauthbearer.method=oidc with "
                    "kafka.sasl.oauthbearer.client.id, kafka.sasl.oauthbearer.client.secret and "
                    "kafka.sasl.oauthbearer.token.endpoint.url (or, for tests only, "
                    "kafka.enable.sasl.oauthbearer.unsecure.jwt=true)")
        else:
            if not props.get("sasl.username"):
                raise ConfigError(f"security_protocol {proto} with sasl_mechanism {mech} needs sasl_username")
            if not props.get("sasl.password"):
                raise ConfigError(f"security_protocol {proto} with sasl_mechanism {mech} needs sasl_password "
                                  "or sasl_password_file")
    else:
        stray = sorted(k for k in props if k.startswith("sasl."))
        if stray:
            raise ConfigError(f"{_setting_name(stray[0])} is set but security_protocol is {proto}: "
                              "set security_protocol=SASL_SSL (or SASL_PLAINTEXT)")
    if not tls:
        stray = sorted(k for k in props if k.startswith("ssl.") and k != "ssl.endpoint.identification.algorithm")
        if stray:
            raise ConfigError(f"{_setting_name(stray[0])} is set but security_protocol is {proto}: "
                              "set security_protocol=SSL or SASL_SSL")
    ident = props.get("ssl.endpoint.identification.algorithm")
    if ident is not None:
        ident = ident.strip().lower()
        if ident not in ("https", "none"):
            raise ConfigError(f"ssl_endpoint_identification must be https or none, got {ident!r}")
        props["ssl.endpoint.identification.algorithm"] = ident
    for prop, directory_ok in (("ssl.ca.location", True), ("ssl.certificate.location", False),
                               ("ssl.key.location", False)):
        if props.get(prop) and not (prop == "ssl.ca.location" and props[prop] == "probe"):
            _check_readable(props[prop], _setting_name(prop), directory_ok)
    if bool(props.get("ssl.certificate.location")) != bool(props.get("ssl.key.location")):
        raise ConfigError("ssl_certificate_location and ssl_key_location go together (mutual TLS)")


def _setting_name(prop: str) -> str:
    for setting, p in NAMED.items():
        if p == prop:
            return setting
    return PASSTHROUGH_PREFIX + prop


def redacted(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with secrets masked, for logs and error messages."""
    return {k: ("***" if k in SECRET_PROPERTIES or "secret" in k or "password" in k else v)
            for k, v in conf.items()}


# -- librdkafka's log lines -----------------------------------------------------------------------


class _OncePer(logging.Filter):
    """Lets one log line of a kind (its text without numbers) through per interval: a
    broker that refuses a client would otherwise log on every reconnect of every client."""

    def __init__(self, interval_s: float = 30.0) -> None:
        super().__init__()
        self.interval = interval_s
        self.last: dict[str, float] = {}
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is let through as is
            return True
        # A broker that has just started loads its transaction coordinator: an idempotent
        # producer's first PID request is told to wait, and librdkafka retries on its own (a
        # lasting failure shows as undelivered records). A line at every start says nothing.
        if "Coordinator load in progress: retrying" in text:
            return False
        # Without the client's name ("rdkafka#producer-3", "<client.id>#consumer-1") and numbers:
        # the same refusal seen by every client, after any delay, is one kind.
        kind = re.sub(r"\d+", "#", re.sub(r"\S*#(?:producer|consumer)-\d+", "", text))
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(kind, -1e9) < self.interval:
                return False
            if len(self.last) > 1000:
                self.last.clear()
            self.last[kind] = now
        return True


def client_logger() -> logging.Logger:
    """The logger librdkafka's lines go to (through ``logging``, at most one line of a kind
    every 30 s), instead of raw stderr."""
    lg = logging.getLogger("grudge_stream.kafka")
    if not any(isinstance(f, _OncePer) for f in lg.filters):
        lg.addFilter(_OncePer())
    return lg


# -- what the clients get -------------------------------------------------------------------------


def client_config(settings, bootstrap_servers: str | None = None) -> dict[str, Any]:
    """The configuration every confluent-kafka client starts from: ``bootstrap.servers``, the
    security and pass-through properties, and a ``logger``. Callers add their own properties
    underneath: ``Consumer({**defaults, **client_config(settings), **required})``."""
    return {"bootstrap.servers": bootstrap_servers or settings.bootstrap_servers,
            **client_properties(settings), "logger": client_logger()}


# librdkafka's own limit on a produced message, a little above the broker's default record
# batch limit (1 MiB + overhead): what the snapshot chunks are sized against (and the
# snapshot topic's max.message.bytes).
PRODUCER_MAX_MESSAGE_BYTES = 1024 * 1024 + 4096

# Lower the consumer's idle backoff between fetches (default 1000 ms): with it the
# batched consume() reads several times faster. The prefetch is bounded: with 64 MiB fetches
# of 8 MiB per partition and 200,000 queued records per partition, a worker with a backlog
# peaked at ~870 MiB RSS (against ~360 MiB with these) and was no faster (1.11 M events/s
# either way, 3 M events over 8 partitions; benchmarks/peers, "Peak RSS").
FAST_CONSUMER = {"fetch.queue.backoff.ms": 1, "queued.min.messages": 20_000,
                 "fetch.max.bytes": 8 * 1024 * 1024, "max.partition.fetch.bytes": 1024 * 1024}


def producer_config(client_config: Mapping[str, Any], *, bootstrap_servers: str | None = None,
                    linger_ms: int = 5, max_message_bytes: int | None = PRODUCER_MAX_MESSAGE_BYTES,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The configuration of every producer of a worker (outputs, snapshots, the transactional
    producer of exactly-once, the repartition stage): batched (``linger_ms``), lz4, idempotent
    with ``acks=all`` — set after the client properties, so a pass-through property cannot
    weaken them — then ``extra`` (a transactional id, a partitioner, a caller's overrides)."""
    conf: dict[str, Any] = {} if bootstrap_servers is None else {"bootstrap.servers": bootstrap_servers}
    conf["linger.ms"] = linger_ms
    conf["compression.type"] = "lz4"
    if max_message_bytes is not None:
        conf["message.max.bytes"] = max_message_bytes
    conf.update(client_config)
    conf["enable.idempotence"] = True
    conf["acks"] = "all"
    conf.update(extra or {})
    return conf


def describe(settings) -> str:
    """One line for the startup log: protocol, mechanism and user, no secrets."""
    return describe_properties(client_properties(settings))


def describe_properties(props: Mapping[str, Any]) -> str:
    """``describe`` of a set of client properties."""
    proto = props.get("security.protocol", "PLAINTEXT")
    if proto.startswith("SASL_"):
        mech = props.get("sasl.mechanisms", "PLAIN")
        who = f" as {props['sasl.username']!r}" if props.get("sasl.username") else ""
        return f"{proto} ({mech}{who})"
    return proto


def _ssl_context(props: Mapping[str, str]) -> ssl.SSLContext:
    ca = props.get("ssl.ca.location")
    cadata = props.get("ssl.ca.pem")
    if ca and ca != "probe":
        if os.path.isdir(ca):
            ctx = ssl.create_default_context(capath=ca, cadata=cadata)
        else:
            ctx = ssl.create_default_context(cafile=ca, cadata=cadata)
    else:
        ctx = ssl.create_default_context(cadata=cadata)
    if props.get("ssl.endpoint.identification.algorithm", "https") == "none":
        ctx.check_hostname = False
    if props.get("enable.ssl.certificate.verification", "true").lower() == "false":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert = props.get("ssl.certificate.location")
    if cert:
        try:
            ctx.load_cert_chain(cert, props.get("ssl.key.location"), password=props.get("ssl.key.password"))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the client certificate {cert!r} and its key: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
    return ctx


def faust_options(settings) -> dict[str, Any]:
    """``broker_credentials`` for ``faust.App`` (aiokafka), from the same settings; ``{}``
    for PLAINTEXT. Security properties aiokafka cannot apply are refused (one line)."""
    import faust

    props = client_properties(settings)
    proto = props.get("security.protocol", "PLAINTEXT")
    unsupported = sorted(k for k in props if _security_property(k) and k not in FAUST_SECURITY)
    if unsupported:
        raise ConfigError(f"the Faust runtime cannot apply the client property {unsupported[0]!r} to its "
                          "aiokafka connection (docs/security.md lists what it supports); use "
                          "--runtime batch, or the PEM settings ssl_ca_location / ssl_certificate_location "
                          "/ ssl_key_location")
    if proto == "PLAINTEXT":
        return {}
    ctx = _ssl_context(props) if proto in ("SSL", "SASL_SSL") else None
    if proto == "SSL":
        return {"broker_credentials": faust.SSLCredentials(ctx)}
    mech = props["sasl.mechanisms"]
    if mech == "OAUTHBEARER":
        return {"broker_credentials": faust.OAuthCredentials(oauth_cb=token_provider(props), ssl_context=ctx)}
    return {"broker_credentials": faust.SASLCredentials(username=props["sasl.username"],
                                                         password=props["sasl.password"],
                                                         ssl_context=ctx, mechanism=mech)}


# -- a Faust app's own connection, for the confluent-kafka clients of its embedded state ------

# What an ``ssl.SSLContext`` keeps to itself: a client certificate and key loaded into it
# cannot be read back, so mutual TLS has to be repeated in the state's client_config.
SSL_CONTEXT_UNMAPPED = ("a client certificate in the app's SSL context cannot be read back from it "
                        "(mutual TLS: give ssl.certificate.location and ssl.key.location in client_config)")


def faust_bootstrap(app) -> str:
    """``bootstrap.servers`` of a Faust app's broker list (``app.conf.broker``: one or more
    ``kafka://host:port`` URLs; a URL without a port means 9092, as Faust has it)."""
    urls = app.conf.broker
    if not isinstance(urls, (list, tuple)):
        urls = [urls]
    hosts = []
    for url in urls:
        if getattr(url, "scheme", "kafka") not in ("kafka", "aiokafka"):
            raise ConfigError(f"the Faust app's broker {str(url)!r} is not a Kafka one (kafka://host:port): "
                              "give the state bootstrap_servers")
        host = getattr(url, "host", None)
        if not host:
            raise ConfigError(f"the Faust app's broker {str(url)!r} names no host (kafka://host:port)")
        hosts.append(f"{host}:{url.port or 9092}")
    return ",".join(hosts)


def _ssl_properties(ctx: ssl.SSLContext) -> dict[str, str]:
    """What librdkafka can be told of an SSL context: its CA certificates (as PEM) and whether
    it verifies the broker's certificate and host name."""
    props: dict[str, str] = {}
    cas = ctx.get_ca_certs(binary_form=True)
    if cas:
        props["ssl.ca.pem"] = "".join(ssl.DER_cert_to_PEM_cert(der) for der in cas)
    else:
        props["ssl.ca.location"] = "probe"  # the system's store, as a default context has it
    if ctx.verify_mode == ssl.CERT_NONE:
        props["enable.ssl.certificate.verification"] = "false"
    props["ssl.endpoint.identification.algorithm"] = "https" if ctx.check_hostname else "none"
    return props


def faust_client_properties(app) -> tuple[dict[str, str], str | None]:
    """The confluent-kafka security properties of a Faust app's ``broker_credentials`` (SASL
    PLAIN / SCRAM / GSSAPI, TLS), and one line on what could not be carried over (None:
    everything was). OAUTHBEARER's token provider is aiokafka's and cannot be: ConfigError."""
    import faust
    from faust.types.auth import to_credentials

    cred = to_credentials(app.conf.broker_credentials)
    if cred is None:
        return {}, None
    ctx = getattr(cred, "ssl_context", None) if not isinstance(cred, faust.SSLCredentials) else cred.context
    props: dict[str, str] = {}
    unmapped: list[str] = []
    if isinstance(cred, faust.OAuthCredentials):
        raise ConfigError("the Faust app's OAuthCredentials (an aiokafka token provider) cannot be handed to "
                          "confluent-kafka: give the state client_config with the sasl.oauthbearer.* "
                          "properties (docs/security.md)")
    if isinstance(cred, faust.SASLCredentials):
        props.update({"security.protocol": "SASL_SSL" if ctx is not None else "SASL_PLAINTEXT",
                      "sasl.mechanisms": str(getattr(cred.mechanism, "value", cred.mechanism)),
                      "sasl.username": cred.username or "", "sasl.password": cred.password or ""})
    elif isinstance(cred, faust.GSSAPICredentials):
        props.update({"security.protocol": "SASL_SSL" if ctx is not None else "SASL_PLAINTEXT",
                      "sasl.mechanisms": "GSSAPI",
                      "sasl.kerberos.service.name": cred.kerberos_service_name})
        if cred.kerberos_domain_name:
            unmapped.append("kerberos_domain_name (librdkafka takes the broker's host name)")
    elif isinstance(cred, faust.SSLCredentials):
        props["security.protocol"] = "SSL"
    else:
        raise ConfigError(f"the Faust app's broker_credentials {type(cred).__name__} cannot be handed to "
                          "confluent-kafka: give the state client_config")
    if ctx is not None:
        props.update(_ssl_properties(ctx))
        unmapped.append(SSL_CONTEXT_UNMAPPED)
    return props, ("; ".join(unmapped) or None)


# -- OAUTHBEARER for aiokafka ---------------------------------------------------------------------


def token_provider(props: Mapping[str, str]):
    """An aiokafka token provider doing what librdkafka does for the same properties:
    ``sasl.oauthbearer.method=oidc`` (client credentials grant against
    ``sasl.oauthbearer.token.endpoint.url``), or an unsecured JWT
    (``enable.sasl.oauthbearer.unsecure.jwt=true``, for tests)."""
    from aiokafka.abc import AbstractTokenProvider

    extensions = dict(kv.split("=", 1) for kv in props.get("sasl.oauthbearer.extensions", "").split(",")
                      if "=" in kv)

    class _Provider(AbstractTokenProvider):
        def __init__(self) -> None:
            self._token: str | None = None
            self._expires = 0.0
            self._lock = threading.Lock()

        async def token(self) -> str:
            return await asyncio.get_running_loop().run_in_executor(None, self.token_sync)

        def token_sync(self) -> str:
            with self._lock:
                if self._token is None or time.time() > self._expires:
                    self._token, lifetime = (_oidc_token(props)
                                             if props.get("sasl.oauthbearer.method", "").lower() == "oidc"
                                             else _unsecured_jwt(props))
                    # Refresh at 80% of the lifetime, as librdkafka does.
                    self._expires = time.time() + 0.8 * lifetime
                return self._token

        def extensions(self) -> dict:
            return dict(extensions)

    return _Provider()


def _oidc_token(props: Mapping[str, str]) -> tuple[str, float]:
    url = props["sasl.oauthbearer.token.endpoint.url"]
    form = {"grant_type": "client_credentials"}
    if props.get("sasl.oauthbearer.scope"):
        form["scope"] = props["sasl.oauthbearer.scope"]
    basic = base64.b64encode(
        f"{urllib.parse.quote(props['sasl.oauthbearer.client.id'], safe='')}:"
        f"{urllib.parse.quote(props.get('sasl.oauthbearer.client.secret', ''), safe='')}".encode()).decode()
    req = urllib.request.Request(url, data=urllib.parse.urlencode(form).encode(), method="POST", headers={
        "Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded",
        "Accept": "application/json"})
    ctx = None
    if url.lower().startswith("https:"):
        ctx = ssl.create_default_context(cafile=props.get("https.ca.location") or None)
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:  # noqa: S310 - configured URL
            body = json.loads(resp.read().decode())
    except Exception as exc:  # noqa: BLE001 - reported as one line by aiokafka's connection
        raise ConnectionError(f"OAUTHBEARER token request to {url} failed: {exc}") from None
    token = body.get("access_token")
    if not token:
        raise ConnectionError(f"OAUTHBEARER token endpoint {url} returned no access_token")
    lifetime = float(body.get("expires_in") or _jwt_lifetime(token) or 300)
    return token, lifetime


def _jwt_lifetime(token: str) -> float | None:
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"]) - time.time()
    except Exception:  # noqa: BLE001 - not a JWT we can read: the caller's default applies
        return None


def _unsecured_jwt(props: Mapping[str, str]) -> tuple[str, float]:
    """librdkafka's ``sasl.oauthbearer.config`` (``principal=... lifeSeconds=... scope=...``)
    as an unsecured JWT (``alg: none``), which brokers accept only with their unsecured
    validator: for tests."""
    conf = dict(kv.split("=", 1) for kv in props.get("sasl.oauthbearer.config", "").split() if "=" in kv)
    principal = conf.get("principal")
    if not principal:
        raise ConfigError("enable.sasl.oauthbearer.unsecure.jwt needs kafka.sasl.oauthbearer.config=principal=<name>")
    life = float(conf.get("lifeSeconds", 3600))
    now = int(time.time())
    claims: dict[str, Any] = {"sub": principal, "iat": now, "exp": now + int(life)}
    if conf.get("scope"):
        claims["scope"] = conf["scope"].split(",")

    def b64(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")

    return f"{b64({'alg': 'none'})}.{b64(claims)}.", life


# -- the startup check ----------------------------------------------------------------------------

AUTH_HINT = {
    "PLAIN": "check sasl_username and sasl_password (or sasl_password_file)",
    "SCRAM-SHA-256": "check sasl_username and sasl_password (or sasl_password_file), and that the user has "
                     "SCRAM-SHA-256 credentials on the cluster",
    "SCRAM-SHA-512": "check sasl_username and sasl_password (or sasl_password_file), and that the user has "
                     "SCRAM-SHA-512 credentials on the cluster",
    "OAUTHBEARER": "check the OAUTHBEARER client id, secret and token endpoint",
}


# librdkafka's words for a client speaking another protocol than the listener.
_MISMATCH_HINTS = ("connecting to a PLAINTEXT broker listener", "incorrect security.protocol",
                   "connecting to a SSL listener")


def _generic(text: str) -> bool:
    return "brokers are down" in text or text.startswith("Failed to get metadata")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def check_connection(settings, timeout_s: float = 5.0, wait_s: float | None = None, *,
                     bootstrap_servers: str | None = None, properties: Mapping[str, Any] | None = None,
                     warn: bool = True) -> None:
    """Connect once with the configured security and ask for metadata.

    An authentication or TLS failure raises ConfigError at once — one line naming the
    broker — instead of the clients retrying for ever. A broker that does not answer
    within ``timeout_s`` gets one warning line, then a line every 15 s while the check
    retries, up to ``wait_s`` (setting ``broker_wait_s``, 120 s): then a ConfigError (exit
    2; a supervisor restarts the worker). Bad settings and unknown client properties are
    ConfigErrors too. ``warn=False`` (a client command's short wait) leaves out the lines
    while it waits: the one that ends it says it all. ``bootstrap_servers`` and ``properties`` (an embedded state's own,
    e.g. those of its Faust app) stand in for the settings' when given."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    props = dict(client_properties(settings) if properties is None else
                 {k: v for k, v in properties.items() if k not in CALLBACKS and k != "bootstrap.servers"})
    bootstrap = bootstrap_servers or settings.bootstrap_servers
    errors: list = []
    silent = logging.getLogger("grudge_stream.kafka.check")
    silent.propagate = False
    if not silent.handlers:
        silent.addHandler(logging.NullHandler())
    conf = {"bootstrap.servers": bootstrap, **props, "log_level": 0, "logger": silent,
            "error_cb": errors.append, "socket.connection.setup.timeout.ms": int(timeout_s * 1000),
            "reconnect.backoff.max.ms": 1000}
    try:
        admin = AdminClient(conf)
    except KafkaException as exc:
        err = exc.args[0]
        raise ConfigError(f"invalid Kafka client configuration: {_one_line(err.str())}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid Kafka client configuration: {_one_line(exc)}") from None
    who = describe(settings) if properties is None else describe_properties(props)
    if wait_s is None:
        wait_s = settings.get("broker_wait_s", 120.0)
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    warned_at = None
    last = None
    where = f"cannot connect to Kafka at {bootstrap} with {who}"
    while True:
        try:
            md = admin.list_topics(timeout=0.5)
            if md.brokers:
                return
        except KafkaException as exc:
            errors.append(exc.args[0])
        admin.poll(0)
        for err in list(errors):
            code, text = err.code(), _one_line(err.str())
            if code == KafkaError._AUTHENTICATION or code == KafkaError.SASL_AUTHENTICATION_FAILED:
                if "handshake failed" in text:  # the listener does not offer this mechanism
                    raise ConfigError(f"{where}: SASL handshake failed ({text}). Operator action: check "
                                      "security_protocol and sasl_mechanism against the broker's listener")
                mech = props.get("sasl.mechanisms", "")
                raise ConfigError(f"{where}: authentication failed ({text}). Operator action: "
                                  f"{AUTH_HINT.get(mech, 'check the TLS client certificate and key')}")
            if code == KafkaError._SSL:
                raise ConfigError(f"{where}: TLS handshake failed ({text}). Operator action: check "
                                  "ssl_ca_location, ssl_endpoint_identification and that the address is the "
                                  "broker's TLS listener")
            if any(hint in text for hint in _MISMATCH_HINTS):
                raise ConfigError(f"{where}: the listener speaks another protocol ({text}). Operator action: "
                                  "set security_protocol to the listener's")
            if last is None or not _generic(text):
                last = err
        errors.clear()
        now = time.monotonic()
        if now > deadline:
            detail = f" (last error: {_one_line(last.str())})" if last is not None else ""
            if now - t0 >= max(wait_s, timeout_s):
                raise ConfigError(
                    f"Kafka at {bootstrap} did not answer within {now - t0:.0f} s{detail}. Operator action: "
                    "check bootstrap_servers, the network and security_protocol; broker_wait_s sets how long "
                    "a starting worker waits")
            if warn and (warned_at is None or now - warned_at >= 15):
                log.warning("no answer from Kafka at %s with %s after %.0f s%s; retrying for up to %.0f s "
                            "(broker_wait_s; a security_protocol other than the listener's can look like "
                            "this too)", bootstrap, who, now - t0, detail, wait_s)
                warned_at = now
            deadline = now + 1.0
