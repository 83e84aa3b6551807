"""Hashing shared by every sketch: one 64-bit hash per key, then one cell index per
level (row, Bloom position) derived from it by the sketch's ``index_scheme``:
``independent`` (each level from its own 32 bits of the hash or a remix of it; the default) or
``km`` (Kirsch–Mitzenmacher, grudge-stream 0.2's and grudge's): ``level_indexes``.

- ``murmur3``: first word of MurmurHash3_x64_128, both seed words ``seed & 0xFFFFFFFF``
  (equal to ``mmh3.hash64(key, seed & 0xFFFFFFFF, signed=False)[0]``).
- ``siphash``: SipHash-2-4 keyed with the first two splitmix64 outputs from ``seed``.
  Use it wherever an attacker chooses the keys.

See docs/hashing.md.
"""
from __future__ import annotations

from grudge_stream._cyext._hashing import (
    ALGORITHMS,
    INDEX_SCHEMES,
    crc32c,
    hash64,
    hash64_many,
    level_indexes,
    level_indexes_many,
    murmur3_64,
    siphash24,
    siphash_key,
    splitmix64,
)

__all__ = [
    "ALGORITHMS",
    "INDEX_SCHEMES",
    "crc32c",
    "hash64",
    "hash64_many",
    "level_indexes",
    "level_indexes_many",
    "murmur3_64",
    "siphash24",
    "siphash_key",
    "splitmix64",
]
