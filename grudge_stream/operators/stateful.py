"""State shared by several operators: a sketch with an alert latch, or a forgetting Bloom."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from grudge_stream.exceptions import MismatchError
from grudge_stream.operators.alerts import AlertLatch
from grudge_stream.operators.base import Operator
from grudge_stream.operators.records import OutputRecord, Source, SourceRecord
from grudge_stream.operators.sketchconf import bloom_config, build_bloom, config_identity
from grudge_stream.sketches.bloom_config import BloomConfig


class SketchAlertOperator(Operator):
    """An operator whose state is one sketch (``self.sketch``) and an alert latch (``self.latch``).

    Every crossing goes out twice: as an event on ``alerts`` and as the key's current
    state on ``alert_state`` (compacted: the raise alert while raised, a tombstone once
    cleared or dropped by a latch overflow), from which subscribers bootstrap the
    raised set (``grudge_stream.client``). ``overrides`` (a
    ``grudge_stream.overrides.OverrideTable``, from the ``OperatorContext``) is consulted
    before the latch: allowed keys are never raised, denied keys always.
    """

    sketch: Any
    latch: AlertLatch

    def _judge(self, key: bytes, score: float, now_ms: int) -> tuple[str | None, str | None]:
        """The latch's verdict on ``key``'s new score, overrides first: ``(state, override)``."""
        table = self.overrides
        if table is not None and len(table):
            action = table.action(key, now_ms)
            if action == "allow":
                return ("cleared" if self.latch.remove(key) else None), "allow"
            if action == "deny":
                return self.latch.force(key, score), "deny"
        return self.latch.observe(key, score), None

    def _denied_keys(self, now_ms: int) -> list[bytes]:
        table = self.overrides
        return table.denied(now_ms) if table is not None and table.has_denies() else []

    def _sweep_latch(self, score_of, now_ms: int, rec: SourceRecord, out: list[OutputRecord]) -> None:
        """Clear the raised keys gone quiet (not the denied ones), and the allowed ones."""
        table = self.overrides
        keep = None
        if table is not None and len(table):
            for key in list(self.latch.keys()):
                if table.action(key, now_ms) == "allow":
                    self.latch.remove(key)
                    self._alert(key, "cleared", score_of(key), now_ms, rec, out, override="allow")
            keep = lambda k: table.action(k, now_ms) == "deny"  # noqa: E731
        for key, score in self.latch.sweep(score_of, keep):
            self._alert(key, "cleared", score, now_ms, rec, out)

    def _alert(self, key: bytes, state: str, score: float, now_ms: int, rec: SourceRecord,
               out: list[OutputRecord], override: str | None = None) -> None:
        self.counters["alerts_" + state] += 1
        alert = self.latch.alert(operator_id=self.operator_id, key=key, state=state, score=score,
                                 event_time_ms=now_ms, source=Source.of(rec), override=override)
        body = alert.to_bytes()
        out.append(OutputRecord(alert.role, key, body))
        out.append(OutputRecord("alert_state", key, body if state == "raised" else None))
        evicted = self.latch.evicted
        if evicted:
            # Dropped by an overflow without a cleared alert: no longer raised here either.
            for k in evicted:
                out.append(OutputRecord("alert_state", k, None))
            evicted.clear()

    def wants_tick(self) -> bool:
        return len(self.latch) > 0

    def state_sections(self) -> list[tuple[str, bytes]]:
        return [("sketch", self.sketch.to_bytes()), ("latch", self.latch.to_bytes())]

    def state_sections_taken(self) -> list[tuple[str, bytes | Callable[[], Any]]]:
        # A sketch that makes its envelope unbuilt has it written in place, into the snapshot.
        later = getattr(self.sketch, "envelope_later", None) or getattr(self.sketch, "to_bytes_later", None)
        if later is None:
            return list(self.state_sections())
        return [("sketch", later()), ("latch", self.latch.to_bytes())]

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
    bloom_config: BloomConfig

    def _typed_bloom(self, bloom: BloomConfig | Mapping) -> None:
        """The bloom from its config object or a dict of its fields, typed once, here; its
        fingerprint form as given (operators/sketchconf.py)."""
        self.bloom_config = bloom_config(bloom)
        identity = config_identity(bloom, self.bloom_config)
        # The default overload is left out, so state written before the setting existed
        # keeps its fingerprint.
        if identity.get("overload") == "shrink_window":
            del identity["overload"]
        self._bloom_identity = identity
        self.bloom = self._keyed(build_bloom(self.bloom_config))

    def config_dict(self) -> dict:
        return {"bloom": self._bloom_identity}

    def time_scale_ms(self) -> float | None:
        return self.bloom_config.period_ms

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
