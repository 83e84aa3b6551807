"""Feedback scores: outcomes raise or forgive a key's decaying score; alerts on crossings.

The FAIR / grudge model: each event carries an outcome (``bad`` → +0.04,
``good`` → -0.001, ...) or a numeric delta; a ``ScoreSketch`` keeps every
key's score in fixed memory, decaying on its own; an ``AlertLatch`` raises a
key at ``raise_at`` and clears it at ``clear_at``.

Late events (event time below the watermark) are applied at the watermark;
with exponential decay their delta is first weighted by
``exp(-lambda * lateness)``, which makes the result independent of arrival
order up to float rounding.

With ``score_mode="split"`` (the default of the ``abuse_scores`` topology) the
sketch is a ``SplitScoreSketch``: punishment and forgiveness are kept in two
sketches fed only non-negative amounts, so colliding keys' ``good`` outcomes
cannot pull an abuser's score down (docs/score-sketch.md, "Split-sign scores").

Raised keys that stop sending events are cleared by a sweep that re-reads
them whenever the watermark crosses a multiple of ``sweep_interval_ms``.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
# np.isin's first call imports numpy.ma (7-25 ms): here, at start-up, not inside the batch
# that holds the first key to raise.
import numpy.ma  # noqa: F401

from grudge_stream.exceptions import ConfigError
from grudge_stream.operators.alerts import LATCH_CAPACITY, AlertLatch
from grudge_stream.operators.codec import Event, EventCodec
from grudge_stream.operators.columns import Run
from grudge_stream.operators.describe import score_detail, split_score_detail
from grudge_stream.operators.records import OutputRecord, ScoreUpdate, Source, SourceRecord, output_id
from grudge_stream.record_checks import MAX_TIMESTAMP_MS
from grudge_stream.operators.saturation import score_saturation
from grudge_stream.operators.sketchconf import (
    build_score_sketch,
    config_identity,
    decay_lambda_per_ms,
    score_sketch_config,
)
from grudge_stream.operators.stateful import SketchAlertOperator
from grudge_stream.sketches.score_config import Exponential, Linear, ScoreSketchConfig

EMIT_MODES = ("none", "crossings", "every")
_NO_OUTPUTS: list[OutputRecord] = []  # shared, never appended to
SCORE_MODES = ("single", "split")


class FeedbackScoreOperator(SketchAlertOperator):
    kind = "feedback_scores"
    state_keys = ("sketch",)

    def __init__(self, *, operator_id: str, source_topic: str, partition: int,
                 sketch: ScoreSketchConfig | Mapping,
                 codec: EventCodec | None = None, raise_at: float, clear_at: float,
                 latch_capacity: int = LATCH_CAPACITY, sweep_interval_ms: int = 10_000,
                 emit_scores: str = "crossings", score_mode: str = "single", **common: Any) -> None:
        codec = codec or EventCodec(outcomes={"bad": 0.04, "good": -0.001}, value_field="outcome")
        super().__init__(operator_id=operator_id, source_topic=source_topic, partition=partition,
                         codec=codec, **common)
        if emit_scores not in EMIT_MODES:
            raise ConfigError(f"emit_scores must be one of {EMIT_MODES}, not {emit_scores!r}")
        if score_mode not in SCORE_MODES:
            raise ConfigError(f"score_mode must be one of {SCORE_MODES}, not {score_mode!r}")
        self.score_mode = score_mode
        if score_mode == "split":
            # The mode shapes the state; "single" stays out of it so its snapshots keep restoring.
            self.state_keys = ("sketch", "score_mode")
        # Typed once, here; its fingerprint form as given (operators/sketchconf.py).
        self.sketch_config = score_sketch_config(sketch)
        self._sketch_identity = config_identity(sketch, self.sketch_config)
        self.sketch = self._keyed(build_score_sketch(self.sketch_config, split=score_mode == "split"))
        self.latch = AlertLatch(raise_at, clear_at, latch_capacity)
        self.sweep_interval_ms = int(sweep_interval_ms)
        self.every("sweep", self.sweep_interval_ms)
        self.emit_scores = emit_scores
        self._override_hashes: tuple[tuple[int, int], np.ndarray] | None = None
        self._lam_per_ms = self.late_decay_per_ms = decay_lambda_per_ms(self.sketch_config)
        self.counters.update(alerts_raised=0, alerts_cleared=0)

    def time_scale_ms(self) -> float | None:
        conf = self.sketch_config
        decay = conf.decay
        if isinstance(decay, Exponential) and decay.lambda_per_s > 0:
            return 1000.0 / decay.lambda_per_s
        if isinstance(decay, Linear) and decay.rate_per_s > 0:
            span = conf.hi - conf.lo
            return 1000.0 * span / decay.rate_per_s if span != float("inf") else None
        return None

    def config_dict(self) -> dict:
        return {
            "sketch": self._sketch_identity,
            "raise_at": self.latch.raise_at,
            "clear_at": self.latch.clear_at,
            "latch_capacity": self.latch.capacity,
            "sweep_interval_ms": self.sweep_interval_ms,
            "emit_scores": self.emit_scores,
            **({"score_mode": self.score_mode} if self.score_mode != "single" else {}),
        }

    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        delta = ev.value
        if late_ms and self._lam_per_ms:
            delta *= math.exp(-self._lam_per_ms * late_ms)
        score = self.result = self.sketch.update_and_query(ev.key, delta, now_ms=now_ms)
        state, override = self._judge(ev.key, score, now_ms)
        if state is not None:
            self._alert(ev.key, state, score, now_ms, rec, out, override)
        if self.emit_scores == "every" or (self.emit_scores == "crossings" and state is not None):
            out.append(OutputRecord("scores", ev.key, _score_record(
                self.operator_id, ev.key, score, now_ms, rec, state)))

    def update_in_order(self, key: bytes, delta: float, offset: int, ts: int) -> list[OutputRecord] | None:
        """``apply_event`` for the common event of a per-event caller (embedded state's
        ``update``), in fewer steps: a key of a valid length, a finite float delta, an event
        time at or past the watermark and inside the future bound, no timer due, a new
        offset. Identical to ``apply_event`` for it (``result`` is the new score); None for
        any other event, which ``apply_event`` then takes."""
        if not key or (self.codec.max_key_bytes and len(key) > self.codec.max_key_bytes):
            return None
        wm, nxt = self.watermark, self.next_offset
        if (wm is None or ts < wm or delta - delta != 0.0 or ts > MAX_TIMESTAMP_MS
                or (nxt is not None and offset < nxt) or self.emit_scores == "every"):
            return None  # the first event, a late one, not finite, too far, already applied
        for due in self.timers.values():
            if due is None or ts >= due:
                return None
        limit = self._future_ok
        if limit is None or ts > limit:
            # The future bound only grows with the wall clock: one read of it covers every
            # event up to it, and the ones past it ask again (or take apply_event).
            bound = self._limits(None)[0]
            limit = self._future_ok = MAX_TIMESTAMP_MS if bound is None else bound
            if ts > limit:
                return None
        self.next_offset = offset + 1
        self.watermark = ts
        self.counters["events"] += 1
        score = self.result = self.sketch.update_and_query(key, delta, now_ms=ts)
        state, override = self._judge(key, score, ts)
        if state is None:
            return _NO_OUTPUTS
        out: list[OutputRecord] = []
        rec = SourceRecord(self.source_topic, self.partition, offset, ts, key, None)
        self._alert(key, state, score, ts, rec, out, override)
        if self.emit_scores == "crossings":
            out.append(OutputRecord("scores", key, _score_record(self.operator_id, key, score, ts, rec, state)))
        return out

    _future_ok: int | None = None

    # -- the column path ---------------------------------------------------------------------

    def apply_columns(self, run: Run, a: int, b: int) -> None:
        """One segment of the column pipeline: the sketch is updated by one nogil batch call,
        and only events that can change an alert latch (a score at ``raise_at`` or above,
        a key already raised, an overridden key) are looked at in Python. Identical to
        ``apply`` per event, which scores emitted for every event still take."""
        if run.weighted is None or self.emit_scores == "every":
            return super().apply_columns(run, a, b)
        keys = run.keys
        hashes = self.sketch.key_hashes(run.keys_of(a, b))
        now = run.now
        scores = self.sketch.update_and_query_many(hashes, run.weighted[a:b], now_ms=now[a:b])
        latch = self.latch
        high = scores >= latch.raise_at
        hot = hashes[high]
        # Keys already raised can clear, and overridden keys are judged whatever their score.
        if len(latch):
            hot = np.concatenate((hot, self.sketch.key_hashes(list(latch.keys()))))
        table = self.overrides
        if table is not None and len(table):
            # Hashed once per version of the table, not per segment (a long allow list).
            stamp = (id(table), table.version)
            if self._override_hashes is None or self._override_hashes[0] != stamp:
                self._override_hashes = (stamp, self.sketch.key_hashes([k for k, _ in table.items()]))
            hot = np.concatenate((hot, self._override_hashes[1]))
        cand = np.flatnonzero(high | np.isin(hashes, hot)) if len(hot) else np.flatnonzero(high)
        for j in cand.tolist():
            e = a + j
            key = keys[e]
            score = float(scores[j])
            t = int(now[e])
            state, override = self._judge(key, score, t)
            if state is None:
                continue
            rec = run.record(e)
            out: list[OutputRecord] = []
            self._alert(key, state, score, t, rec, out, override)
            if self.emit_scores == "crossings":
                out.append(OutputRecord("scores", key, _score_record(self.operator_id, key, score, t, rec, state)))
            run.emit(rec.offset, out)

    def on_timer(self, name: str, now_ms: int, rec: SourceRecord, out: list[OutputRecord]) -> None:
        self._sweep(now_ms, rec, out)

    def _sweep(self, now_ms: int, rec: SourceRecord, out: list[OutputRecord]) -> None:
        sketch = self.sketch
        self._sweep_latch(lambda k: sketch.query(k, now_ms=now_ms), now_ms, rec, out)

    def saturation(self) -> list:
        return score_saturation(self.sketch, self.watermark, raise_at=self.latch.raise_at,
                                lam_per_ms=self._lam_per_ms)

    def describe_key(self, key: bytes, debug: bool = False) -> dict:
        """The key's current state, read-only (a live score query, grudge_stream.serving).

        The score at the watermark, as ``query_detailed`` would read it but without writing
        the decay back (grudge_stream.operators.describe): a query never changes the state
        a replay of the same records computes. The score, raised state, thresholds and
        override only; ``debug`` adds ``detail``, the per-level reads and cell indexes
        (split mode: both halves), which reveal the key's cells (docs/serving.md)."""
        wm = self.watermark
        read = split_score_detail if self.score_mode == "split" else score_detail
        detail = read(self.sketch, key, wm, debug)
        out = {"kind": self.kind, "score": detail.pop("score"),
               "raised": key in self.latch, "raise_at": self.latch.raise_at, "clear_at": self.latch.clear_at}
        if debug:
            out["detail"] = detail
        table = self.overrides
        if table is not None and len(table) and wm is not None:
            out["override"] = table.action(key, wm)
        return out



def _score_record(operator_id: str, key: bytes, score: float, now_ms: int, rec: SourceRecord,
                  state: str | None) -> bytes:
    """A ``scores`` record; its ``id`` (docs/runtime.md, "Output ids") is the same in every
    replay of the record, so a consumer drops the copies a restart re-emits."""
    return ScoreUpdate(output_id(operator_id, rec.partition, rec.offset, "score", key), operator_id, key,
                       score, now_ms, Source.of(rec), state).to_bytes()
