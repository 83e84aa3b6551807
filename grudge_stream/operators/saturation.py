"""How full a running sketch is, and the error that fill implies (docs/accuracy.md).

Each function reads one sketch at event time ``now_ms`` and returns a
``Saturation``: named measures (exported per partition as
``grudge_sketch_saturation{operator,partition,sketch,measure}``) and, when the
sketch has passed its target, one sentence saying so (logged as a warning).
A score sketch's and a token bucket's are counted by its kernel in one pass over the
cells in place (``ScoreSketch.saturation_counts``, a few ms at default sizes); the others
copy the cells (a few MB): call them every few seconds, not per batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A ScoreSketch level's cell is "in use" when it holds at least this share of raise_at.
IN_USE_SHARE = 0.01
# False raises: the chance that a key with no history of its own reads >= raise_at.
FALSE_RAISE_TARGET = 1e-6
# Count-min: the additive error bound epsilon * N should stay below this share of raise_at.
COUNTMIN_ERROR_SHARE = 0.5
# Bloom: fp_rate_estimate above target * this, or a window below this share of the
# documented one, warns (at exactly capacity the window dips a few ms below it).
BLOOM_FP_SLACK = 1.5
BLOOM_WINDOW_SHARE = 0.98


@dataclass
class Saturation:
    sketch: str
    measures: dict[str, float] = field(default_factory=dict)
    warning: str | None = None


def _cells_and_age(sketch: Any, now_ms: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(levels, cells) scores of a ScoreSketch and each cell's age in ms at now_ms (0 for
    a cell never written, or without now_ms)."""
    cells = sketch._cells()
    s = np.asarray(cells["score"], dtype=np.float64)
    if now_ms is None:
        return s, np.zeros_like(s)
    last = cells["last_ms"]
    age = np.maximum(0, now_ms - last).astype(np.float64)
    age[last == np.iinfo(np.int64).min] = 0.0
    return s, age


def _decayed_scores(sketch: Any, now_ms: int | None, lam_per_ms: float) -> np.ndarray:
    """Scores decayed to now_ms (exponential decay only)."""
    s, age = _cells_and_age(sketch, now_ms)
    return s * np.exp(-lam_per_ms * age) if lam_per_ms else s


def _level_counts(sketch: Any, now_ms: int | None, lam_per_ms: float, hot_at: float,
                  in_use_at: float) -> tuple[np.ndarray, np.ndarray]:
    """Per level, the cells whose decayed score is >= ``hot_at`` and >= ``in_use_at``: the
    kernel's one pass over the cells in place (``ScoreSketch.saturation_counts``, about 1 ms
    for 400,000 cells), or the copy and arrays of ``_decayed_scores`` for a sketch without it."""
    counts = getattr(sketch, "saturation_counts", None)
    if counts is not None:
        return counts(now_ms, float(lam_per_ms or 0.0), hot_at, in_use_at)  # type: ignore[no-any-return]
    s = _decayed_scores(sketch, now_ms, lam_per_ms)
    return (s >= hot_at).sum(axis=1), (s >= in_use_at).sum(axis=1)


def _bucket_counts(sketch: Any, now_ms: int | None, rate_per_s: float,
                   full_above: float) -> tuple[np.ndarray, np.ndarray]:
    """Per level, the token-bucket cells whose debt refilled to ``now_ms`` (``max(0, debt -
    rate_per_s * age / 1000)``) is above ``full_above``, and above 0: the kernel's one pass
    in place (``ScoreSketch.saturation_counts`` with ``refill_per_s``), or the copied arrays."""
    counts = getattr(sketch, "saturation_counts", None)
    if counts is not None:
        return counts(now_ms, 0.0, full_above, 0.0, max(0.0, float(rate_per_s)), True)  # type: ignore[no-any-return]
    debt, age = _cells_and_age(sketch, now_ms)
    if rate_per_s > 0:
        debt = np.maximum(0.0, debt - rate_per_s * age / 1000.0)
    return (debt > full_above).sum(axis=1), (debt > 0.0).sum(axis=1)


def score_saturation(sketch: Any, now_ms: int | None, *, raise_at: float, lam_per_ms: float,
                     name: str = "scores") -> list[Saturation]:
    """A ScoreSketch or SplitScoreSketch: cells in use, hot cells, implied false raises.

    ``false_raise_probability`` is the product over levels of the share of cells at or
    above ``raise_at``: the chance that a key with no score of its own has all its cells
    hot (docs/score-sketch.md, "Sizing", with the hot share measured instead of assumed).
    ``hot_keys_estimate`` inverts ``p = 1 - (1 - 1/M)^H`` for H.
    """
    split = hasattr(sketch, "pos")
    pun = sketch.pos if split else sketch
    hot_counts, use_counts = _level_counts(pun, now_ms, lam_per_ms, raise_at, IN_USE_SHARE * raise_at)
    levels, m = len(hot_counts), pun.config.cells_per_level
    hot = hot_counts / m
    p_false = float(np.prod(hot))
    mean_hot = float(hot.mean())
    hot_keys = -m * math.log1p(-mean_hot) if mean_hot < 1.0 else float("inf")
    measures = {
        "cells_in_use_ratio": float(use_counts.sum() / (levels * m)),
        "hot_cells_ratio": mean_hot,
        "hot_keys_estimate": hot_keys,
        "false_raise_probability": p_false,
    }
    if split:
        _, f_use = _level_counts(sketch.neg, now_ms, lam_per_ms, IN_USE_SHARE * raise_at, IN_USE_SHARE * raise_at)
        measures["forgiveness_cells_in_use_ratio"] = float(f_use.sum() / (levels * m))
    warning = None
    if p_false > FALSE_RAISE_TARGET:
        warning = (f"score sketch saturated: {100 * mean_hot:.2f}% of cells are at or above raise_at "
                   f"(about {hot_keys:,.0f} hot keys per {levels} x {m} cells), so a key with no "
                   f"history of its own is raised with probability {p_false:.1e} (target "
                   f"{FALSE_RAISE_TARGET:.0e}); raise cells_per_level or levels (docs/accuracy.md)")
    return [Saturation(name, measures, warning)]


def bucket_saturation(sketch: Any, now_ms: int | None, *, rate_per_s: float, burst: float,
                      name: str = "buckets") -> list[Saturation]:
    """A token-bucket ScoreSketch (debt per cell, linear refill): cells in debt and the
    chance that a key with no requests of its own is refused a request of cost 1."""
    full_counts, use_counts = _bucket_counts(sketch, now_ms, rate_per_s, burst - 1.0)
    levels, m = len(full_counts), sketch.config.cells_per_level
    full = full_counts / m
    p_false = float(np.prod(full))
    measures = {"cells_in_use_ratio": float(use_counts.sum() / (levels * m)), "full_cells_ratio": float(full.mean()),
                "false_limit_probability": p_false}
    warning = None
    if p_false > FALSE_RAISE_TARGET:
        warning = (f"token-bucket sketch saturated: {100 * full.mean():.2f}% of cells hold a full bucket's "
                   f"debt, so a key with no requests of its own is refused with probability {p_false:.1e} "
                   f"(target {FALSE_RAISE_TARGET:.0e}); raise cells_per_level or levels (docs/accuracy.md)")
    return [Saturation(name, measures, warning)]


def countmin_saturation(sketch: Any, *, raise_at: float, name: str = "counts") -> list[Saturation]:
    """A DecayingCountMin: the decayed stream weight N and the error bound epsilon * N."""
    if sketch.epoch is None:
        return [Saturation(name, {"total_weight": 0.0, "error_bound": 0.0, "error_share_of_raise_at": 0.0})]
    rows = sketch._decayed_cells().sum(axis=1)
    n = float(rows.max())
    bound = float(sketch.error_bound(n))
    share = bound / raise_at if raise_at > 0 else 0.0
    warning = None
    if share > COUNTMIN_ERROR_SHARE:
        warning = (f"count-min sketch saturated: decayed weight {n:,.0f} gives an error bound of "
                   f"{bound:,.1f} = {share:.2f} x raise_at (target {COUNTMIN_ERROR_SHARE}); raise width "
                   f"(docs/accuracy.md)")
    return [Saturation(name, {"total_weight": n, "error_bound": bound, "error_share_of_raise_at": share},
                       warning)]


def bloom_saturation(bloom: Any, now_ms: int | None, *, name: str = "bloom") -> list[Saturation]:
    """A ForgettingBloom: newest generation's fill, fp estimate, generation age, window."""
    cfg = bloom.config
    newest_fill = bloom.newest_fill  # inserts / capacity (above 1 only under raise_fp)
    fp = float(bloom.fp_rate_estimate())
    measures = {
        "fill_ratio": float(newest_fill),
        "fp_rate_estimate": fp,
        "fp_rate_target": float(cfg.fp_rate),
        "rotations": float(bloom.rotations),
    }
    starts = bloom.generation_starts_ms  # oldest first
    if starts and now_ms is not None and starts[-1] is not None:
        measures["generation_age_seconds"] = max(0, now_ms - starts[-1]) / 1000.0
    documented = None
    window = bloom.effective_window_ms
    if cfg.period_ms and window is not None:
        documented = (cfg.generations - 1) * cfg.period_ms
        measures["effective_window_seconds"] = float(window) / 1000.0
        measures["documented_window_seconds"] = documented / 1000.0
    measures["overloads"] = float(bloom.overloads)
    warning = None
    if fp > cfg.fp_rate * BLOOM_FP_SLACK:
        warning = (f"Bloom filter over capacity: false-positive rate estimate {fp:.2e} exceeds the "
                   f"target {cfg.fp_rate:.0e}; raise capacity (docs/accuracy.md)")
    elif documented is not None and window is not None and window < BLOOM_WINDOW_SHARE * documented:
        warning = (f"Bloom filter over capacity: keys are remembered for {window / 1000:,.0f} s of event "
                   f"time, not the documented {documented / 1000:,.0f} s; raise capacity "
                   f"(docs/accuracy.md)")
    return [Saturation(name, measures, warning)]
