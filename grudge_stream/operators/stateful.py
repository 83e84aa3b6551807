"""State shared by several operators: a sketch with an alert latch, or a forgetting Bloom."""
from __future__ import annotations

from typing import Any

from grudge_stream.exceptions import MismatchError
from grudge_stream.operators.alerts import AlertLatch
from grudge_stream.operators.base import Operator
from grudge_stream.operators.records import OutputRecord, SourceRecord


class SketchAlertOperator(Operator):
    """An operator whose state is one sketch (``self.sketch``) and an alert latch (``self.latch``)."""

    sketch: Any
    latch: AlertLatch

    def _alert(self, key: bytes, state: str, score: float, now_ms: int, rec: SourceRecord,
               out: list[OutputRecord]) -> None:
        self.counters["alerts_" + state] += 1
        out.append(OutputRecord("alerts", key, self.latch.make_alert(
            operator_id=self.operator_id, key=key, state=state, score=score, event_time_ms=now_ms,
            topic=rec.topic, partition=rec.partition, offset=rec.offset)))

    def state_sections(self) -> list[tuple[str, bytes]]:
        return [("sketch", self.sketch.to_bytes()), ("latch", self.latch.to_bytes())]

    def state_scalars(self) -> dict:
        return {"latch_evictions": self.latch.evictions}

    def load_sections(self, sections: dict, scalars: dict) -> None:
        """Build the new sketch and latch first; adopt them only when both are valid."""
        sketch_cls = type(self.sketch)
        if self.hash_key is not None and sketch_cls.__name__ == "DecayingCountMin":
            # Its top-k candidates are checked against their hashes while loading.
            sketch = sketch_cls.from_bytes(bytes(sections["sketch"]), hash_key=self.hash_key.material)
        else:
            sketch = sketch_cls.from_bytes(bytes(sections["sketch"]))
        sketch = self._keyed(sketch)
        if sketch.config != self.sketch.config:
            raise MismatchError("sketch section was written under another sketch configuration")
        latch = AlertLatch(self.latch.raise_at, self.latch.clear_at, self.latch.capacity)
        latch.load(bytes(sections["latch"]))
        latch.evictions = int(scalars.get("latch_evictions", 0))
        self.sketch, self.latch = sketch, latch

    def memory_bytes(self) -> int:
        return self.sketch.memory_bytes()

    def sketch_bytes(self) -> bytes:
        return self.sketch.to_bytes()


class BloomOperator(Operator):
    """An operator whose state is one ``ForgettingBloom`` (``self.bloom``)."""

    bloom: Any

    def time_scale_ms(self) -> float | None:
        return self.bloom_config.get("period_ms")

    def saturation(self) -> list:
        from grudge_stream.operators.saturation import bloom_saturation

        return bloom_saturation(self.bloom, self.watermark)

    def state_sections(self) -> list[tuple[str, bytes]]:
        return [("bloom", self.bloom.to_bytes())]

    def load_sections(self, sections: dict, scalars: dict) -> None:
        bloom = self._keyed(type(self.bloom).from_bytes(bytes(sections["bloom"])))
        if bloom.config != self.bloom.config:
            raise MismatchError("bloom section was written under another configuration")
        self.bloom = bloom

    def memory_bytes(self) -> int:
        return self.bloom.memory_bytes()

    def sketch_bytes(self) -> bytes:
        return self.bloom.to_bytes()
