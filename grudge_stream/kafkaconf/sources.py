"""Where the Kafka client properties come from: their names (the named settings, the other
spellings librdkafka accepts, the properties grudge-stream sets itself), the settings and
environment variables that pass any property through by name, and the client properties
file (``kafka_properties_file``).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from grudge_stream.exceptions import ConfigError

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
