"""Abuse scores: FAIR-style feedback scores per client, alerts when a client turns abusive.

Events (JSON, keyed by the client id)::

    {"outcome": "bad"}      # a failed login, a rejected payment, a spam report, ...
    {"outcome": "good"}     # a successful, legitimate request

``bad`` raises the client's score by 0.04, ``good`` forgives 0.001; scores
decay exponentially (half-life about 69 s at the default 0.01/s) and are
clamped to [0, 1]. A client is raised at 0.5 and cleared at 0.25. Keys come
from the public, so the sketch hashes with SipHash under a secret key
(``GRUDGE_SEED``).

Settings (flag ``--set name=value`` or environment ``GRUDGE_<NAME>``):
``source_topic`` (abuse-events), ``alerts_topic`` (abuse-alerts),
``scores_topic`` (abuse-scores), ``dead_letter_topic`` (abuse-dead-letters),
``snapshot_topic`` (abuse-scores-snapshots), ``operator_id`` (abuse-scores),
``levels`` (4), ``cells_per_level`` (100000), ``decay_per_s`` (0.01),
``bad_delta`` (0.04), ``good_delta`` (-0.001), ``raise_at`` (0.5),
``clear_at`` (0.25), ``emit_scores`` (crossings),
``latch_capacity`` (100000), ``sweep_interval_ms`` (10000: how often, in event time, raised
keys that went quiet are re-read so they can clear), ``checkpoint_interval_s`` (5),
``restore_fallback`` (replay).

Every topology also takes ``seed`` / ``seed_file`` (required: the secret hash key,
docs/security.md), ``max_future_ms``, ``future_policy``, ``max_late_ms``, ``late_policy``,
``max_key_bytes`` (1024) and ``allow_empty_keys`` (false): docs/runtime.md.
"""
from __future__ import annotations

from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.scores import FeedbackScoreOperator
from grudge_stream.topology import Settings, Topology, codec_settings, operator_settings


def build(settings: Settings) -> Topology:
    source = settings.get("source_topic", "abuse-events")
    operator_id = settings.get("operator_id", "abuse-scores")
    sketch = {
        "levels": settings.get("levels", 4),
        "cells_per_level": settings.get("cells_per_level", 100_000),
        "decay": {"kind": "exponential", "lambda_per_s": settings.get("decay_per_s", 0.01)},
        "lo": 0.0,
        "hi": 1.0,
        "aggregator": "min",
        "hasher": "siphash",
    }
    common = operator_settings(settings, "abuse_scores")
    codec = EventCodec(
        encoding="json",
        key_field=None,
        value_field="outcome",
        outcomes={"bad": settings.get("bad_delta", 0.04), "good": settings.get("good_delta", -0.001)},
        allow_numbers=False,
        **codec_settings(settings),
    )
    raise_at = settings.get("raise_at", 0.5)
    clear_at = settings.get("clear_at", 0.25)
    emit_scores = settings.get("emit_scores", "crossings")
    latch_capacity = settings.get("latch_capacity", 100_000)
    sweep_interval_ms = settings.get("sweep_interval_ms", 10_000)

    def make_operator(partition: int) -> FeedbackScoreOperator:
        return FeedbackScoreOperator(
            operator_id=operator_id, source_topic=source, partition=partition, sketch=sketch,
            codec=codec, raise_at=raise_at, clear_at=clear_at, latch_capacity=latch_capacity,
            emit_scores=emit_scores, sweep_interval_ms=sweep_interval_ms, **common,
        )

    return Topology(
        name=settings.get("app_name", "abuse-scores"),
        source_topic=source,
        make_operator=make_operator,
        outputs={
            "alerts": settings.get("alerts_topic", "abuse-alerts"),
            "scores": settings.get("scores_topic", "abuse-scores"),
            "dead_letters": settings.get("dead_letter_topic", "abuse-dead-letters"),
        },
        snapshot_topic=settings.get("snapshot_topic", "abuse-scores-snapshots"),
        checkpoint_interval_s=settings.get("checkpoint_interval_s", 5.0),
        restore_fallback=settings.get("restore_fallback", "replay"),
        description="FAIR-style abuse scores with alerts",
    )
