"""The secret SipHash key of a topology that hashes keys chosen by the public.

With a known hash key an attacker finds, in well under a second, a handful of
keys whose cells cover an innocent's cells (framing it) or an abuser's
(hiding it). Every topology whose keys come from the public therefore hashes
with SipHash-2-4 under a secret 128-bit key that the operator provides, and
refuses to start without one.

Where the key comes from (settings, see docs/security.md):

- ``seed``: the key as 32 hex digits (an optional ``0x`` prefix) or as base64
  (standard or URL-safe alphabet, padding optional). Longer key material
  (a 32-byte secret, say) is accepted and condensed to 128 bits with
  SHA-256; less than 128 bits is refused.
- ``seed_file``: a file holding that text (a mounted Kubernetes secret).
- ``insecure_public_seed=true``: the public all-zero key, for throwaway use;
  a warning on every start.

The key is never written anywhere: not in snapshots, logs or metrics.
Snapshots carry ``fingerprint``, a keyed hash of a fixed label, so a worker
started with another key refuses them with a clear message, and nobody can
recover or test a key from it faster than by brute force over 128 bits.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
from typing import TYPE_CHECKING, NoReturn

from grudge_stream.exceptions import ConfigError
from grudge_stream.hashing import siphash24

if TYPE_CHECKING:
    from grudge_stream.settings import Settings

log = logging.getLogger("grudge_stream.hashkey")

KEY_BYTES = 16
_HEX = re.compile(r"(?:0x)?([0-9a-fA-F]{32})")
_FINGERPRINT_LABEL = b"grudge-stream hash key fingerprint v1"
PUBLIC = "public"  # the fingerprint recorded for the insecure public key


class HashKey:
    """A secret 128-bit SipHash key. Its ``repr`` shows only the fingerprint."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            raise ConfigError("a hash key is exactly 16 bytes")
        self._key = key

    @classmethod
    def parse(cls, text: str, what: str = "seed") -> "HashKey":
        """A key from hex or base64 text (see the module docstring)."""
        s = text.strip()
        if not s:
            raise ConfigError(f"{what} is empty")
        m = _HEX.fullmatch(s)
        if m:
            return cls(bytes.fromhex(m.group(1)))
        material = None
        if re.fullmatch(r"[0-9a-fA-F]+", s) and len(s) < 32:
            # Hex digits only: a hex key that is too short, not base64 that happens to look so.
            raise ConfigError(f"{what} must be 32 hex digits (128 bits), not {len(s)}; make one with "
                              "`python -c 'import secrets; print(secrets.token_hex(16))'`")
        if re.fullmatch(r"[0-9a-fA-F]+", s) and len(s) % 2 == 0 and len(s) > 32:
            material = bytes.fromhex(s)
        else:
            padded = s.replace("-", "+").replace("_", "/") + "=" * (-len(s) % 4)
            try:
                material = base64.b64decode(padded.encode("ascii"), validate=True)
            except (binascii.Error, ValueError, UnicodeEncodeError):
                material = None
        if material is None:
            raise ConfigError(
                f"{what} must be a 128-bit key as 32 hex digits or base64 (make one with "
                "`python -c 'import secrets; print(secrets.token_hex(16))'`)"
            )
        if len(material) < KEY_BYTES:
            raise ConfigError(
                f"{what} holds {len(material) * 8} bits; a hash key needs 128 (32 hex digits or "
                "base64 of 16 bytes)"
            )
        if len(material) == KEY_BYTES:
            return cls(material)
        return cls(hashlib.sha256(b"grudge-stream hash key\x00" + material).digest()[:KEY_BYTES])

    @property
    def material(self) -> bytes:
        """The 16 key bytes, for ``sketch.use_hash_key``; never log them."""
        return self._key

    @property
    def words(self) -> tuple[int, int]:
        """``(k0, k1)``: the key as SipHash's two little-endian words."""
        return int.from_bytes(self._key[:8], "little"), int.from_bytes(self._key[8:], "little")

    @property
    def fingerprint(self) -> str:
        """SipHash of a fixed label under this key, as 16 hex digits: identifies the key
        without revealing it."""
        return f"{siphash24(_FINGERPRINT_LABEL, *self.words):016x}"

    def __repr__(self) -> str:
        return f"HashKey(fingerprint={self.fingerprint})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashKey) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __reduce__(self) -> NoReturn:
        raise TypeError("a HashKey is never pickled")


def hash_key_from_settings(settings: Settings, topology: str) -> HashKey | None:
    """The topology's secret key from ``seed`` / ``seed_file``; ``None`` only when the
    operator opted into the public key with ``insecure_public_seed=true`` (warned about).
    Raises ConfigError, naming the settings, when no key is given."""
    from grudge_stream.sections import Identity, as_section

    identity = as_section(Identity, settings)  # a Settings, or its Identity section
    text, path, insecure = identity.seed, identity.seed_file, identity.insecure_public_seed
    if text is not None and path is not None:
        raise ConfigError("set either seed or seed_file, not both")
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ConfigError(f"seed_file {path!r} cannot be read: {exc.strerror}") from None
        return HashKey.parse(text, f"the key in seed_file {path!r}")
    if text is not None:
        return HashKey.parse(text)
    if insecure:
        log.warning(
            "%s hashes public keys under the PUBLIC key (insecure_public_seed=true): anyone can "
            "compute keys that frame an innocent or hide an abuser. Set seed or seed_file for any "
            "real deployment.", topology)
        return None
    raise ConfigError(
        f"{topology} hashes keys chosen by the public and needs a secret hash key: set GRUDGE_SEED "
        "(32 hex digits, e.g. from `python -c 'import secrets; print(secrets.token_hex(16))'`) or "
        "GRUDGE_SEED_FILE (a file holding it); insecure_public_seed=true runs with a public key"
    )


def key_fingerprint(key: HashKey | None) -> str:
    return PUBLIC if key is None else key.fingerprint
