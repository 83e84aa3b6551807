"""Streaming dedup / novelty: forward only the first sighting of each key.

A ``ForgettingBloom`` remembers the keys seen in the last one to two
generation periods. A key it has not seen is inserted and its record is
forwarded unchanged (role ``forward``); a key it has seen is dropped and
counted. The error direction: a false positive drops a new key's record
(at most the fp target, see ``fp_rate_estimate``); a key is never forwarded
twice within its memory window.
"""
from __future__ import annotations

from typing import Any

from grudge_stream.operators.codec import Event, EventCodec
from grudge_stream.operators.records import OutputRecord, SourceRecord
from grudge_stream.operators.stateful import BloomOperator


class DedupOperator(BloomOperator):
    kind = "dedup"
    state_keys = ("bloom",)

    def __init__(self, *, operator_id: str, source_topic: str, partition: int, bloom: dict,
                 codec: EventCodec | None = None, **common: Any) -> None:
        codec = codec or EventCodec(encoding="raw")
        super().__init__(operator_id=operator_id, source_topic=source_topic, partition=partition,
                         codec=codec, **common)
        from grudge_stream import ForgettingBloom

        self.bloom_config = dict(bloom)
        self.bloom = self._keyed(ForgettingBloom(**self.bloom_config))
        self.counters.update(forwarded=0, duplicates=0)

    def config_dict(self) -> dict:
        return {"bloom": self.bloom_config}

    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        if self.bloom.add_if_absent(ev.key, now_ms=now_ms):
            self.counters["forwarded"] += 1
            out.append(OutputRecord("forward", rec.key, rec.value if rec.value is not None else b""))
        else:
            self.counters["duplicates"] += 1
