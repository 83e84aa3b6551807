"""Streaming dedup: forward each key's first sighting within a memory window, drop repeats.

Events: any records; the dedup key is the record key (``raw``) or a JSON field
(``key_field``). First sightings are forwarded unchanged to the output topic.
A ``ForgettingBloom`` sized for ``capacity`` keys per generation at
``fp_rate`` remembers keys for one to two ``period_ms`` (two generations).
A false positive drops a new key's record (rate bounded by ``fp_rate``); a
key is never forwarded twice inside its window.

Settings: ``grudge-stream describe dedup`` (``SETTINGS`` below, plus the settings
every topology takes, docs/runtime.md).
"""
from __future__ import annotations

from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.dedup import DedupOperator
from grudge_stream.settings import Setting, identity
from grudge_stream.topology import Settings, Topology, codec_settings, operator_settings

S = Setting
SETTINGS = [
    *identity(source="dedup-in", snapshots="dedup-snapshots",
              operator_id="dedup", dead_letters="dedup-dead-letters"),
    S("output_topic", "str", "dedup-out", "first sightings, forwarded"),
    S("capacity", "int", 1_000_000, "keys per Bloom generation", "keys", min=1, state=True),
    S("fp_rate", "float", 0.001, "target false-positive rate", min=0, min_inclusive=False, max=0.5, state=True),
    S("period_ms", "int", 3_600_000, "generation period (the memory window)", "ms", min=1, state=True),
    S("key_field", "str", None, "JSON field holding the id (default: the record key)", state=True),
]


def build(settings: Settings) -> Topology:
    source = settings.get("source_topic", "dedup-in")
    operator_id = settings.get("operator_id", "dedup")
    bloom = {"capacity": settings.get("capacity", 1_000_000), "fp_rate": settings.get("fp_rate", 0.001),
             "period_ms": settings.get("period_ms", 3_600_000), "hasher": "siphash"}
    common = operator_settings(settings, "dedup")
    key_field = settings.get("key_field", None)
    codec = (EventCodec(encoding="raw", **codec_settings(settings)) if key_field is None
             else EventCodec(key_field=key_field, value_field=None, **codec_settings(settings)))

    def make_operator(partition: int) -> DedupOperator:
        return DedupOperator(operator_id=operator_id, source_topic=source, partition=partition,
                             bloom=bloom, codec=codec, **common)

    return Topology(
        name=settings.get("app_name") or "dedup",
        source_topic=source,
        make_operator=make_operator,
        outputs={
            "forward": settings.get("output_topic", "dedup-out"),
            "dead_letters": settings.get("dead_letter_topic", "dedup-dead-letters"),
        },
        snapshot_topic=settings.get("snapshot_topic", "dedup-snapshots"),
        checkpoint_interval_s=settings.get("checkpoint_interval_s", 5.0),
        restore_fallback=settings.get("restore_fallback", "replay"),
        description="streaming dedup with a forgetting Bloom filter",
    )
