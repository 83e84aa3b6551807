"""Heavy hitters / DDoS detection: which source IPs flood right now.

Events: one record per request or packet sample, keyed by the source IP
(``raw`` encoding: the key is all that is read, weight 1), or JSON with a
``weight`` field when ``encoding=json`` (and the key in ``key_field``, if set:
the worker then re-keys the source by it through its repartition topic,
``repartition``).

A ``DecayingCountMin`` (4 x 65536 cells = 1 MiB per partition, counts halving
every ``epoch_ms``) estimates each IP's decayed request count; an IP is
raised at ``raise_at`` and cleared at ``clear_at``; every
``report_interval_ms`` the top-k IPs go to the reports topic.

Settings: ``grudge-stream describe heavy_hitters`` (``SETTINGS`` below, plus the settings
every topology takes, docs/runtime.md).
"""
from __future__ import annotations

from typing import Any, Mapping

from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.heavy import HeavyHitterOperator
from grudge_stream.sketches.countmin_config import CountMinConfig
from grudge_stream.topology import REPARTITION_SETTING as REPARTITION
from grudge_stream.topology import repartition_plan
from grudge_stream.exceptions import ConfigError
from grudge_stream.settings import Setting, identity, index_scheme_setting, require_order
from grudge_stream.topology import Settings, Topology, codec_settings, operator_settings

S = Setting
SETTINGS = [
    *identity(source="hh-requests", snapshots="hh-snapshots",
              operator_id="heavy-hitters", dead_letters="hh-dead-letters"),
    index_scheme_setting(),
    S("alerts_topic", "str", "hh-alerts", "raised / cleared alerts"),
    S("reports_topic", "str", "hh-top", "top-k reports"),
    S("depth", "int", 4, "count-min rows", min=1, max=16, state=True),
    S("width", "int", 65_536, "count-min counters per row", min=1, state=True),
    S("epoch_ms", "int", 1000, "counters halve every epoch", "ms", min=1, state=True),
    S("encoding", "choice", "raw", "raw (the record key, weight 1) or json (a 'weight' field)",
      choices=("raw", "json"), state=True),
    S("raise_at", "float", 5000.0, "a key is raised at this decayed count"),
    S("clear_at", "float", 1000.0, "a raised key is cleared at this decayed count (below raise_at)"),
    S("top_k", "int", 100, "keys per top-k report", min=0, state=True),
    S("report_interval_ms", "int", 10_000, "event time between top-k reports", "ms", min=1),
    S("key_field", "str", None, "encoding=json: JSON field holding the key (default: the record key)",
      state=True),
    REPARTITION,
]


def validate(v: Mapping[str, Any]) -> None:
    require_order(v, "clear_at", "raise_at", 0.0)
    if v.get("key_field") is not None and v.get("encoding", "raw") != "json":
        raise ConfigError("setting 'key_field' needs encoding=json (a raw record is its key)")


def build(settings: Settings) -> Topology:
    source = settings["source_topic"]
    operator_id = settings["operator_id"]
    sketch = CountMinConfig(depth=settings["depth"], width=settings["width"],
                            epoch_ms=settings["epoch_ms"], hasher="siphash",
                            index_scheme=settings["index_scheme"])
    common = operator_settings(settings, "heavy_hitters")
    encoding = settings["encoding"]
    keys = codec_settings(settings)
    key_field = settings["key_field"]
    dead_letters = settings["dead_letter_topic"]
    # Keyed by a field: the operators read the repartition topic, keyed by it (docs/runtime.md,
    # "Repartitioning by a field"), so the record key is the key there.
    rp = repartition_plan(settings, source=source, operator_id=operator_id, key_field=key_field,
                          dead_letter_topic=dead_letters)
    if rp is not None:
        source = rp.topic
    codec = (EventCodec(encoding="raw", **keys) if encoding == "raw"
             else EventCodec(key_field=key_field if rp is None else None, value_field="weight", **keys))
    kwargs = dict(raise_at=settings["raise_at"], clear_at=settings["clear_at"],
                  top_k=settings["top_k"], report_interval_ms=settings["report_interval_ms"])

    def make_operator(partition: int) -> HeavyHitterOperator:
        return HeavyHitterOperator(operator_id=operator_id, source_topic=source, partition=partition,
                                   sketch=sketch, codec=codec, **kwargs, **common)

    return Topology(
        operator_id=operator_id,
        needs_headers=False,
        name=settings["app_name"] or "heavy-hitters",
        source_topic=source,
        make_operator=make_operator,
        outputs={
            "alerts": settings["alerts_topic"],
            "reports": settings["reports_topic"],
            "dead_letters": dead_letters,
        },
        snapshot_topic=settings["snapshot_topic"],
        checkpoint_interval_s=settings["checkpoint_interval_s"],
        restore_fallback=settings["restore_fallback"],
        description="decayed heavy hitters with alerts and top-k reports",
        repartition=rp,
        app_id=rp.app_id if rp is not None else "",
    )
