"""Global heavy hitters: one top-k over every source partition, per report interval.

The second stage of ``heavy_hitters``: its source is heavy_hitters' reports
topic (``hh-top``), where each source partition reports its top-k at the end of
every ``report_interval_ms``, keyed by the interval start. For each interval
this topology emits ONE record to ``global_reports_topic`` once every source
partition has reported it, or ``grace_ms`` of event time (interval ends seen on
its source partition) after the interval's end without the silent partitions
(``missing`` lists them). Exact when the heavy_hitters source is keyed by the
counted key (``keyed=true``); otherwise every entry carries its error bound
(docs/runtime.md, "Global top-k").

The reports topic needs few partitions (a handful of records per interval): one
partition is the simplest, and with several, grace is measured per partition.

Settings: ``grudge-stream describe heavy_global`` (``SETTINGS`` below, plus the settings
every topology takes, docs/runtime.md). No secret key is needed: nothing is hashed
into a sketch.
"""
from __future__ import annotations

from grudge_stream.operators.globaltopk import MAX_PARTITIONS, GlobalTopKOperator
from grudge_stream.settings import Setting, identity
from grudge_stream.topology import Settings, Topology, operator_settings

S = Setting
SETTINGS = [
    *identity(source="hh-top", snapshots="hh-global-snapshots",
              operator_id="heavy-global", dead_letters="hh-global-dead-letters"),
    S("global_reports_topic", "str", "hh-global", "one global top-k record per report interval"),
    S("top_k", "int", 0, "keys per global record (0: the reports' k; never more than it)", min=0),
    S("grace_ms", "int", 30_000, "event time past an interval's end after which it is emitted without "
      "the partitions that did not report it", "ms", min=0),
    S("max_open_intervals", "int", 64, "intervals waiting for reports at once; one more closes the oldest",
      min=1),
    S("keyed", "bool", True, "the heavy_hitters source is keyed by the counted key (each key in one "
      "partition): the merge is exact; false: entries carry estimate_max"),
    S("source_partitions", "int", 0, "heavy_hitters' source partition count, for reports that do not "
      "carry it (0: reports must)", min=0, max=MAX_PARTITIONS),
]


def build(settings: Settings) -> Topology:
    source = settings["source_topic"]
    operator_id = settings["operator_id"]
    common = operator_settings(settings, "heavy_global", hashed=False)
    kwargs = dict(top_k=settings["top_k"], grace_ms=settings["grace_ms"],
                  max_open_intervals=settings["max_open_intervals"], keyed=settings["keyed"],
                  source_partitions=settings["source_partitions"])

    def make_operator(partition: int) -> GlobalTopKOperator:
        return GlobalTopKOperator(operator_id=operator_id, source_topic=source, partition=partition,
                                  **kwargs, **common)

    return Topology(
        operator_id=operator_id,
        needs_headers=False,
        name=settings["app_name"] or "heavy-global",
        source_topic=source,
        make_operator=make_operator,
        outputs={
            "global_reports": settings["global_reports_topic"],
            "dead_letters": settings["dead_letter_topic"],
        },
        snapshot_topic=settings["snapshot_topic"],
        checkpoint_interval_s=settings["checkpoint_interval_s"],
        restore_fallback=settings["restore_fallback"],
        description="global top-k over heavy_hitters' per-partition reports",
    )
