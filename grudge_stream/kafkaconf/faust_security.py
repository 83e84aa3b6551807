"""The Faust side of the client security: ``faust_options`` gives the Faust runtime's
aiokafka connection the security of the settings (``broker_credentials``), and
``faust_bootstrap`` / ``faust_client_properties`` hand a Faust app's own broker and
credentials to the confluent-kafka clients of its embedded state.
"""
from __future__ import annotations

import os
import ssl
from typing import Any, Mapping

from grudge_stream.exceptions import ConfigError
from grudge_stream.kafkaconf.clients import client_properties
from grudge_stream.kafkaconf.oauth import token_provider

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
