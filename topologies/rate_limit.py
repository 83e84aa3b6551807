"""Rate limiting: an allow/deny decision per request, per API key, with exact retry-after.

Events (JSON, keyed by the API key or tenant)::

    {"cost": 1, "request_id": "r-81"}   # cost in tokens (field "cost", default_cost when absent)

Each key has a token bucket refilled at ``rate_per_s`` (10) up to ``burst``
(20); a request is allowed iff the bucket holds its cost. Every request gets a
decision on the decisions topic (``{"id": ..., "request_id": "r-81", "allowed":
false, "retry_after_ms": 380, ...}``, the request id from the ``request-id``
header or the ``request_id`` field, null without one) or, when it is malformed,
a dead letter. Keys come from the public: SipHash under a secret ``seed``.

Settings: ``grudge-stream describe rate_limit`` (``SETTINGS`` below, plus the settings
every topology takes, docs/runtime.md).
"""
from __future__ import annotations

from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.ratelimit import RateLimitOperator, RequestCodec
from grudge_stream.recipes import TokenBucketConfig
from grudge_stream.settings import Setting, identity, index_scheme_setting
from grudge_stream.topology import Settings, Topology, codec_settings, operator_settings

S = Setting
SETTINGS = [
    *identity(source="ratelimit-requests", snapshots="ratelimit-snapshots",
              operator_id="rate-limit", dead_letters="ratelimit-dead-letters"),
    index_scheme_setting(),
    S("decisions_topic", "str", "ratelimit-decisions", "one allow/deny decision per request"),
    S("rate_per_s", "float", 10.0, "token refill rate", "tokens/s", min=0, min_inclusive=False, state=True),
    S("burst", "float", 20.0, "bucket capacity", "tokens", min=0, min_inclusive=False, state=True),
    S("reject_penalty", "float", 0.0, "tokens a denied request costs anyway", "tokens", min=0),
    S("levels", "int", 4, "sketch levels (cells per key)", min=1, max=16, state=True),
    S("cells_per_level", "int", 100_000, "sketch cells per level", min=1, state=True),
    S("emit", "choice", "all", "decisions to publish", choices=("all", "denials")),
    S("cost_field", "str", "cost", "JSON field holding a request's cost", state=True),
    S("default_cost", "float", 1.0, "the cost of a request without a cost field (a present but invalid "
      "cost is a dead letter)", "tokens", min=0),
    S("request_id_header", "str", "request-id", "record header echoed as the decision's request_id "
      "(wins over the field; empty: headers are not read)"),
    S("request_id_field", "str", "request_id", "JSON field echoed as request_id when the header is absent "
      "(empty: none)"),
]


def build(settings: Settings) -> Topology:
    source = settings["source_topic"]
    operator_id = settings["operator_id"]
    bucket = TokenBucketConfig(
        rate_per_s=settings["rate_per_s"],
        burst=settings["burst"],
        reject_penalty=settings["reject_penalty"],
        levels=settings["levels"],
        cells_per_level=settings["cells_per_level"],
        hasher="siphash",
        index_scheme=settings["index_scheme"],
    )
    params = dict(
        emit=settings["emit"],
        default_cost=settings["default_cost"],
        request_id_header=settings["request_id_header"] or None,
        request_id_field=settings["request_id_field"] or None,
    )
    common = operator_settings(settings, "rate_limit")
    codec = RequestCodec.of(EventCodec(value_field=settings["cost_field"], **codec_settings(settings)),
                            params["default_cost"], params["request_id_field"])

    def make_operator(partition: int) -> RateLimitOperator:
        return RateLimitOperator(operator_id=operator_id, source_topic=source, partition=partition,
                                 bucket=bucket, codec=codec, **params, **common)

    return Topology(
        operator_id=operator_id,
        needs_headers=params["request_id_header"] is not None,
        name=settings["app_name"] or "rate-limit",
        source_topic=source,
        make_operator=make_operator,
        outputs={
            "decisions": settings["decisions_topic"],
            "dead_letters": settings["dead_letter_topic"],
        },
        snapshot_topic=settings["snapshot_topic"],
        checkpoint_interval_s=settings["checkpoint_interval_s"],
        restore_fallback=settings["restore_fallback"],
        description="token-bucket rate limiting with exact retry-after",
    )
