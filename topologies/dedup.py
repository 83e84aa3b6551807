"""Streaming dedup: forward each key's first sighting within a memory window, drop repeats.

Events: any records; the dedup key is the record key (``raw``) or a JSON field
(``key_field``: by default the worker re-keys the source by it through its
repartition topic, ``repartition``). First sightings are forwarded unchanged,
headers and timestamp included, to the output topic.
A ``ForgettingBloom`` sized for ``capacity`` keys per generation at
``fp_rate`` (two generations) remembers a key for at least (G-1)·period_ms
(one ``period_ms``) while at most ``capacity`` new keys arrive per period: a
re-send inside that window is never forwarded twice. When more arrive,
``overload`` chooses what gives: ``shrink_window`` (default) keeps the fp rate
and shortens the window; ``raise_fp`` keeps the window and lets the fp rate
rise (docs/forgetting-bloom.md). A false positive drops a new key's record
(rate bounded by ``fp_rate`` unless ``raise_fp`` is overloaded).

Settings: ``grudge-stream describe dedup`` (``SETTINGS`` below, plus the settings
every topology takes, docs/runtime.md).
"""
from __future__ import annotations

from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.dedup import DedupOperator
from grudge_stream.topology import REPARTITION_SETTING as REPARTITION
from grudge_stream.topology import repartition_plan
from grudge_stream.settings import Setting, identity, index_scheme_setting
from grudge_stream.sketches.bloom_config import OVERLOAD_MODES, BloomConfig
from grudge_stream.topology import Settings, Topology, codec_settings, operator_settings

S = Setting
SETTINGS = [
    *identity(source="dedup-in", snapshots="dedup-snapshots",
              operator_id="dedup", dead_letters="dedup-dead-letters"),
    index_scheme_setting(),
    S("output_topic", "str", "dedup-out", "first sightings, forwarded"),
    S("capacity", "int", 1_000_000, "keys per Bloom generation", "keys", min=1, state=True),
    S("fp_rate", "float", 0.001, "target false-positive rate", min=0, min_inclusive=False, max=0.5, state=True),
    S("period_ms", "int", 3_600_000, "generation period: keys are remembered at least this long while at "
      "most `capacity` new keys arrive per period", "ms", min=1, state=True),
    S("overload", "choice", "shrink_window", "more than `capacity` new keys in a period: shrink_window "
      "(the window shortens, fp rate held) or raise_fp (the window holds, fp rate rises)",
      choices=OVERLOAD_MODES, state=True),
    S("key_field", "str", None, "JSON field holding the id (default: the record key)", state=True),
    REPARTITION,
]


def build(settings: Settings) -> Topology:
    source = settings["source_topic"]
    operator_id = settings["operator_id"]
    bloom = BloomConfig(capacity=settings["capacity"], fp_rate=settings["fp_rate"],
                        period_ms=settings["period_ms"], hasher="siphash",
                        overload=settings["overload"], index_scheme=settings["index_scheme"])
    common = operator_settings(settings, "dedup")
    key_field = settings["key_field"]
    dead_letters = settings["dead_letter_topic"]
    # Keyed by a field: the operators read the repartition topic, keyed by it (docs/runtime.md,
    # "Repartitioning by a field"), so the record key is the id there.
    rp = repartition_plan(settings, source=source, operator_id=operator_id, key_field=key_field,
                          dead_letter_topic=dead_letters)
    if rp is not None:
        source = rp.topic
    codec = (EventCodec(encoding="raw", **codec_settings(settings)) if key_field is None or rp is not None
             else EventCodec(key_field=key_field, value_field=None, **codec_settings(settings)))

    def make_operator(partition: int) -> DedupOperator:
        return DedupOperator(operator_id=operator_id, source_topic=source, partition=partition,
                             bloom=bloom, codec=codec, **common)

    return Topology(
        operator_id=operator_id,
        needs_headers=True,
        name=settings["app_name"] or "dedup",
        source_topic=source,
        make_operator=make_operator,
        outputs={
            "forward": settings["output_topic"],
            "dead_letters": dead_letters,
        },
        snapshot_topic=settings["snapshot_topic"],
        checkpoint_interval_s=settings["checkpoint_interval_s"],
        restore_fallback=settings["restore_fallback"],
        description="streaming dedup with a forgetting Bloom filter",
        repartition=rp,
        app_id=rp.app_id if rp is not None else "",
    )
