"""Heavy hitters: decayed per-key rates in a DecayingCountMin, alerts and top-k reports.

Each event adds its weight (default 1) to its key's epoch-decayed count. A key
is raised when its estimate reaches ``raise_at`` and cleared at ``clear_at``
(estimates are count-min upper bounds: a raise can be a false positive
bounded by ``error_bound``, a heavy key is never missed). Every
``report_interval_ms`` of event time the operator emits a ``reports`` record
with the top-k at the interval's end (``interval_start_ms``/``interval_end_ms``,
``k``, the partition and the source's partition count, keyed by the interval
start): what ``heavy_global`` merges into one global top-k per interval
(docs/runtime.md, "Global top-k"). Raised keys that go quiet are cleared by a
sweep at each report.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from grudge_stream.exceptions import ConfigError
from grudge_stream.operators.alerts import LATCH_CAPACITY, AlertLatch
from grudge_stream.operators.codec import BadRecord, Event, EventCodec
from grudge_stream.operators.records import OutputRecord, Source, SourceRecord, TopKEntry, TopKReport, output_id
from grudge_stream.operators.saturation import countmin_saturation
from grudge_stream.operators.sketchconf import build_countmin, config_identity, countmin_config
from grudge_stream.operators.stateful import SketchAlertOperator
from grudge_stream.sketches.countmin_config import CountMinConfig

# A watermark jump over more report intervals than this reports only the latest ones: the
# global stage has closed the older intervals by grace long before (docs/runtime.md).
MAX_CATCHUP_REPORTS = 100


class HeavyHitterOperator(SketchAlertOperator):
    kind = "heavy_hitters"
    state_keys = ("sketch", "top_k")

    def __init__(self, *, operator_id: str, source_topic: str, partition: int,
                 sketch: CountMinConfig | Mapping,
                 codec: EventCodec | None = None, raise_at: float, clear_at: float,
                 top_k: int = 100, report_interval_ms: int = 10_000, latch_capacity: int = LATCH_CAPACITY,
                 **common: Any) -> None:
        codec = codec or EventCodec(encoding="raw")
        super().__init__(operator_id=operator_id, source_topic=source_topic, partition=partition,
                         codec=codec, **common)
        if top_k < 0:
            raise ConfigError("top_k must be >= 0")
        self.top_k = int(top_k)
        config = countmin_config(sketch)
        if config.top_k not in (0, self.top_k):
            raise ConfigError(f"the sketch config's top_k ({config.top_k}) differs from the operator's "
                              f"top_k ({self.top_k}); set the operator's")
        # Typed once, here (the candidate set sized by the operator's top_k); its fingerprint
        # form as given (operators/sketchconf.py).
        self._sketch_identity = config_identity(sketch, config)
        self.sketch_config = dataclasses.replace(config, top_k=self.top_k)
        self.sketch = self._keyed(build_countmin(self.sketch_config))
        self.latch = AlertLatch(raise_at, clear_at, latch_capacity)
        self.report_interval_ms = int(report_interval_ms)
        self.every("report", self.report_interval_ms)
        self.counters.update(alerts_raised=0, alerts_cleared=0, reports=0)

    def time_scale_ms(self) -> float | None:
        epoch = self.sketch_config.epoch_ms
        return None if not epoch else epoch / 0.6931471805599453  # counters halve each epoch

    def config_dict(self) -> dict:
        return {"sketch": self._sketch_identity, "top_k": self.top_k, "raise_at": self.latch.raise_at,
                "clear_at": self.latch.clear_at, "latch_capacity": self.latch.capacity,
                "report_interval_ms": self.report_interval_ms}

    def validate_event(self, ev: Event) -> None:
        w = ev.value
        if w < 0 or w != int(w):
            raise BadRecord(f"weight must be a non-negative integer, got {w!r}")

    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        self.sketch.increment(ev.key, int(ev.value), now_ms=now_ms)
        est = self.result = self.sketch.query(ev.key, now_ms=now_ms)
        state, override = self._judge(ev.key, float(est), now_ms)
        if state is not None:
            self._alert(ev.key, state, float(est), now_ms, rec, out, override)

    def on_timer(self, name: str, now_ms: int, rec: SourceRecord, out: list[OutputRecord]) -> None:
        self._report(now_ms, rec, out)

    def _report(self, now_ms: int, rec: SourceRecord, out: list[OutputRecord]) -> None:
        sketch = self.sketch
        self._sweep_latch(lambda k: float(sketch.query(k, now_ms=now_ms)), now_ms, rec, out)
        if not self.top_k:
            return
        # One report per interval end the watermark crossed (the last MAX_CATCHUP_REPORTS of
        # them), each read at that end: every partition reports every interval, at the same
        # event time, which is what the global merge (operators/globaltopk.py) needs.
        interval = self.report_interval_ms
        first = self.timers["report"] or now_ms // interval * interval
        last = now_ms // interval * interval
        for end in range(max(first, last - (MAX_CATCHUP_REPORTS - 1) * interval), last + 1, interval):
            start = end - interval
            top = tuple(TopKEntry(k if isinstance(k, bytes) else str(k).encode(), int(e))
                        for k, e in sketch.top(self.top_k, now_ms=end))
            key = str(start).encode()
            report = TopKReport(output_id(self.operator_id, rec.partition, rec.offset, "report", key),
                                self.operator_id, self.partition, self.source_partition_count, start, end,
                                end, self.top_k, top, Source.of(rec))
            self.counters["reports"] += 1
            # Keyed by the interval start: every partition's report of one interval lands in
            # the same partition of the reports topic.
            out.append(report.output(key))

    def saturation(self) -> list:
        return countmin_saturation(self.sketch, raise_at=self.latch.raise_at)

    def describe_key(self, key: bytes, debug: bool = False) -> dict:
        """The key's decayed count-min estimate at the watermark (a read: nothing is written),
        and whether it is raised (a live score query, grudge_stream.serving)."""
        wm = self.watermark
        est = int(self.sketch.query(key, now_ms=wm)) if wm is not None else 0
        return {"kind": self.kind, "score": float(est), "estimate": est, "raised": key in self.latch,
                "raise_at": self.latch.raise_at, "clear_at": self.latch.clear_at}

