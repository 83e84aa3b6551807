"""DecayingCountMin configuration: the frozen config object and sizing helpers.

Pure Python: it never imports the compiled kernel (the kernel imports it). The
public module is :mod:`grudge_stream.sketches.countmin`, which re-exports all of this
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
    "CountMinConfig",
    "CountMinParameters",
    "MAX_CELLS",
    "MAX_DEPTH",
    "MAX_TOP_K",
    "CountMinSizing",
    "countmin_dimensions",
    "countmin_memory_bytes",
    "countmin_sizing",
]

#: Rows are limited so the per-event index buffer of the kernel stays on the stack.
MAX_DEPTH = 32
#: depth * width is limited to 2**32 cells (16 GiB): a guard against typos, not a design limit.
MAX_CELLS = 1 << 32
#: The candidate set of top(k) is a binary heap scanned in full by top(); keep it small.
MAX_TOP_K = 1 << 20
#: counter_bits is at most 27 so that the stamp field (32 - counter_bits bits) counts
#: more epochs (2**stamp_bits) than a counter takes to decay to 0 (counter_bits);
#: the lazy re-basing sweep relies on it (docs/count-min.md, "Epoch stamps").
MIN_COUNTER_BITS, MAX_COUNTER_BITS = 4, 27


class CountMinParameters(NamedTuple):
    """``(epsilon, delta)``: with probability at least ``1 - delta`` an estimate
    exceeds the true (decayed) count by at most ``epsilon * N`` (N = total weight)."""

    epsilon: float
    delta: float


@dataclass(frozen=True)
class CountMinConfig(ConfigOf):
    """The full, validated configuration of a :class:`DecayingCountMin`."""

    built: ClassVar[str] = "DecayingCountMin"

    depth: int = 4
    width: int = 65_536
    epoch_ms: int | None = 1_000
    counter_bits: int = 24
    seed: int = 0
    hasher: str = "murmur3"
    top_k: int = 0
    index_scheme: str = DEFAULT_INDEX_SCHEME

    def __post_init__(self) -> None:
        check_index_scheme(self.index_scheme)
        depth = in_range(self.depth, "depth", 1, MAX_DEPTH)
        width = in_range(self.width, "width", 1, 0xFFFFFFFF)
        if depth * width > MAX_CELLS:
            raise ConfigError(
                f"depth * width must be at most {MAX_CELLS} cells, got {depth * width}"
            )
        epoch_ms = (
            None if self.epoch_ms is None else in_range(self.epoch_ms, "epoch_ms", 1, (1 << 63) - 1)
        )
        counter_bits = in_range(
            self.counter_bits, "counter_bits", MIN_COUNTER_BITS, MAX_COUNTER_BITS
        )
        seed = in_range(self.seed, "seed", 0, U64_MAX)
        hasher = check_hasher(self.hasher)
        top_k = in_range(self.top_k, "top_k", 0, MAX_TOP_K)
        for name, value in (
            ("depth", depth),
            ("width", width),
            ("epoch_ms", epoch_ms),
            ("counter_bits", counter_bits),
            ("seed", seed),
            ("hasher", hasher),
            ("top_k", top_k),
        ):
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """The serialized form (a KM config without ``index_scheme``, as 0.2 wrote it)."""
        return scheme_dict(asdict(self))

    @property
    def parameters(self) -> CountMinParameters:
        return CountMinParameters(math.e / self.width, math.exp(-self.depth))


def countmin_dimensions(epsilon: float, delta: float) -> tuple[int, int]:
    """The smallest ``(depth, width)`` with ``e/width <= epsilon`` and ``e**-depth <= delta``.

    ``countmin_dimensions(4.2e-5, 0.02) == (4, 64_721)``; the default 4 x 65536
    gives epsilon = 4.15e-5 and delta = 1.8 %.
    """
    for name, v in (("epsilon", epsilon), ("delta", delta)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v < 1):
            raise ConfigError(f"{name} must be in (0, 1), got {v!r}")
    width = math.ceil(math.e / epsilon)
    depth = max(1, math.ceil(math.log(1.0 / delta)))
    if depth > MAX_DEPTH or width > 0xFFFFFFFF:
        raise ConfigError(
            f"(epsilon={epsilon}, delta={delta}) needs depth {depth} x width {width}, too large"
        )
    return depth, width


class CountMinSizing(NamedTuple):
    """A DecayingCountMin shape for an error target (the shape every sizing helper
    returns: the constructor arguments, the memory, and what the shape guarantees):
    an estimate exceeds the true count by more than ``epsilon`` times the total
    count with probability at most ``delta`` (the achieved values, at most the asked)."""

    depth: int
    width: int
    memory_bytes: int
    epsilon: float
    delta: float

    def kwargs(self) -> dict[str, Any]:
        """The shape as DecayingCountMin constructor arguments."""
        return {"depth": self.depth, "width": self.width}


def countmin_sizing(epsilon: float, delta: float, top_k: int = 0) -> CountMinSizing:
    """:func:`countmin_dimensions` with the memory (``top_k`` candidates included) and
    the achieved bounds. ``countmin_sizing(4.2e-5, 0.02).kwargs()`` is
    ``{"depth": 4, "width": 64721}``."""
    depth, width = countmin_dimensions(epsilon, delta)
    return CountMinSizing(depth, width, countmin_memory_bytes(depth, width, top_k),
                          math.e / width, math.exp(-depth))


def countmin_memory_bytes(depth: int = 4, width: int = 65_536, top_k: int = 0) -> int:
    """Fixed memory of a sketch: ``4 * depth * width`` bytes of cells plus the top-k
    candidate set (32 bytes per candidate slot and a 12-byte hash table entry, the
    table size being the next power of two >= 2 * top_k; the key objects themselves
    are the caller's and are counted separately)."""
    depth = as_int(depth, "depth")
    width = as_int(width, "width")
    top_k = as_int(top_k, "top_k")
    return 4 * depth * width + _topk_bytes(top_k)


def _topk_bytes(top_k: int) -> int:
    if top_k == 0:
        return 0
    table = 8
    while table < 2 * top_k:
        table <<= 1
    return 32 * top_k + 12 * table
