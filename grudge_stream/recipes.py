"""Recipes built on the sketches. ``TokenBucket``: per-key rate limiting in fixed memory.

The bucket is a :class:`~grudge_stream.sketches.score.ScoreSketch` holding each
key's *debt*: ``Linear(rate_per_s)`` decay refills it, ``lo=0`` is a full
bucket (so a fresh key starts full), and a request of ``cost`` is admitted iff
``debt + cost <= burst`` — one atomic ``try_update``. See docs/recipes.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Mapping, Optional

from grudge_stream.exceptions import ConfigError, InvalidInputError
from grudge_stream.sketches.score import Linear, ScoreSketch
from grudge_stream.sketches._validate import DEFAULT_INDEX_SCHEME, ConfigOf, scheme_dict
from grudge_stream.sketches.score_config import ScoreSketchConfig, resolve_seed

__all__ = ["Decision", "TokenBucket", "TokenBucketConfig"]


@dataclass(frozen=True)
class Decision:
    """The outcome of :meth:`TokenBucket.allow`.

    ``allowed``: whether the request was admitted (the object is truthy iff so).
    ``retry_after_ms``: 0 when admitted; otherwise the smallest whole number of
    milliseconds after which the same request would be admitted if nothing
    else hits the key, or ``None`` when it never can (``cost > burst``).
    ``debt``: the key's debt after this decision.
    """

    allowed: bool
    retry_after_ms: Optional[int]
    debt: float

    def __bool__(self) -> bool:
        return self.allowed


def _positive(value: Any, what: str, *, allow_zero: bool = False, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number, not {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf) or v < 0 or (v == 0 and not allow_zero):
        raise ConfigError(
            f"{what} must be {'>= 0' if allow_zero else '> 0'} and finite, got {value!r}"
        )
    return v


@dataclass(frozen=True)
class TokenBucketConfig(ConfigOf):
    """The validated configuration of a :class:`TokenBucket` (each default lives here).

    ``rate_per_s`` (> 0) refills, ``burst`` (> 0) is the capacity, ``reject_penalty``
    (>= 0) is the debt a refused request adds, ``max_debt`` (>= burst; None: ``burst``
    without a penalty, unbounded with one) caps the debt; ``levels``, ``cells_per_level``,
    ``hasher`` and ``seed`` shape the ScoreSketch (``sketch_config``) that holds the debts.
    """

    built: ClassVar[str] = "TokenBucket"

    rate_per_s: float
    burst: float
    reject_penalty: float = 0.0
    max_debt: Optional[float] = None
    levels: int = 4
    cells_per_level: int = 100_000
    hasher: str = "siphash"
    seed: int = 0
    index_scheme: str = DEFAULT_INDEX_SCHEME

    def __post_init__(self) -> None:
        rate = _positive(self.rate_per_s, "rate_per_s")
        burst = _positive(self.burst, "burst")
        penalty = _positive(self.reject_penalty, "reject_penalty", allow_zero=True)
        max_debt = self.max_debt
        if max_debt is not None:
            max_debt = _positive(max_debt, "max_debt", allow_inf=True)
            if max_debt < burst:
                raise ConfigError(f"max_debt must be >= burst ({burst!r}), got {self.max_debt!r}")
        for name, value in (("rate_per_s", rate), ("burst", burst), ("reject_penalty", penalty),
                            ("max_debt", max_debt), ("seed", resolve_seed(self.seed))):
            object.__setattr__(self, name, value)
        self.sketch_config  # the sketch's shape is checked here too

    @property
    def debt_cap(self) -> float:
        """The sketch's ``hi``: ``max_debt``, or its default."""
        if self.max_debt is not None:
            return self.max_debt
        return self.burst if self.reject_penalty == 0.0 else math.inf

    @property
    def sketch_config(self) -> ScoreSketchConfig:
        """The ScoreSketch of the debts: Linear refill, ``lo=0`` (a fresh key's bucket is full)."""
        return ScoreSketchConfig(levels=self.levels, cells_per_level=self.cells_per_level,
                                 decay=Linear(self.rate_per_s), lo=0.0, hi=self.debt_cap,
                                 aggregator="min", hasher=self.hasher, seed=self.seed,
                                 index_scheme=self.index_scheme)

    def to_dict(self) -> dict[str, Any]:
        """The dict form (a KM config without ``index_scheme``, as 0.2 wrote it)."""
        return scheme_dict(asdict(self))


class TokenBucket:
    """Per-key token buckets for unbounded key spaces, in fixed memory.

    Parameters:
        rate_per_s: refill rate in cost units per second (> 0).
        burst: bucket capacity (> 0): the most a fresh key can spend at once.
        reject_penalty: debt added by each *refused* request (default 0). With a
            penalty, a client that keeps hammering while refused waits longer.
        max_debt: cap on the debt (>= burst). Defaults to ``burst`` without a
            penalty and to unbounded (``+inf``) with one.
        levels, cells_per_level, hasher, seed, index_scheme, clock: the underlying sketch's
            (``siphash`` by default: rate-limit keys usually come from clients).

    Every decision is strict: a request is admitted iff ``debt + cost <= burst``
    after the refill, so a key never spends more than ``burst + rate * t`` over
    any span ``t`` — under any thread interleaving, since the decision and the
    debit are one atomic ``try_update``. Keys that share all their cells with
    heavier keys may be refused early (the ``min`` aggregator never
    underestimates a debt), never admitted late.
    """

    def __init__(
        self,
        *,
        rate_per_s: float,
        burst: float,
        reject_penalty: float = TokenBucketConfig.reject_penalty,
        max_debt: Optional[float] = TokenBucketConfig.max_debt,
        levels: int = TokenBucketConfig.levels,
        cells_per_level: int = TokenBucketConfig.cells_per_level,
        hasher: str = TokenBucketConfig.hasher,
        seed: Optional[int] = None,
        index_scheme: str = TokenBucketConfig.index_scheme,
        clock: Any = None,
    ) -> None:
        config = TokenBucketConfig(rate_per_s=rate_per_s, burst=burst, reject_penalty=reject_penalty,
                                   max_debt=max_debt, levels=levels, cells_per_level=cells_per_level,
                                   hasher=hasher, seed=resolve_seed(seed), index_scheme=index_scheme)
        self.rate_per_s = config.rate_per_s
        self.burst = config.burst
        self.reject_penalty = config.reject_penalty
        self.max_debt = config.debt_cap
        self._sketch = ScoreSketch(**config.sketch_config.kwargs(), clock=clock)

    @classmethod
    def from_config(cls, config: "TokenBucketConfig | Mapping[str, Any]", clock: Any = None) -> "TokenBucket":
        """A bucket from its config object (or a dict of its fields)."""
        return cls(**TokenBucketConfig.of(config).kwargs(), clock=clock)

    @classmethod
    def from_sketch(
        cls, sketch: ScoreSketch, *, burst: float, reject_penalty: float = 0.0
    ) -> "TokenBucket":
        """Wrap a restored sketch (``ScoreSketch.from_bytes(bucket.sketch.to_bytes())``)."""
        cfg = sketch.config
        if not isinstance(cfg.decay, Linear) or cfg.lo != 0.0 or cfg.aggregator != "min":
            raise ConfigError(
                "a token bucket's sketch needs Linear decay, lo=0 and the min aggregator"
            )
        self = cls.__new__(cls)
        self.rate_per_s = cfg.decay.rate_per_s
        if self.rate_per_s <= 0:
            raise ConfigError("a token bucket's sketch needs a positive refill rate")
        self.burst = _positive(burst, "burst")
        self.reject_penalty = _positive(reject_penalty, "reject_penalty", allow_zero=True)
        if cfg.hi < self.burst:
            raise ConfigError(f"the sketch's hi ({cfg.hi!r}) is below burst ({self.burst!r})")
        self.max_debt = cfg.hi
        self._sketch = sketch
        return self

    @property
    def sketch(self) -> ScoreSketch:
        """The underlying ScoreSketch (snapshot it with ``to_bytes()``)."""
        return self._sketch

    def allow(self, key: Any, cost: float = 1.0, now_ms: Optional[int] = None) -> Decision:
        """Spend ``cost`` tokens of ``key``'s bucket at ``now_ms`` if it holds them."""
        if (
            isinstance(cost, bool)
            or not isinstance(cost, (int, float))
            or not math.isfinite(cost)
            or cost < 0
        ):
            raise InvalidInputError(f"cost must be a finite number >= 0, got {cost!r}")
        allowed, retry, debt = self._sketch._bucket_allow(
            key, float(cost), self.burst, self.reject_penalty, now_ms
        )
        return Decision(bool(allowed), None if retry < 0 else int(retry), debt)

    def debt(self, key: Any, now_ms: Optional[int] = None) -> float:
        """The key's debt now (0.0 = full bucket)."""
        return self._sketch.query(key, now_ms)

    def tokens(self, key: Any, now_ms: Optional[int] = None) -> float:
        """Tokens available now: ``max(0, burst - debt)``."""
        return max(0.0, self.burst - self.debt(key, now_ms))

    def memory_bytes(self) -> int:
        return self._sketch.memory_bytes()

    def __repr__(self) -> str:
        return (
            f"TokenBucket(rate_per_s={self.rate_per_s!r}, burst={self.burst!r}, "
            f"reject_penalty={self.reject_penalty!r}, max_debt={self.max_debt!r})"
        )
