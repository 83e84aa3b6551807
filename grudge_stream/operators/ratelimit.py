"""Rate limiting: one allow/deny decision per request, from a token bucket per key.

Each event is a request of ``cost`` (default 1) by a key. The token-bucket
recipe (``grudge_stream.recipes.TokenBucket``: linear refill at ``rate_per_s``,
capacity ``burst``) decides on event time, and the operator emits one
``decisions`` record per request: ``allowed``, and for a denial the exact
``retry_after_ms`` after which the same request would be admitted (linear
refill makes it closed-form; ``null`` when the cost exceeds the burst and can
never be admitted).

Every request gets a decision or a dead letter. A request without a cost field
costs ``default_cost`` (1); a cost that is present but not a non-negative finite
number (``null``, a string, NaN) is a dead letter. The decision echoes the
request's id as ``request_id``: the record header ``request_id_header``
(``request-id``) when present, else the JSON field ``request_id_field``
(``request_id``: a string or an integer; another type is a dead letter), else
``null``. An id that is not UTF-8 text travels as ``request_id_b64``, one over
``MAX_REQUEST_ID_BYTES`` as ``request_id_sha256`` and ``request_id_bytes``.
Each decision carries its output ``id`` (docs/runtime.md, "Output ids").
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
from typing import Any, Callable, Mapping

from grudge_stream.exceptions import ConfigError, MismatchError
from grudge_stream.operators.base import Operator
from grudge_stream.operators.codec import BadRecord, Event, EventCodec
from grudge_stream.operators.records import (
    OutputRecord,
    RateDecision,
    RequestId,
    Source,
    SourceRecord,
    output_id,
)
from grudge_stream.recipes import TokenBucket, TokenBucketConfig

_NO_REQUEST_ID = RequestId(None)
_BUCKET_FIELDS = frozenset(f.name for f in dataclasses.fields(TokenBucketConfig))

# Request ids longer than this are echoed as their SHA-256 and length, not as themselves:
# a decision stays small whatever a client sends.
MAX_REQUEST_ID_BYTES = 1024


@dataclasses.dataclass(frozen=True)
class RequestCodec(EventCodec):
    """An ``EventCodec`` whose value is ``(cost, request id from the JSON field)``: a missing
    cost field is ``default_value``, a present but invalid one a BadRecord."""

    numeric_values = False  # (cost, request id)

    default_value: float = 1.0
    request_id_field: str | None = "request_id"

    @classmethod
    def of(cls, codec: EventCodec, default_value: float, request_id_field: str | None) -> "RequestCodec":
        fields = {f.name: getattr(codec, f.name) for f in dataclasses.fields(EventCodec) if f.init}
        return cls(**fields, default_value=float(default_value), request_id_field=request_id_field)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "default_value": self.default_value,
                "request_id_field": self.request_id_field}

    def _value(self, obj: dict) -> Any:  # type: ignore[override]
        cost = super()._value(obj) if self.value_field is None or self.value_field in obj else self.default_value
        rid = obj.get(self.request_id_field) if self.request_id_field else None
        if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int))):
            raise BadRecord(f"request id field {self.request_id_field!r} must be a string or an integer, "
                            f"got {type(rid).__name__}")
        return (cost, rid)


def request_id_of(rid: Any) -> RequestId:
    """The decision's ``RequestId`` for an id from a header (bytes) or a field."""
    if rid is None or isinstance(rid, int):
        return RequestId(rid)
    raw = rid.encode("utf-8") if isinstance(rid, str) else bytes(rid)
    if len(raw) > MAX_REQUEST_ID_BYTES:
        return RequestId(None, request_id_sha256=hashlib.sha256(raw).hexdigest(), request_id_bytes=len(raw))
    if isinstance(rid, str):
        return RequestId(rid)
    try:
        return RequestId(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return RequestId(None, request_id_b64=base64.b64encode(raw).decode("ascii"))


def request_id_fields(rid: Any) -> dict:
    """The decision's ``request_id`` field(s) for an id from a header (bytes) or a field."""
    return request_id_of(rid).body()


class RateLimitOperator(Operator):
    kind = "rate_limit"
    state_keys = ("bucket",)

    def __init__(self, *, operator_id: str, source_topic: str, partition: int,
                 bucket: TokenBucketConfig | Mapping | None = None,
                 codec: EventCodec | None = None, emit: str = "all", default_cost: float = 1.0,
                 request_id_field: str | None = "request_id", request_id_header: str | None = "request-id",
                 **common: Any) -> None:
        """``bucket``: a ``TokenBucketConfig`` (or a dict of its fields). For compatibility its
        fields can instead be given as keyword arguments (``rate_per_s=..., burst=...``)."""
        flat = {k: common.pop(k) for k in list(common) if k in _BUCKET_FIELDS}
        if bucket is not None and flat:
            raise ConfigError(f"give the bucket as bucket= or as keyword arguments, not both ({sorted(flat)})")
        config = TokenBucketConfig.of(bucket if bucket is not None else flat)
        if not (default_cost >= 0 and default_cost != float("inf")):
            raise ConfigError(f"default_cost must be a finite number >= 0, not {default_cost!r}")
        codec = codec or EventCodec(value_field="cost", encoding="json")
        if not (isinstance(codec, RequestCodec) and codec.default_value == default_cost
                and codec.request_id_field == (request_id_field or None)):
            # (A topology passes one RequestCodec to all its partitions: one payload cache.)
            codec = RequestCodec.of(codec, default_cost, request_id_field or None)
        super().__init__(operator_id=operator_id, source_topic=source_topic, partition=partition,
                         codec=codec, **common)
        if emit not in ("all", "denials"):
            raise ConfigError("emit must be 'all' or 'denials'")
        self.default_cost = float(default_cost)
        self.request_id_field = request_id_field or None
        self.request_id_header = request_id_header or None
        # The runtimes read record headers only for operators that ask (a cost per record).
        self.needs_headers = self.request_id_header is not None
        self.bucket_config = config
        self.emit = emit
        self._cls = TokenBucket
        self.bucket = TokenBucket.from_config(config)
        self._keyed(self.bucket.sketch)
        self.counters.update(allowed=0, denied=0)

    def time_scale_ms(self) -> float | None:
        conf = self.bucket_config
        return 1000.0 * conf.burst / conf.rate_per_s if conf.rate_per_s > 0 else None

    def config_dict(self) -> dict:
        return {"bucket": self.bucket_config.to_dict(), "emit": self.emit, "default_cost": self.default_cost,
                "request_id_field": self.request_id_field, "request_id_header": self.request_id_header}

    def validate_event(self, ev: Event) -> None:
        cost = ev.value[0]
        if cost < 0:
            raise BadRecord(f"cost must be >= 0, got {cost!r}")

    def apply(self, ev: Event, rec: SourceRecord, now_ms: int, late_ms: int,
              out: list[OutputRecord]) -> None:
        cost, rid = ev.value
        table = self.overrides
        action = table.action(ev.key, now_ms) if table is not None and len(table) else None
        if action is None:
            d = self.bucket.allow(ev.key, cost, now_ms=now_ms)
            allowed, retry = d.allowed, (0 if d.allowed else d.retry_after_ms)
        else:
            # An override decides before the bucket, and spends no tokens: allow admits,
            # deny refuses until the entry expires (retry_after_ms null: until cleared).
            allowed = action == "allow"
            exp = table.get(ev.key).expires_ms
            retry = 0 if allowed else (None if exp is None else max(0, exp - now_ms))
        self.counters["allowed" if allowed else "denied"] += 1
        self.result = (allowed, retry)
        if allowed and self.emit == "denials":
            return
        headers = getattr(rec, "headers", None)
        if headers and self.request_id_header is not None:
            for name, hv in headers:
                if name == self.request_id_header and hv is not None:
                    rid = hv  # the header wins over the field
                    break
        decision = RateDecision(output_id(self.operator_id, rec.partition, rec.offset, "decision", ev.key),
                                self.operator_id, ev.key, _NO_REQUEST_ID if rid is None else request_id_of(rid),
                                allowed, retry, cost, now_ms, Source.of(rec), action)
        out.append(decision.output(ev.key))

    def saturation(self) -> list:
        from grudge_stream.operators.saturation import bucket_saturation

        return bucket_saturation(self.bucket.sketch, self.watermark, rate_per_s=self.bucket_config.rate_per_s,
                                 burst=self.bucket_config.burst)

    def state_sections(self) -> list[tuple[str, bytes]]:
        return [("sketch", self.bucket.sketch.to_bytes())]

    def state_sections_taken(self) -> list[tuple[str, bytes | Callable[[], bytes]]]:
        later = getattr(self.bucket.sketch, "to_bytes_later", None)
        return [("sketch", later())] if later is not None else list(self.state_sections())

    def load_sections(self, sections: dict, scalars: dict) -> None:
        from grudge_stream import ScoreSketch

        sketch = self._keyed(ScoreSketch.from_bytes(bytes(sections["sketch"])))
        if sketch.config != self.bucket.sketch.config:
            raise MismatchError("token-bucket sketch was written under another configuration")
        self.bucket = self._cls.from_sketch(sketch, burst=self.bucket_config.burst,
                                            reject_penalty=self.bucket_config.reject_penalty)

    def memory_bytes(self) -> int:
        return self.bucket.memory_bytes()

    def sketch_bytes(self) -> bytes:
        return self.bucket.sketch.to_bytes()

    def describe_key(self, key: bytes, debug: bool = False) -> dict:
        """The key's bucket level (tokens spent, refilled to the watermark) and the tokens
        left, read without writing (a live query, grudge_stream.serving); ``debug`` adds the
        per-level reads and cell indexes (``detail``: they reveal the key's cells)."""
        from grudge_stream.operators.describe import score_detail

        detail = score_detail(self.bucket.sketch, key, self.watermark, debug)
        level = detail.pop("score")
        burst = self.bucket_config.burst
        out = {"kind": self.kind, "score": level, "level": level, "burst": burst,
               "tokens_available": max(0.0, burst - level)}
        if debug:
            out["detail"] = detail
        return out
