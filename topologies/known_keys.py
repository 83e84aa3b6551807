"""Known-key cache: send the backend only the keys it has not accepted recently.

The source topic carries ``{"event": "seen"}`` for every request and
``{"event": "accepted"}`` / ``{"event": "rejected"}`` verdicts that the
backend writes back, all keyed by the key being checked (or holding it in
``key_field``: the worker then re-keys them by it through its repartition
topic, ``repartition``). Unknown keys go to
the checks topic; known ones are skipped. Only accepted keys are remembered:
for at least (G-1)·period_ms (one ``period_ms``, two generations) while at
most ``capacity`` new keys arrive per period. When more arrive, ``overload``
chooses what gives: ``shrink_window`` (default) shortens the window (more
re-checks), ``raise_fp`` lets the fp rate rise (more unknown keys skipped).
The cache fails open at most at ``fp_rate`` (docs/forgetting-bloom.md).

Settings: ``grudge-stream describe known_keys`` (``SETTINGS`` below, plus the settings
every topology takes, docs/runtime.md).
"""
from __future__ import annotations

from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.knownkeys import EVENTS, KnownKeyOperator
from grudge_stream.topology import REPARTITION_SETTING as REPARTITION
from grudge_stream.topology import repartition_plan
from grudge_stream.settings import Setting, identity, index_scheme_setting
from grudge_stream.sketches.bloom_config import OVERLOAD_MODES, BloomConfig
from grudge_stream.topology import Settings, Topology, codec_settings, operator_settings

S = Setting
SETTINGS = [
    *identity(source="known-keys-events", snapshots="known-keys-snapshots",
              operator_id="known-keys", dead_letters="known-keys-dead-letters"),
    index_scheme_setting(),
    S("checks_topic", "str", "known-keys-checks", "keys the backend must check"),
    S("capacity", "int", 1_000_000, "keys per Bloom generation", "keys", min=1, state=True),
    S("fp_rate", "float", 0.001, "target false-positive rate", min=0, min_inclusive=False, max=0.5, state=True),
    S("period_ms", "int", 600_000, "generation period: accepted keys are remembered at least this long "
      "while at most `capacity` new keys arrive per period", "ms", min=1, state=True),
    S("overload", "choice", "shrink_window", "more than `capacity` new keys in a period: shrink_window "
      "(the window shortens: more re-checks) or raise_fp (the window holds, fp rate rises: more skips)",
      choices=OVERLOAD_MODES, state=True),
    S("key_field", "str", None, "JSON field holding the key (default: the record key)", state=True),
    REPARTITION,
]


def build(settings: Settings) -> Topology:
    source = settings["source_topic"]
    operator_id = settings["operator_id"]
    bloom = BloomConfig(capacity=settings["capacity"], fp_rate=settings["fp_rate"],
                        period_ms=settings["period_ms"], hasher="siphash",
                        overload=settings["overload"], index_scheme=settings["index_scheme"])
    common = operator_settings(settings, "known_keys")

    key_field = settings["key_field"]
    dead_letters = settings["dead_letter_topic"]
    # Keyed by a field: the operators read the repartition topic, keyed by it (docs/runtime.md,
    # "Repartitioning by a field"), so the record key is the key there.
    rp = repartition_plan(settings, source=source, operator_id=operator_id, key_field=key_field,
                          dead_letter_topic=dead_letters)
    if rp is not None:
        source = rp.topic
    codec = EventCodec(key_field=key_field if rp is None else None, value_field="event", outcomes=EVENTS,
                       allow_numbers=False, **codec_settings(settings))

    def make_operator(partition: int) -> KnownKeyOperator:
        return KnownKeyOperator(operator_id=operator_id, source_topic=source, partition=partition, bloom=bloom,
                                codec=codec, **common)

    return Topology(
        operator_id=operator_id,
        needs_headers=True,
        name=settings["app_name"] or "known-keys",
        source_topic=source,
        make_operator=make_operator,
        outputs={
            "checks": settings["checks_topic"],
            "dead_letters": dead_letters,
        },
        snapshot_topic=settings["snapshot_topic"],
        checkpoint_interval_s=settings["checkpoint_interval_s"],
        restore_fallback=settings["restore_fallback"],
        description="known-key cache in front of a backend check",
        repartition=rp,
        app_id=rp.app_id if rp is not None else "",
    )
