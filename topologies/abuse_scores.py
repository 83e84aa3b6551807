"""Abuse scores: FAIR-style feedback scores per client, alerts when a client turns abusive.

Events (JSON, keyed by the client id)::

    {"outcome": "bad"}      # a failed login, a rejected payment, a spam report, ...
    {"outcome": "good"}     # a successful, legitimate request

``bad`` raises the client's score by 0.04, ``good`` forgives 0.001; scores
decay exponentially (half-life about 69 s at the default 0.01/s) and are
clamped to [0, 1]. A client is raised at 0.5 and cleared at 0.25. Punishment
and forgiveness live in two sketches (``score_mode=split``), so other clients'
``good`` outcomes on shared cells cannot hide an abuser. Keys come
from the public, so the sketch hashes with SipHash under a secret key
(``GRUDGE_SEED``, docs/security.md).

Produce the events keyed by the client id with the partitioner ``key_partitioner`` names
(default ``murmur2``, Kafka's: Java clients, Kafka Streams, Faust; confluent-kafka and
librdkafka only with ``partitioner=murmur2_random``, their default being ``crc32``): live
score queries find a key's partition with it, and the worker counts and reports records that
disagree (docs/runtime.md, "Live score queries").

Settings: ``grudge-stream describe abuse_scores`` (declared in ``SETTINGS``
below, plus the settings every topology takes, docs/runtime.md).
"""
from __future__ import annotations

from typing import Any, Mapping

from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.scores import EMIT_MODES, SCORE_MODES, FeedbackScoreOperator
from grudge_stream.settings import Setting, identity, index_scheme_setting, require_order
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
from grudge_stream.topology import Settings, Topology, codec_settings, operator_settings

S = Setting
SETTINGS = [
    *identity(source="abuse-events", snapshots="abuse-scores-snapshots",
              operator_id="abuse-scores", dead_letters="abuse-dead-letters"),
    index_scheme_setting(),
    S("alerts_topic", "str", "abuse-alerts", "raised / cleared alerts"),
    S("scores_topic", "str", "abuse-scores", "scores (on crossings or every event)"),
    S("levels", "int", 4, "sketch levels (cells per key)", min=1, max=16, state=True),
    S("cells_per_level", "int", 100_000, "sketch cells per level", min=1, state=True),
    S("score_mode", "choice", "split", "split: punishment and forgiveness in two sketches, so colliding "
      "keys' good outcomes cannot hide an abuser (2x memory); single: one signed sketch (as in "
      "earlier releases; half the memory)", choices=SCORE_MODES, state=True),
    S("decay_per_s", "float", 0.01, "exponential decay rate (half-life ln2/rate)", "1/s", min=0,
      min_inclusive=False, state=True),
    S("bad_delta", "float", 0.04, "score added by a 'bad' outcome", min=0, min_inclusive=False),
    S("good_delta", "float", -0.001, "score added by a 'good' outcome (forgiveness, <= 0)", max=0),
    S("raise_at", "float", 0.5, "a client is raised at this score (within the clamp [0, 1])"),
    S("clear_at", "float", 0.25, "a raised client is cleared at this score (below raise_at)"),
    S("emit_scores", "choice", "crossings", "score records: on threshold crossings, every event, or none",
      choices=EMIT_MODES),
    S("latch_capacity", "int", 100_000, "raised keys kept at most (the lowest scores give way)", min=1),
    S("sweep_interval_ms", "int", 10_000, "event time between sweeps that clear raised keys gone quiet",
      "ms", min=1),
]


def validate(v: Mapping[str, Any]) -> None:
    require_order(v, "clear_at", "raise_at", 0.0, 1.0)


def build(settings: Settings) -> Topology:
    sketch = ScoreSketchConfig(
        levels=settings["levels"],
        cells_per_level=settings["cells_per_level"],
        decay=Exponential(settings["decay_per_s"]),
        lo=0.0,
        hi=1.0,
        aggregator="min",
        hasher="siphash",
        index_scheme=settings["index_scheme"],
    )
    common = operator_settings(settings, "abuse_scores")
    codec = EventCodec(
        encoding="json",
        key_field=None,
        value_field="outcome",
        outcomes={"bad": settings["bad_delta"], "good": settings["good_delta"]},
        allow_numbers=False,
        **codec_settings(settings),
    )
    source = settings["source_topic"]
    operator_id = settings["operator_id"]
    policy = dict(raise_at=settings["raise_at"], clear_at=settings["clear_at"],
                  latch_capacity=settings["latch_capacity"], emit_scores=settings["emit_scores"],
                  sweep_interval_ms=settings["sweep_interval_ms"], score_mode=settings["score_mode"])

    def make_operator(partition: int) -> FeedbackScoreOperator:
        return FeedbackScoreOperator(operator_id=operator_id, source_topic=source, partition=partition,
                                     sketch=sketch, codec=codec, **policy, **common)

    return Topology(
        operator_id=operator_id,
        needs_headers=False,
        name=settings["app_name"] or "abuse-scores",
        source_topic=source,
        make_operator=make_operator,
        outputs={
            "alerts": settings["alerts_topic"],
            "scores": settings["scores_topic"],
            "dead_letters": settings["dead_letter_topic"],
        },
        snapshot_topic=settings["snapshot_topic"],
        checkpoint_interval_s=settings["checkpoint_interval_s"],
        restore_fallback=settings["restore_fallback"],
        description="FAIR-style abuse scores with alerts",
    )
