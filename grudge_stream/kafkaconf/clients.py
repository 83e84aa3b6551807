"""The merged, checked client properties (``client_properties``) and what every
confluent-kafka client starts from: ``client_config`` (with a ``logger`` that lets one
librdkafka line of a kind through every 30 s), ``producer_config``, ``FAST_CONSUMER``;
``redacted`` and ``describe`` show a configuration without its secrets.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any, Mapping

from grudge_stream.exceptions import ConfigError
from grudge_stream.kafkaconf.sources import (
    CALLBACKS,
    NAMED,
    PASSTHROUGH_PREFIX,
    PROTECTED,
    SASL_MECHANISMS,
    SECRET_PROPERTIES,
    SECURITY_PROTOCOLS,
    _given,
    passthrough,
    read_properties_file,
)

log = logging.getLogger("grudge_stream.kafkaconf")


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
