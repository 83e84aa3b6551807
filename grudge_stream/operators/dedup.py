"""Streaming dedup / novelty: forward only the first sighting of each key.

A ``ForgettingBloom`` (the ``bloom`` dict: its constructor arguments) remembers
the keys it has seen. A key it has not seen is inserted and its record is
forwarded unchanged (role ``forward``: key, value, headers and timestamp); a
key it has seen is dropped and counted. The window: a key is remembered for at
least (G-1)·period_ms (one ``period_ms`` with the default 2 generations) while
at most ``capacity`` new keys arrive per period, so a re-send inside that
window is never forwarded twice. Beyond that rate the bloom's ``overload`` setting decides:
``shrink_window`` (default) keeps the fp rate and shortens the window (the
bloom's ``effective_window_ms`` and ``overloads`` show by how much);
``raise_fp`` keeps the window and lets the fp rate rise (``fp_rate_estimate``).
The error direction: a false positive drops a new key's record (at most the fp
target, see ``fp_rate_estimate``).
"""
from __future__ import annotations

from typing import Any, Mapping

from grudge_stream.operators.codec import Event, EventCodec
from grudge_stream.operators.records import OutputRecord, SourceRecord, output_id, with_id_header
from grudge_stream.operators.stateful import BloomOperator
from grudge_stream.sketches.bloom_config import BloomConfig


class DedupOperator(BloomOperator):
    kind = "dedup"
    state_keys = ("bloom",)
    needs_headers = True  # a forwarded record keeps its headers

    def __init__(self, *, operator_id: str, source_topic: str, partition: int, bloom: BloomConfig | Mapping,
                 codec: EventCodec | None = None, **common: Any) -> None:
        codec = codec or EventCodec(encoding="raw")
        super().__init__(operator_id=operator_id, source_topic=source_topic, partition=partition,
                         codec=codec, **common)
        self._typed_bloom(bloom)
        self.counters.update(forwarded=0, duplicates=0)

    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        self.result = new = self.bloom.add_if_absent(ev.key, now_ms=now_ms)
        if new:
            self.counters["forwarded"] += 1
            # Forwarded as it came: key, value, headers and the record timestamp (not the
            # event time of a time_field, nor the clamped watermark).
            # The output id (docs/runtime.md, "Output ids") rides in the grudge-id header.
            oid = output_id(self.operator_id, rec.partition, rec.offset, "forward", ev.key)
            out.append(OutputRecord("forward", rec.key, rec.value if rec.value is not None else b"",
                                    with_id_header(rec.headers, oid), rec.timestamp_ms))
        else:
            self.counters["duplicates"] += 1

    def describe_key(self, key: bytes, debug: bool = False) -> dict:
        """Whether the key was seen inside the window (its next record would be dropped as a
        duplicate; false positives possible), read at the watermark without rotating."""
        wm = self.watermark
        seen = bool(self.bloom.contains(key, now_ms=wm)) if wm is not None else False
        return {"kind": self.kind, "seen": seen}
