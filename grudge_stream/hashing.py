"""Hashing shared by every sketch: one 64-bit hash per key, then Kirsch–Mitzenmacher.

- ``murmur3``: first word of MurmurHash3_x64_128, both seed words ``seed & 0xFFFFFFFF``
  (equal to ``mmh3.hash64(key, seed & 0xFFFFFFFF, signed=False)[0]``).
- ``siphash``: SipHash-2-4 keyed with the first two splitmix64 outputs from ``seed``.
  Use it wherever an attacker chooses the keys.

See docs/hashing.md.
"""
from __future__ import annotations

from grudge_stream._cyext._hashing import (
    ALGORITHMS,
    crc32c,
    hash64,
    hash64_many,
    level_indexes,
    murmur3_64,
    siphash24,
    siphash_key,
    splitmix64,
)

__all__ = [
    "ALGORITHMS",
    "crc32c",
    "hash64",
    "hash64_many",
    "level_indexes",
    "murmur3_64",
    "siphash24",
    "siphash_key",
    "splitmix64",
]
