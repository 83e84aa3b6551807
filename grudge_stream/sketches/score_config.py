"""ScoreSketch and Rotator configuration: decays, frozen configs, seeds, sizing.

Pure Python: it never imports the compiled kernels (they import it). The public
module is :mod:`grudge_stream.sketches.score`, which re-exports all of this with
the compiled classes.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple, Optional

from grudge_stream.exceptions import ConfigError
from grudge_stream.sketches._validate import (
    DEFAULT_INDEX_SCHEME,
    INDEX_SCHEMES,
    ConfigOf,
    check_index_scheme,
    scheme_dict,
    scheme_of_dict,
)

# The kernel's codes and limits (cyext/_score.pyx defines the same; a test checks they agree).
DECAY_NONE = 0
DECAY_EXPONENTIAL = 1
DECAY_LINEAR = 2
MAX_LEVELS = 64
MAX_GENERATIONS = 16

__all__ = [
    "DEFAULT_DECAY",
    "Decay",
    "Exponential",
    "Linear",
    "NoDecay",
    "RotatorConfig",
    "ScoreSketchConfig",
    "ScoreSizing",
    "score_sizing",
    "suggest_levels",
    "MAX_LEVELS",
    "MAX_GENERATIONS",
    "INDEX_SCHEMES",
]

AGGREGATORS = ("min", "max", "mean")
HASHERS = ("murmur3", "siphash")
_U64 = 1 << 64
_MAX_CELLS_PER_LEVEL = (1 << 32) - 1  # indexes are 32-bit in both schemes


def _real(value: Any, what: str) -> float:
    """A real number as float; bool, str and other types are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{what} must be a real number, not {type(value).__name__}")
    return float(value)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be an int, not bool")
    try:
        return int(value.__index__())
    except (AttributeError, TypeError):
        raise ConfigError(f"{what} must be an int, not {type(value).__name__}") from None


def _rate(value: Any, what: str) -> float:
    v = _real(value, what)
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{what} must be finite and >= 0, got {v!r}")
    return v


# ---- decays ---------------------------------------------------------------------


class Decay:
    """Base of the three decays. ``apply(score, dt_ms)`` runs the kernel's own code."""

    kind: str = ""
    _code: int = DECAY_NONE

    @property
    def _param(self) -> float:
        return 0.0

    def apply(self, score: float, dt_ms: int) -> float:
        """The score ``dt_ms`` milliseconds later (``dt_ms <= 0`` leaves it unchanged).

        This is the exact float computation the sketch does for one cell.
        """
        from grudge_stream._cyext._score import decay_apply  # the kernel's own step, at call time

        return decay_apply(self._code, self._param, float(score), int(dt_ms))

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError  # pragma: no cover


@dataclass(frozen=True)
class Exponential(Decay):
    """Exponential decay: ``s * exp(-lambda_per_s * (dt_ms / 1000.0))``.

    Half-life is ``ln 2 / lambda_per_s`` seconds; ``Exponential.from_half_life(s)``
    builds one from it. ``lambda_per_s`` must be finite and ``>= 0``.
    """

    lambda_per_s: float
    kind = "exponential"
    _code = DECAY_EXPONENTIAL

    def __post_init__(self) -> None:
        object.__setattr__(self, "lambda_per_s", _rate(self.lambda_per_s, "lambda_per_s"))

    @property
    def _param(self) -> float:
        return self.lambda_per_s

    @classmethod
    def from_half_life(cls, seconds: float) -> "Exponential":
        s = _real(seconds, "half-life")
        if not (s > 0 and math.isfinite(s)):
            raise ConfigError(f"half-life must be finite and > 0 seconds, got {s!r}")
        return cls(math.log(2.0) / s)

    @property
    def half_life_s(self) -> float:
        return math.inf if self.lambda_per_s == 0 else math.log(2.0) / self.lambda_per_s

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "lambda_per_s": self.lambda_per_s}


@dataclass(frozen=True)
class Linear(Decay):
    """Linear decay toward 0 at ``rate_per_s`` per second; never crosses 0.

    Positive scores become ``max(0, s - (rate_per_s * dt_ms) / 1000.0)``,
    negative ones rise the same way. This is a token bucket's refill.
    """

    rate_per_s: float
    kind = "linear"
    _code = DECAY_LINEAR

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_per_s", _rate(self.rate_per_s, "rate_per_s"))

    @property
    def _param(self) -> float:
        return self.rate_per_s

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rate_per_s": self.rate_per_s}


@dataclass(frozen=True)
class NoDecay(Decay):
    """No decay: scores only change by updates (and clamping)."""

    kind = "none"
    _code = DECAY_NONE

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


#: The decay of a ScoreSketchConfig that names none (half-life about 69 s).
DEFAULT_DECAY = Exponential(0.01)


def decay_from_dict(d: Any) -> Decay:
    """A decay from its dict form (``Decay.to_dict``); strict: a wrong kind, a missing
    or an unknown field is a ConfigError. The one decay parser of the package."""
    if not isinstance(d, dict):
        raise ConfigError("decay must be an object")
    kind = d.get("kind")
    fields: dict[str, tuple[set[str], Callable[[], Decay]]] = {
        "exponential": ({"kind", "lambda_per_s"}, lambda: Exponential(d["lambda_per_s"])),
        "linear": ({"kind", "rate_per_s"}, lambda: Linear(d["rate_per_s"])),
        "none": ({"kind"}, NoDecay),
    }
    if kind not in fields:
        raise ConfigError(f"unknown decay kind {kind!r}")
    keys, build = fields[kind]
    if set(d) != keys:
        raise ConfigError(f"decay {kind!r} takes fields {sorted(keys)}, got {sorted(d)}")
    return build()


# ---- configs ------------------------------------------------------------------


def resolve_seed(seed: Optional[int]) -> int:
    """``None`` means seed 0: no randomness without a seed, as for every grudge-stream sketch.

    Deployments whose keys an attacker chooses pass a secret seed (with ``hasher="siphash"``).
    """
    if seed is None:
        return 0
    s = _int(seed, "seed")
    if not 0 <= s < _U64:
        raise ConfigError(f"seed must be in [0, 2**64), got {s}")
    return s


@dataclass(frozen=True)
class ScoreSketchConfig(ConfigOf):
    """The full, validated identity of a ScoreSketch (what ``sketch.config`` returns).

    Two sketches can be merged, and a snapshot restored into the same identity,
    only when their configs (seed included) are equal.
    """

    built: ClassVar[str] = "ScoreSketch"

    levels: int
    cells_per_level: int
    decay: Decay = DEFAULT_DECAY
    lo: float = 0.0
    hi: float = math.inf
    aggregator: str = "min"
    hasher: str = "murmur3"
    seed: int = 0
    index_scheme: str = DEFAULT_INDEX_SCHEME

    def __post_init__(self) -> None:
        check_index_scheme(self.index_scheme)
        levels = _int(self.levels, "levels")
        if not 1 <= levels <= MAX_LEVELS:
            raise ConfigError(f"levels must be in [1, {MAX_LEVELS}], got {levels}")
        m = _int(self.cells_per_level, "cells_per_level")
        if not 1 <= m <= _MAX_CELLS_PER_LEVEL:
            raise ConfigError(f"cells_per_level must be in [1, 2**32 - 1], got {m}")
        if not isinstance(self.decay, (Exponential, Linear, NoDecay)):
            raise ConfigError(
                "decay must be Exponential(lambda_per_s), Linear(rate_per_s) or NoDecay(), "
                f"not {self.decay!r}"
            )
        lo = _real(self.lo, "lo")
        hi = _real(self.hi, "hi")
        if math.isnan(lo) or math.isnan(hi):
            raise ConfigError("lo and hi must not be NaN")
        if not lo < hi:
            raise ConfigError(f"need lo < hi, got lo={lo!r}, hi={hi!r}")
        if not lo <= 0.0 <= hi:
            raise ConfigError(
                f"need lo <= 0 <= hi (scores decay toward 0), got lo={lo!r}, hi={hi!r}"
            )
        if (math.isinf(lo) or math.isinf(hi)) and isinstance(self.decay, NoDecay):
            raise ConfigError(
                "an infinite bound (lo=-inf or hi=+inf) needs a decay other than NoDecay; "
                "give NoDecay finite bounds"
            )
        if self.aggregator not in AGGREGATORS:
            raise ConfigError(f"aggregator must be one of {AGGREGATORS}, got {self.aggregator!r}")
        if self.hasher not in HASHERS:
            raise ConfigError(f"hasher must be one of {HASHERS}, got {self.hasher!r}")
        seed = _int(self.seed, "seed")
        if not 0 <= seed < _U64:
            raise ConfigError(f"seed must be in [0, 2**64), got {seed}")
        for name, value in (
            ("levels", levels),
            ("cells_per_level", m),
            ("lo", lo),
            ("hi", hi),
            ("seed", seed),
        ):
            object.__setattr__(self, name, value)

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        if "decay" in d:  # its dict form (decay_from_dict)
            d["decay"] = decay_from_dict(d["decay"])
        return d

    def memory_bytes_of_cells(self) -> int:
        """Bytes of the cell table: ``16 * levels * cells_per_level``."""
        return 16 * self.levels * self.cells_per_level

    def to_dict(self) -> dict[str, Any]:
        return {
            "levels": self.levels,
            "cells_per_level": self.cells_per_level,
            "decay": self.decay.to_dict(),
            "lo": self.lo,
            "hi": self.hi,
            "aggregator": self.aggregator,
            "hasher": self.hasher,
            "seed": self.seed,
            **scheme_dict({"index_scheme": self.index_scheme}),
        }

    @classmethod
    def from_dict(cls, d: Any) -> "ScoreSketchConfig":
        """The config of a ``to_dict`` (a snapshot's): without ``index_scheme`` it is a
        KM config (every config grudge-stream 0.2 wrote)."""
        if not isinstance(d, dict):
            raise ConfigError("config must be an object")
        scheme = scheme_of_dict(d)
        d = {k: v for k, v in d.items() if k != "index_scheme"}
        expected = {
            "levels",
            "cells_per_level",
            "decay",
            "lo",
            "hi",
            "aggregator",
            "hasher",
            "seed",
        }
        if set(d) != expected:
            raise ConfigError(f"config fields must be {sorted(expected)}, got {sorted(d)}")
        return cls(
            levels=d["levels"],
            cells_per_level=d["cells_per_level"],
            decay=decay_from_dict(d["decay"]),
            lo=d["lo"],
            hi=d["hi"],
            aggregator=d["aggregator"],
            hasher=d["hasher"],
            seed=d["seed"],
            index_scheme=scheme,
        )


@dataclass(frozen=True)
class RotatorConfig:
    """The identity of a Rotator: generations, period and the generations' sketch config."""

    generations: int
    period_ms: Optional[int]
    sketch: ScoreSketchConfig

    def __post_init__(self) -> None:
        g = _int(self.generations, "generations")
        if not 2 <= g <= MAX_GENERATIONS:
            raise ConfigError(f"generations must be in [2, {MAX_GENERATIONS}], got {g}")
        p = self.period_ms
        if p is not None:
            p = _int(p, "period_ms")
            if not 1 <= p < (1 << 63):
                raise ConfigError(f"period_ms must be >= 1 (or None for manual rotation), got {p}")
        if not isinstance(self.sketch, ScoreSketchConfig):
            raise ConfigError("sketch must be a ScoreSketchConfig")
        object.__setattr__(self, "generations", g)
        object.__setattr__(self, "period_ms", p)

    @property
    def seed(self) -> int:
        return self.sketch.seed

    def to_dict(self) -> dict[str, Any]:
        return {
            "generations": self.generations,
            "period_ms": self.period_ms,
            "sketch": self.sketch.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Any) -> "RotatorConfig":
        if not isinstance(d, dict) or set(d) != {"generations", "period_ms", "sketch"}:
            raise ConfigError("rotator config fields must be generations, period_ms, sketch")
        return cls(
            generations=d["generations"],
            period_ms=d["period_ms"],
            sketch=ScoreSketchConfig.from_dict(d["sketch"]),
        )


# ---- sizing ---------------------------------------------------------------------


class ScoreSizing(NamedTuple):
    """A ScoreSketch shape for a collision target (the shape every sizing helper returns:
    the constructor arguments, the memory, and what the shape guarantees).

    ``collision_p`` is the chance an innocent key's ``levels`` cells are all shared
    with one of ``hot_keys`` keys (what ``min`` then reads: a hot key's score)."""

    levels: int
    cells_per_level: int
    memory_bytes: int
    collision_p: float

    def kwargs(self) -> dict[str, Any]:
        """The shape as ScoreSketch / Rotator constructor arguments."""
        return {"levels": self.levels, "cells_per_level": self.cells_per_level}


def score_sizing(hot_keys: int, cells_per_level: int, target_p: float) -> ScoreSizing:
    """The fewest levels of ``cells_per_level`` cells reaching ``target_p`` (see
    :func:`suggest_levels`), with the memory (16 bytes a cell) and the collision
    chance it achieves. ``score_sizing(1000, 100_000, 1e-8).kwargs()`` is
    ``{"levels": 4, "cells_per_level": 100000}`` (6.4 MB)."""
    levels = suggest_levels(hot_keys, cells_per_level, target_p)
    p = -math.expm1(int(hot_keys) * math.log1p(-1.0 / int(cells_per_level)))
    return ScoreSizing(levels, int(cells_per_level), 16 * levels * int(cells_per_level), p ** levels)


def suggest_levels(hot_keys: int, cells_per_level: int, target_p: float) -> int:
    """The smallest ``L >= 1`` with ``(1 - (1 - 1/M)**H) ** L <= target_p``.

    ``H`` = ``hot_keys`` (keys with a large score at the same time), ``M`` =
    ``cells_per_level``; ``p = 1 - (1 - 1/M)**H`` is the chance one level's cell
    of an innocent key is shared with a hot key, computed stably as
    ``-expm1(H * log1p(-1/M))``, so ``p**L`` is the chance all ``L`` are, i.e.
    the chance the key reads a hot key's score (``min`` aggregator).

    Raises ``ValueError`` (``ConfigError``) for ``H < 1``, ``M < 2``,
    ``target_p`` outside ``(0, 1)``, and when no ``L`` can reach the target
    (``p`` rounds to 1). The result is pure arithmetic: a ScoreSketch accepts
    at most ``MAX_LEVELS`` levels.

    >>> suggest_levels(100, 1000, 1e-4), suggest_levels(1000, 100000, 1e-8)
    (4, 4)
    """
    h = _int(hot_keys, "hot_keys")
    m = _int(cells_per_level, "cells_per_level")
    t = _real(target_p, "target_p")
    if h < 1:
        raise ConfigError(f"hot_keys must be >= 1, got {h}")
    if m < 2:
        raise ConfigError(f"cells_per_level must be >= 2, got {m}")
    if not 0.0 < t < 1.0:
        raise ConfigError(f"target_p must be in (0, 1), got {t!r}")
    p = -math.expm1(h * math.log1p(-1.0 / m))
    if not p < 1.0:
        raise ConfigError(
            f"no number of levels reaches target_p={t!r}: with {h} hot keys over {m} cells per "
            "level every cell is shared (p rounds to 1); raise cells_per_level"
        )
    if p <= t:
        return 1
    level = max(1, math.ceil(math.log(t) / math.log(p)))
    # The closed form can be one off from rounding; settle it on the predicate itself.
    while level > 1 and p ** (level - 1) <= t:
        level -= 1
    while not p**level <= t:
        level += 1
    return level
