"""A known-key cache: spare a backend the checks of keys it already accepted.

The source topic carries two kinds of JSON events for a key (keyed by it, so
both land in the same partition):

- ``{"event": "seen"}``: a request that needs the key validated (a stream
  label set, an API token, a device id);
- ``{"event": "accepted"}``: the backend's verdict that the key is valid
  (``{"event": "rejected"}`` is read and ignored: rejected keys are never
  cached).

For a ``seen`` key the ``ForgettingBloom`` answers: present → counted as
skipped (no output); absent → a ``checks`` record asks the backend to check
it (with the source record's headers and timestamp). ``accepted`` inserts
the key. An accepted key stays known for at least (G-1)·period_ms (one
``period_ms`` with the default 2 generations) while at most ``capacity`` new
keys arrive per period; beyond that rate the bloom's
``overload`` setting decides whether the window shrinks (``shrink_window``,
default: more re-checks, fp rate held) or the fp rate rises (``raise_fp``:
fewer re-checks, more unknown keys skipped). The error direction is
fail-open: a Bloom false positive skips the check of an unknown key, at most
at the fp target (``fp_rate_estimate`` reports the live rate) and only until
the key's generation is forgotten (at most G·period_ms).
"""
from __future__ import annotations

from typing import Any, Mapping

from grudge_stream.operators.codec import BadRecord, Event, EventCodec
from grudge_stream.operators.records import (
    KeyCheck,
    OutputRecord,
    Source,
    SourceRecord,
    output_id,
    with_id_header,
)
from grudge_stream.operators.stateful import BloomOperator
from grudge_stream.sketches.bloom_config import BloomConfig

EVENTS = {"seen": 0.0, "accepted": 1.0, "rejected": 2.0}


class KnownKeyOperator(BloomOperator):
    kind = "known_keys"
    state_keys = ("bloom",)
    needs_headers = True  # a check request carries its source record's headers (tracing ids)

    def __init__(self, *, operator_id: str, source_topic: str, partition: int, bloom: BloomConfig | Mapping,
                 codec: EventCodec | None = None, **common: Any) -> None:
        codec = codec or EventCodec(value_field="event", outcomes=EVENTS, allow_numbers=False)
        super().__init__(operator_id=operator_id, source_topic=source_topic, partition=partition,
                         codec=codec, **common)
        self._typed_bloom(bloom)
        self.counters.update(checks=0, skipped=0, accepted=0, rejected=0)

    def validate_event(self, ev: Event) -> None:
        if ev.value not in (0.0, 1.0, 2.0):
            raise BadRecord("event must be 'seen', 'accepted' or 'rejected'")

    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        if ev.value == 1.0:
            self.bloom.add(ev.key, now_ms=now_ms)
            self.counters["accepted"] += 1
        elif ev.value == 2.0:
            self.counters["rejected"] += 1
        elif self.bloom.contains(ev.key, now_ms=now_ms):
            self.counters["skipped"] += 1
        else:
            self.counters["checks"] += 1
            oid = output_id(self.operator_id, rec.partition, rec.offset, "check", ev.key)
            check = KeyCheck(oid, self.operator_id, ev.key, now_ms, Source.of(rec))
            # The id also replaces any grudge-id header the source record carried.
            out.append(check.output(ev.key, with_id_header(rec.headers, oid), rec.timestamp_ms))

    def describe_key(self, key: bytes, debug: bool = False) -> dict:
        """Whether the key is known (accepted inside the window: its next ``seen`` skips the
        check; false positives possible), read at the watermark without rotating."""
        wm = self.watermark
        seen = bool(self.bloom.contains(key, now_ms=wm)) if wm is not None else False
        return {"kind": self.kind, "seen": seen, "known": seen}
