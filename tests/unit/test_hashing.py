"""Differential and edge tests of the hashing kernel against mmh3 and a Python reference."""
from __future__ import annotations

import importlib.machinery
import random

import mmh3
import numpy as np
import pytest

import grudge_stream._cyext._hashing as kernel
from grudge_stream.hashing import hash64, hash64_many, level_indexes, murmur3_64


def test_kernels_are_compiled_extensions_from_the_installed_package() -> None:
    path = kernel.__file__
    assert any(path.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES), path
    assert "site-packages" in path, f"tests must run against the installed package, got {path}"


def test_murmur3_matches_mmh3_on_random_keys_and_seeds() -> None:
    rnd = random.Random(20261129)
    for _ in range(5000):
        key = rnd.randbytes(rnd.randint(0, 300))
        seed = rnd.getrandbits(64)
        assert hash64(key, seed) == mmh3.hash64(key, seed & 0xFFFFFFFF, signed=False)[0]


@pytest.mark.parametrize("length", range(0, 40))
def test_murmur3_every_tail_length(length: int) -> None:
    key = bytes((i * 37 + 11) & 0xFF for i in range(length))
    for seed in (0, 1, 0xFFFFFFFF, 0x1_0000_0001):
        assert murmur3_64(key, seed & 0xFFFFFFFF) == mmh3.hash64(key, seed & 0xFFFFFFFF, signed=False)[0]


def test_str_keys_hash_as_utf8() -> None:
    for algo in ("murmur3", "siphash"):
        assert hash64("grüße-☃", 9, algo) == hash64("grüße-☃".encode(), 9, algo)
        assert hash64(bytearray(b"abc"), 9, algo) == hash64(b"abc", 9, algo)


def test_batch_equals_single_for_lists_tuples_iterables_and_buffers() -> None:
    rnd = random.Random(7)
    keys = [rnd.randbytes(rnd.randint(0, 64)) for _ in range(2000)]
    for algo in ("murmur3", "siphash"):
        expected = np.array([hash64(k, 123, algo) for k in keys], dtype=np.uint64)
        assert np.array_equal(hash64_many(keys, 123, algo), expected)
        assert np.array_equal(hash64_many(tuple(keys), 123, algo), expected)
        assert np.array_equal(hash64_many(iter(keys), 123, algo), expected)
        fixed = np.frombuffer(rnd.randbytes(16 * 300), dtype=np.uint8).reshape(300, 16)
        assert np.array_equal(
            hash64_many(fixed, 5, algo),
            np.array([hash64(bytes(r), 5, algo) for r in fixed], dtype=np.uint64),
        )
    assert hash64_many([], 1).dtype == np.uint64
    assert len(hash64_many([], 1)) == 0


def test_level_indexes_km_follow_kirsch_mitzenmacher() -> None:
    rnd = random.Random(3)
    for _ in range(2000):
        h = rnd.getrandbits(64)
        levels = rnd.randint(1, 12)
        m = rnd.randint(1, 2**32 - 1)
        h1, h2 = h & 0xFFFFFFFF, h >> 32
        assert level_indexes(h, levels, m, "km") == [((h1 + i * h2) % 2**32) % m for i in range(levels)]


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown hash algorithm"):
        hash64(b"x", 0, "md5")
    with pytest.raises(TypeError, match="bytes or str"):
        hash64(12, 0)
    with pytest.raises(TypeError):
        hash64_many([b"a", 3], 0)
    with pytest.raises(TypeError):
        hash64_many(b"abc", 0)
    with pytest.raises(OverflowError):
        hash64(b"x", -1)
    with pytest.raises(ValueError):
        level_indexes(1, 0, 10)
    with pytest.raises(ValueError):
        level_indexes(1, 2, 0)


def test_oversized_and_empty_keys_are_legal() -> None:
    big = bytes(1 << 20)
    assert hash64(big, 1) == mmh3.hash64(big, 1, signed=False)[0]
    assert hash64(b"", 1, "siphash") == hash64("", 1, "siphash")
