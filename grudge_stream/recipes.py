"""Recipes built on the sketches. ``TokenBucket``: per-key rate limiting in fixed memory.

The bucket is a :class:`~grudge_stream.sketches.score.ScoreSketch` holding each
key's *debt*: ``Linear(rate_per_s)`` decay refills it, ``lo=0`` is a full
bucket (so a fresh key starts full), and a request of ``cost`` is admitted iff
``debt + cost <= burst`` — one atomic ``try_update``. See docs/recipes.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from grudge_stream.exceptions import ConfigError, InvalidInputError
from grudge_stream.sketches.score import Linear, ScoreSketch

__all__ = ["Decision", "TokenBucket"]


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


class TokenBucket:
    """Per-key token buckets for unbounded key spaces, in fixed memory.

    Parameters:
        rate_per_s: refill rate in cost units per second (> 0).
        burst: bucket capacity (> 0): the most a fresh key can spend at once.
        reject_penalty: debt added by each *refused* request (default 0). With a
            penalty, a client that keeps hammering while refused waits longer.
        max_debt: cap on the debt (>= burst). Defaults to ``burst`` without a
            penalty and to unbounded (``+inf``) with one.
        levels, cells_per_level, hasher, seed, clock: the underlying sketch's
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
        reject_penalty: float = 0.0,
        max_debt: Optional[float] = None,
        levels: int = 4,
        cells_per_level: int = 100_000,
        hasher: str = "siphash",
        seed: Optional[int] = None,
        clock: Any = None,
    ) -> None:
        self.rate_per_s = _positive(rate_per_s, "rate_per_s")
        self.burst = _positive(burst, "burst")
        self.reject_penalty = _positive(reject_penalty, "reject_penalty", allow_zero=True)
        if max_debt is None:
            hi = self.burst if self.reject_penalty == 0.0 else math.inf
        else:
            hi = _positive(max_debt, "max_debt", allow_inf=True)
            if hi < self.burst:
                raise ConfigError(f"max_debt must be >= burst ({self.burst!r}), got {max_debt!r}")
        self.max_debt = hi
        self._sketch = ScoreSketch(
            levels=levels,
            cells_per_level=cells_per_level,
            decay=Linear(self.rate_per_s),
            lo=0.0,
            hi=hi,
            aggregator="min",
            hasher=hasher,
            seed=seed,
            clock=clock,
        )

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
