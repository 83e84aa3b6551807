"""OAUTHBEARER for the Faust runtime's aiokafka connection: a token provider doing what
librdkafka does for the same properties (``token_provider``).
"""
from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Mapping

from grudge_stream.exceptions import ConfigError


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
