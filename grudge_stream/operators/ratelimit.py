"""Rate limiting: one allow/deny decision per request, from a token bucket per key.

Each event is a request of ``cost`` (default 1) by a key. The token-bucket
recipe (``grudge_stream.recipes.TokenBucket``: linear refill at ``rate_per_s``,
capacity ``burst``) decides on event time, and the operator emits one
``decisions`` record per request: ``allowed``, and for a denial the exact
``retry_after_ms`` after which the same request would be admitted (linear
refill makes it closed-form; ``null`` when the cost exceeds the burst and can
never be admitted).
"""
from __future__ import annotations

import json
from typing import Any

from grudge_stream.exceptions import ConfigError, MismatchError
from grudge_stream.operators.alerts import key_fields
from grudge_stream.operators.base import Operator
from grudge_stream.operators.codec import BadRecord, Event, EventCodec
from grudge_stream.operators.records import OutputRecord, SourceRecord


class RateLimitOperator(Operator):
    kind = "rate_limit"
    state_keys = ("bucket",)

    def __init__(self, *, operator_id: str, source_topic: str, partition: int, rate_per_s: float,
                 burst: float, reject_penalty: float = 0.0, max_debt: float | None = None,
                 levels: int = 4, cells_per_level: int = 100_000, hasher: str = "siphash", seed: int = 0,
                 codec: EventCodec | None = None, emit: str = "all",
                 **common: Any) -> None:
        from grudge_stream.recipes import TokenBucket

        codec = codec or EventCodec(value_field="cost", encoding="json")
        super().__init__(operator_id=operator_id, source_topic=source_topic, partition=partition,
                         codec=codec, **common)
        if emit not in ("all", "denials"):
            raise ConfigError("emit must be 'all' or 'denials'")
        self.params = {"rate_per_s": float(rate_per_s), "burst": float(burst),
                       "reject_penalty": float(reject_penalty),
                       "max_debt": None if max_debt is None else float(max_debt), "levels": int(levels),
                       "cells_per_level": int(cells_per_level), "hasher": hasher, "seed": int(seed)}
        self.emit = emit
        self._cls = TokenBucket
        self.bucket = TokenBucket(**self.params)
        self._keyed(self.bucket.sketch)
        self.counters.update(allowed=0, denied=0)

    def time_scale_ms(self) -> float | None:
        return 1000.0 * self.params["burst"] / self.params["rate_per_s"] if self.params["rate_per_s"] > 0 else None

    def config_dict(self) -> dict:
        return {"bucket": self.params, "emit": self.emit}

    def validate_event(self, ev: Event) -> None:
        if ev.value < 0:
            raise BadRecord(f"cost must be >= 0, got {ev.value!r}")

    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        d = self.bucket.allow(ev.key, ev.value, now_ms=now_ms)
        self.counters["allowed" if d.allowed else "denied"] += 1
        if d.allowed and self.emit == "denials":
            return
        body = {"operator": self.operator_id, **key_fields(ev.key), "allowed": d.allowed,
                "retry_after_ms": 0 if d.allowed else d.retry_after_ms, "cost": ev.value,
                "event_time_ms": now_ms,
                "source": {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset}}
        out.append(OutputRecord("decisions", ev.key, json.dumps(body, separators=(",", ":")).encode()))

    def saturation(self) -> list:
        from grudge_stream.operators.saturation import bucket_saturation

        return bucket_saturation(self.bucket.sketch, self.watermark, rate_per_s=self.params["rate_per_s"],
                                 burst=self.params["burst"])

    def state_sections(self) -> list[tuple[str, bytes]]:
        return [("sketch", self.bucket.sketch.to_bytes())]

    def load_sections(self, sections: dict, scalars: dict) -> None:
        from grudge_stream import ScoreSketch

        sketch = self._keyed(ScoreSketch.from_bytes(bytes(sections["sketch"])))
        if sketch.config != self.bucket.sketch.config:
            raise MismatchError("token-bucket sketch was written under another configuration")
        self.bucket = self._cls.from_sketch(sketch, burst=self.params["burst"],
                                            reject_penalty=self.params["reject_penalty"])

    def memory_bytes(self) -> int:
        return self.bucket.memory_bytes()

    def sketch_bytes(self) -> bytes:
        return self.bucket.sketch.to_bytes()
