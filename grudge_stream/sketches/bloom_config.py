"""ForgettingBloom configuration: the frozen config object and sizing helpers.

Pure Python: it never imports the compiled kernel (the kernel imports it). The
public module is :mod:`grudge_stream.sketches.bloom`, which re-exports all of this
with the compiled class.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, NamedTuple

from grudge_stream.exceptions import ConfigError
from grudge_stream.sketches._validate import (
    DEFAULT_INDEX_SCHEME,
    U64_MAX,
    ConfigOf,
    as_int,
    check_hasher,
    check_index_scheme,
    in_range,
    scheme_dict,
)

__all__ = [
    "BloomConfig",
    "BloomSizing",
    "MAX_GENERATIONS",
    "MAX_HASHES",
    "OVERLOAD_MODES",
    "bloom_sizing",
]

#: Generations share one bit array, a group of 2/4/.../64 bits per position.
MAX_GENERATIONS = 64
#: k above 64 would mean fp_rate below ~1e-19 per generation.
MAX_HASHES = 64
#: Positions are indexed by ((h1 + i*h2) mod 2**32) mod m, so m < 2**32.
MAX_POSITIONS = 0xFFFFFFFF
_LN2 = math.log(2.0)
#: What a generation that reaches ``capacity`` inserts before its period ends does:
#: ``shrink_window`` rotates early (the memory window shrinks, the fp rate holds);
#: ``raise_fp`` keeps filling it (the window holds, the fp rate rises).
OVERLOAD_MODES = ("shrink_window", "raise_fp")


class BloomSizing(NamedTuple):
    """How a (capacity, fp_rate, generations) triple is laid out.

    ``generation_fp_rate`` is the false-positive target of one full generation,
    ``1 - (1 - fp_rate) ** (1 / generations)``, so that a ``contains`` over all
    generations, each holding ``capacity`` keys, stays within ``fp_rate``.
    ``positions`` (m) is the bit positions per generation, ``hashes`` (k) the
    indexes per key, ``group_bits`` the bits per position (generations rounded
    up to a power of two), and ``memory_bytes`` the size of the bit array. Like every
    sizing helper's answer, ``kwargs()`` gives the constructor arguments."""

    generation_fp_rate: float
    positions: int
    hashes: int
    group_bits: int
    words: int
    memory_bytes: int
    capacity: int = 0
    fp_rate: float = 0.0
    generations: int = 2

    def kwargs(self) -> dict[str, Any]:
        """The sized filter as ForgettingBloom constructor arguments."""
        return {"capacity": self.capacity, "fp_rate": self.fp_rate, "generations": self.generations}


def bloom_sizing(capacity: int, fp_rate: float, generations: int = 2) -> BloomSizing:
    """Size a ForgettingBloom: ``m = ceil(-n ln f / ln(2)**2)`` positions per generation
    (rounded up to fill the last 64-bit word) and ``k = round(m / n * ln 2)`` indexes,
    with f the per-generation target above. ``bloom_sizing(1_000_000, 0.01)`` gives
    k = 8 and 2.75 MB."""
    n = in_range(capacity, "capacity", 1, MAX_POSITIONS)
    g = in_range(generations, "generations", 2, MAX_GENERATIONS)
    if isinstance(fp_rate, bool) or not isinstance(fp_rate, (int, float)):
        raise ConfigError(f"fp_rate must be a float in (0, 1), got {fp_rate!r}")
    p = float(fp_rate)
    if not (math.isfinite(p) and 0.0 < p < 1.0):
        raise ConfigError(f"fp_rate must be in (0, 1), got {fp_rate!r}")
    f = -math.expm1(math.log1p(-p) / g)
    m = math.ceil(-n * math.log(f) / (_LN2 * _LN2))
    group_bits = 2
    while group_bits < g:
        group_bits *= 2
    per_word = 64 // group_bits
    m = -(-m // per_word) * per_word
    if m > MAX_POSITIONS:
        raise ConfigError(
            f"capacity={n} at fp_rate={p} needs {m} positions per generation; the index "
            f"space is 2**32 - 1. Use a higher fp_rate or split the key space."
        )
    k = max(1, round(m / n * _LN2))
    if k > MAX_HASHES:
        raise ConfigError(
            f"fp_rate={p} needs {k} hashes per key; at most {MAX_HASHES} are supported"
        )
    words = m // per_word
    return BloomSizing(f, m, k, group_bits, words, 8 * words, n, p, g)


@dataclass(frozen=True)
class BloomConfig(ConfigOf):
    """The full, validated configuration of a :class:`ForgettingBloom`.

    ``overload`` (one of :data:`OVERLOAD_MODES`) chooses what gives way when more
    than ``capacity`` new keys arrive within a generation: the window
    (``shrink_window``, the default) or the false-positive rate (``raise_fp``)."""

    built: ClassVar[str] = "ForgettingBloom"

    capacity: int
    fp_rate: float
    generations: int = 2
    period_ms: int | None = None
    seed: int = 0
    hasher: str = "murmur3"
    overload: str = "shrink_window"
    index_scheme: str = DEFAULT_INDEX_SCHEME

    def __post_init__(self) -> None:
        check_index_scheme(self.index_scheme)
        sizing = bloom_sizing(self.capacity, self.fp_rate, self.generations)
        period = (
            None
            if self.period_ms is None
            else in_range(self.period_ms, "period_ms", 1, (1 << 63) - 1)
        )
        object.__setattr__(self, "capacity", as_int(self.capacity, "capacity"))
        object.__setattr__(self, "fp_rate", float(self.fp_rate))
        object.__setattr__(self, "generations", as_int(self.generations, "generations"))
        object.__setattr__(self, "period_ms", period)
        object.__setattr__(self, "seed", in_range(self.seed, "seed", 0, U64_MAX))
        object.__setattr__(self, "hasher", check_hasher(self.hasher))
        if not isinstance(self.overload, str) or self.overload not in OVERLOAD_MODES:
            raise ConfigError(
                f"overload must be one of {', '.join(OVERLOAD_MODES)}, got {self.overload!r}"
            )
        object.__setattr__(self, "_sizing", sizing)

    @property
    def sizing(self) -> BloomSizing:
        return self._sizing  # type: ignore[attr-defined, no-any-return]

    def to_dict(self) -> dict[str, Any]:
        """The serialized form (a KM config without ``index_scheme``, as 0.2 wrote it)."""
        return scheme_dict(asdict(self))
