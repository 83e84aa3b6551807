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

The modules: ``sources`` (the property names, the settings and environment that give them,
the properties file), ``clients`` (the merged, checked properties and what each client
gets), ``check`` (the startup check), ``faust_security`` (the Faust runtime's aiokafka
security, and a Faust app's for confluent-kafka clients) and ``oauth`` (OAUTHBEARER tokens
for aiokafka).
"""
from __future__ import annotations

from grudge_stream.kafkaconf.check import AUTH_HINT, check_connection
from grudge_stream.kafkaconf.clients import (
    FAST_CONSUMER,
    PRODUCER_MAX_MESSAGE_BYTES,
    client_config,
    client_logger,
    client_properties,
    describe,
    describe_properties,
    producer_config,
    redacted,
)
from grudge_stream.kafkaconf.faust_security import (
    FAUST_SECURITY,
    SSL_CONTEXT_UNMAPPED,
    faust_bootstrap,
    faust_client_properties,
    faust_options,
)
from grudge_stream.kafkaconf.oauth import token_provider
from grudge_stream.kafkaconf.sources import (
    ALIASES,
    CALLBACKS,
    NAMED,
    PASSTHROUGH_PREFIX,
    PROTECTED,
    SASL_MECHANISMS,
    SECRET_PROPERTIES,
    SECURITY_PROTOCOLS,
    parse_properties,
    passthrough,
    properties_file_bootstrap,
    read_properties_file,
    use_properties_file_bootstrap,
)

__all__ = [
    "ALIASES", "AUTH_HINT", "CALLBACKS", "FAST_CONSUMER", "FAUST_SECURITY", "NAMED", "PASSTHROUGH_PREFIX",
    "PRODUCER_MAX_MESSAGE_BYTES", "PROTECTED", "SASL_MECHANISMS", "SECRET_PROPERTIES", "SECURITY_PROTOCOLS",
    "SSL_CONTEXT_UNMAPPED", "check_connection", "client_config", "client_logger", "client_properties", "describe",
    "describe_properties", "faust_bootstrap", "faust_client_properties", "faust_options", "parse_properties",
    "passthrough", "producer_config", "properties_file_bootstrap", "read_properties_file", "redacted",
    "token_provider", "use_properties_file_bootstrap",
]
