"""Golden vectors for the hashing kernel: SipHash-2-4 reference outputs, splitmix64,
CRC-32C, the Kirsch–Mitzenmacher vector of the sketch spec (grudge compatibility) and the
vectors of the independent-levels scheme (docs/hashing.md)."""
from __future__ import annotations

import random

import pytest

from grudge_stream.hashing import crc32c, hash64, level_indexes, siphash24, siphash_key, splitmix64

GOLDEN = 0x9E3779B97F4A7C15

# SipHash-2-4 reference outputs: key 00..0f, message 00..(n-1), n = 0..63.
SIPHASH24_VECTORS = [
    0x726FDB47DD0E0E31, 0x74F839C593DC67FD, 0x0D6C8009D9A94F5A, 0x85676696D7FB7E2D,
    0xCF2794E0277187B7, 0x18765564CD99A68D, 0xCBC9466E58FEE3CE, 0xAB0200F58B01D137,
    0x93F5F5799A932462, 0x9E0082DF0BA9E4B0, 0x7A5DBBC594DDB9F3, 0xF4B32F46226BADA7,
    0x751E8FBC860EE5FB, 0x14EA5627C0843D90, 0xF723CA908E7AF2EE, 0xA129CA6149BE45E5,
    0x3F2ACC7F57C29BDB, 0x699AE9F52CBE4794, 0x4BC1B3F0968DD39C, 0xBB6DC91DA77961BD,
    0xBED65CF21AA2EE98, 0xD0F2CBB02E3B67C7, 0x93536795E3A33E88, 0xA80C038CCD5CCEC8,
    0xB8AD50C6F649AF94, 0xBCE192DE8A85B8EA, 0x17D835B85BBB15F3, 0x2F2E6163076BCFAD,
    0xDE4DAAACA71DC9A5, 0xA6A2506687956571, 0xAD87A3535C49EF28, 0x32D892FAD841C342,
    0x7127512F72F27CCE, 0xA7F32346F95978E3, 0x12E0B01ABB051238, 0x15E034D40FA197AE,
    0x314DFFBE0815A3B4, 0x027990F029623981, 0xCADCD4E59EF40C4D, 0x9ABFD8766A33735C,
    0x0E3EA96B5304A7D0, 0xAD0C42D6FC585992, 0x187306C89BC215A9, 0xD4A60ABCF3792B95,
    0xF935451DE4F21DF2, 0xA9538F0419755787, 0xDB9ACDDFF56CA510, 0xD06C98CD5C0975EB,
    0xE612A3CB9ECBA951, 0xC766E62CFCADAF96, 0xEE64435A9752FE72, 0xA192D576B245165A,
    0x0A8787BF8ECB74B2, 0x81B3E73D20B49B6F, 0x7FA8220BA3B2ECEA, 0x245731C13CA42499,
    0xB78DBFAF3A8D83BD, 0xEA1AD565322A1A0B, 0x60E61C23A3795013, 0x6606D7E446282B93,
    0x6CA4ECB15C5F91E1, 0x9F626DA15C9625F3, 0xE51B38608EF25F57, 0x958A324CEB064572,
]
REF_K0 = 0x0706050403020100
REF_K1 = 0x0F0E0D0C0B0A0908


@pytest.mark.parametrize("n", range(64))
def test_siphash24_reference_vectors(n: int) -> None:
    assert siphash24(bytes(range(n)), REF_K0, REF_K1) == SIPHASH24_VECTORS[n]


def test_siphash24_zero_key_vectors() -> None:
    assert siphash24(b"", 0, 0) == 0x1E924B9D737700D7
    assert siphash24(b"Hello world", 0, 0) == 0xC9E8A3021F3822D9
    assert siphash24(b"12345678123", 0, 0) == 0x0F95D77CCDB0649F
    assert siphash24(bytes(8), 0, 0) == 0xE849E8BB6FFE2567
    assert siphash24(bytes(1535), 0, 0) == 0xE74D1C0AB64B2AFA


def test_splitmix64_reference_sequence() -> None:
    # The first outputs of splitmix64 seeded with 0.
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_siphash_sketch_key_is_first_two_splitmix_outputs() -> None:
    for seed in (0, 1, 42, 2**64 - 1):
        k0, k1 = siphash_key(seed)
        assert k0 == splitmix64(seed)
        assert k1 == splitmix64((seed + 0x9E3779B97F4A7C15) % 2**64)
        assert hash64(b"abc", seed, "siphash") == siphash24(b"abc", k0, k1)


def test_spec_level_index_vector() -> None:
    """The Kirsch–Mitzenmacher vector of the spec and of grudge: an explicit setting."""
    h = hash64(b"client-42", 0x2A)
    assert level_indexes(h, 4, 100_000, "km") == [19472, 64389, 9306, 86927]


# (key, murmur3 seed, levels, M) -> the independent scheme's indexes (the default).
INDEPENDENT_VECTORS = [
    (b"client-42", 0x2A, 4, 100_000, [70352, 10727, 84211, 9090]),
    (b"client-42", 0x2A, 5, 65_536, [46106, 7030, 55188, 5957, 9987]),
    (b"", 0, 3, 97, [0, 0, 37]),  # murmur3 of b"" under seed 0 is 0
    (b"client-467236", 0, 4, 100_000, [45804, 22665, 53814, 8424]),
]


def _independent(h: int, levels: int, m: int) -> list[int]:
    out = []
    for i in range(levels):
        j = i // 2
        p = ((h + j * GOLDEN) % 2**64) * 0xBF58476D1CE4E5B9
        word = h if j == 0 else (p % 2**64) ^ (p >> 64)
        out.append((((word >> (32 * (i % 2))) & 0xFFFFFFFF) * m) >> 32)
    return out


@pytest.mark.parametrize("key,seed,levels,m,want", INDEPENDENT_VECTORS)
def test_independent_level_index_vectors(key, seed, levels, m, want) -> None:
    h = hash64(key, seed)
    got = level_indexes(h, levels, m)
    assert got == level_indexes(h, levels, m, "independent") == _independent(h, levels, m)
    assert got == want


def test_crc32c_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    # Incremental use equals one-shot.
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283


def test_crc32c_instruction_equals_the_tables() -> None:
    """Where the CPU's CRC-32C instruction is used, it gives the portable tables' value for
    every length and alignment, whole or continued; the RFC 3720 vectors hold for both."""
    from grudge_stream._cyext._hashing import crc32c_implementation, crc32c_portable

    assert crc32c_implementation() in ("sse4.2", "portable")
    assert crc32c_portable(b"123456789") == 0xE3069283
    assert crc32c_portable(bytes(32)) == crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c_portable(b"\xff" * 32) == crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    rng = random.Random(7)
    data = rng.randbytes(5000)
    view = memoryview(data)
    for start in range(9):
        for n in (0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 255, 1000, 4000):
            part = view[start:start + n]
            assert crc32c(part) == crc32c_portable(part), (start, n)
            cut = n // 3
            assert crc32c(part[cut:], crc32c(part[:cut])) == crc32c_portable(part), (start, n)
