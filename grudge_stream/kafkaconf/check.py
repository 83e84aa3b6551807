"""The startup check (``check_connection``): connect once with the configured security and
turn a wrong password, a TLS mistake or a listener of another protocol into one line
instead of clients retrying for ever.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from grudge_stream.exceptions import ConfigError
from grudge_stream.kafkaconf.clients import client_properties, describe, describe_properties
from grudge_stream.kafkaconf.sources import CALLBACKS

log = logging.getLogger("grudge_stream.kafkaconf")

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
        from grudge_stream.sections import KafkaClient, as_section

        wait_s = as_section(KafkaClient, settings).broker_wait_s
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
