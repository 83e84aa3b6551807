"""Signed entries on the topics that steer the workers: the members directory (where queries
are forwarded) and the overrides (who is blocked, who never is). Anyone with Write on those
topics could otherwise redirect queries or hide an abuser (docs/security.md).

``signing_keys_file`` names a file of signing keys, one ``name:secret`` per line (a secret is
32 to 512 printable ASCII characters without spaces or ``:``). Like the hash key, the file is
given to the workers, the views and the operators' CLI, and never written to a topic. With
it:

- every members record and every override entry a worker or ``grudge-stream override``
  writes carries ``signer`` (a key name) and ``mac``: HMAC-SHA256 under that key over the
  entry's kind, its record key and its canonical JSON body;
- workers and ``AlertView`` ignore (and count) entries without a valid MAC, unsigned
  tombstones included: a clear is a signed ``{"action": "clear"}`` entry, a clean shutdown
  a signed members record holding no partitions;
- an override's ``by`` is the name of the key that signed it, not free text;
- a signed entry older (``created_ms`` / ``timestamp_ms``) than the one in force for its
  key is ignored: replaying an old signed record cannot bring an expired decision back.

Every party that verifies needs every key that signs: give the workers the whole file and
each operator a file holding their own key (their name first).
"""
from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from grudge_stream.exceptions import ConfigError

SECRET_MIN, SECRET_MAX = 32, 512


def parse_named_secrets(text: str, where: str, what: str, min_len: int, max_len: int,
                        unnamed: bool = False) -> dict[str, bytes]:
    """``{name: secret}`` from a secrets file's ``name:secret`` lines (``#`` comments and blank
    lines skipped; ``unnamed``: a bare secret is named ``<what>-<line>``), in file order; a
    ConfigError naming the line otherwise. The one parser of token and signing-key files."""
    out: dict[str, bytes] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, secret = line.rpartition(":")
        name, secret = (name.strip() if sep else f"{what}-{n}" if unnamed else ""), secret.strip()
        if not name or not name.isprintable():
            raise ConfigError(f"{where} line {n}: a {what} line is name:{what}, with a printable name")
        if not (min_len <= len(secret) <= max_len and secret.isascii() and secret.isprintable()
                and " " not in secret):
            raise ConfigError(f"{where} line {n}: a {what} is {min_len}-{max_len} printable ASCII characters "
                              "without spaces or ':' (make one with `python -c 'import secrets; "
                              "print(secrets.token_urlsafe(32))'`)")
        if name in out:
            raise ConfigError(f"{where} line {n}: the name {name!r} is used twice")
        out[name] = secret.encode("ascii")
    if not out:
        raise ConfigError(f"{where} holds no {what}")
    return out


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class SigningKeys:
    """Named HMAC keys; ``signer``: the name this party signs with (the file's first)."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        if not keys:
            raise ConfigError("signing keys: none given")
        self._keys = dict(keys)
        self.signer = next(iter(self._keys))

    @classmethod
    def parse(cls, text: str, where: str) -> "SigningKeys":
        return cls(parse_named_secrets(text, where, "key", SECRET_MIN, SECRET_MAX))

    @classmethod
    def from_file(cls, path: str) -> "SigningKeys":
        where = f"signing_keys_file {path!r}"
        try:
            with open(path, encoding="utf-8") as f:
                return cls.parse(f.read(), where)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None

    @classmethod
    def from_settings(cls, settings: Any) -> "SigningKeys | None":
        """The keys of ``signing_keys_file`` of a ``Serving`` section (or of the ``Settings``
        it is read from), or None."""
        from grudge_stream.sections import Serving, as_section

        path = as_section(Serving, settings).signing_keys_file
        return cls.from_file(path) if path else None

    def _mac(self, secret: bytes, kind: str, key: bytes, body: dict[str, Any], signer: str) -> str:
        msg = b"grudge-stream signed entry v1\x00" + kind.encode() + b"\x00" + key + b"\x00" + \
            signer.encode("utf-8") + b"\x00" + _canonical(body)
        return hmac.new(secret, msg, hashlib.sha256).hexdigest()

    def sign(self, kind: str, key: bytes, body: dict[str, Any]) -> bytes:
        """``body`` with ``signer`` and ``mac`` added, as the record value."""
        clean = {k: v for k, v in body.items() if k not in ("signer", "mac")}
        mac = self._mac(self._keys[self.signer], kind, key, clean, self.signer)
        return _canonical({**clean, "signer": self.signer, "mac": mac})

    def verify(self, kind: str, key: bytes | None, value: bytes | None) -> tuple[dict[str, Any], str]:
        """``(body, signer)`` of a valid signed entry; ValueError with the reason otherwise."""
        if key is None:
            raise ValueError("no record key")
        if value is None:
            raise ValueError("an unsigned tombstone")
        try:
            doc = json.loads(value)
        except ValueError:
            raise ValueError("not JSON") from None
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        signer, mac = doc.pop("signer", None), doc.pop("mac", None)
        if not isinstance(signer, str) or not isinstance(mac, str):
            raise ValueError("unsigned")
        secret = self._keys.get(signer)
        if secret is None:
            raise ValueError(f"signed by an unknown key {signer[:40]!r}")
        if not hmac.compare_digest(self._mac(secret, kind, key, doc, signer), mac):
            raise ValueError(f"a MAC that does not verify under {signer[:40]!r}")
        return doc, signer
