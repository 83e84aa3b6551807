"""Sketch-backed state for your own stream processor: the embedding API.

A ``SketchState`` is what a Faust Table is to a dict: per-key state of one source
topic, split by its partitions, that your code reads and updates per event, and
that grudge-stream snapshots, restores and publishes for you. Unlike a table it
never grows: each partition holds one fixed-size sketch, whatever the number of
keys, and forgets on its own.

Four kinds, one per sketch family:

- ``ScoreState``: decaying feedback scores (``update``), single or split-sign, with
  alerts when a key's score crosses ``raise_at`` (and clears at ``clear_at``);
- ``RateLimitState``: token buckets (``try_update``);
- ``HeavyHitterState``: decayed counts with top-k (``add``, ``top``) and alerts;
- ``ForgettingSetState``: a set that forgets (``add_if_absent``).

Each event is applied at its partition's event time (the watermark), exactly as the
shipped topologies apply records, so a replay of the same events gives the same
state byte for byte. Driving it (docs/embedding.md):

- **Faust**: ``grudge_stream.faust.attach(app, state)`` — restore on assignment,
  snapshots on a timer, on revocation and at shutdown, commits that never pass a
  snapshot; your agents call ``state.update(key, delta)`` and the event's
  partition, offset and timestamp come from the event being processed.
- **Your own loop** (confluent-kafka or any other): ``start()``, ``assign(partitions)``
  in your assignment callback (seek each partition to the offset it returns),
  ``update(..., partition=, offset=, timestamp_ms=)`` per event, ``checkpoint()``
  whenever you want to commit (commit exactly the offsets it returns), ``revoke``,
  ``close``. ``examples/own_loop.py`` is a complete one.

A state added to an app that already ran is filled from its source topic's history first
with ``state.backfill(value_of)`` or ``grudge-stream backfill`` (``grudge_stream.backfill``).

What is guaranteed: a snapshot never covers an output (alert, decision) that was not
delivered; the state a restore rebuilds, once the records after its snapshot are
applied again, is byte-identical to a run that never stopped; events below a
restored snapshot's offset are skipped, so nothing is counted twice.
"""
from __future__ import annotations

from typing import Any, cast

from grudge_stream.hashkey import HashKey
from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.dedup import DedupOperator
from grudge_stream.operators.heavy import HeavyHitterOperator
from grudge_stream.operators.ratelimit import RateLimitOperator
from grudge_stream.operators.scores import FeedbackScoreOperator
from grudge_stream.state_base import SketchState, StateContext, StateNotReady
from grudge_stream.state_checks import check_config, common_args, key_bytes

__all__ = [
    "SketchState", "ScoreState", "RateLimitState", "HeavyHitterState", "ForgettingSetState",
    "StateContext", "StateNotReady",
]


class ScoreState(SketchState[FeedbackScoreOperator]):
    """Decaying feedback scores per key (``ScoreSketch``; ``score_mode="split"``: punishment
    and forgiveness apart, so colliding keys' forgiveness cannot hide an abuser), with an
    alert latch: a key is raised at ``raise_at`` and cleared at ``clear_at``.

    ``update(key, delta)`` adds ``delta`` at the event's time and returns the new score.
    Alerts go to ``alerts_topic`` (and the raised set to ``<alerts_topic>-state``, which
    ``grudge_stream.client.AlertView`` follows); ``scores_topic`` gets score records on
    crossings (``emit_scores``)."""

    kind = "scores"
    backfill_columns = True  # update_many's pipeline

    def __init__(self, name: str, *, source_topic: str, sketch: Any, raise_at: float, clear_at: float,
                 hash_key: HashKey | None, alerts_topic: str | None = None, scores_topic: str | None = None,
                 score_mode: str = "split", emit_scores: str = "crossings", latch_capacity: int | None = None,
                 sweep_interval_ms: int = 10_000, max_future_ms: int | str | None = "auto",
                 max_late_ms: int | str | None = "auto", public_keys: bool = True, **kw: Any) -> None:
        from grudge_stream.operators.alerts import LATCH_CAPACITY
        common = common_args(name, source_topic, hash_key, public_keys, max_future_ms, max_late_ms)
        codec = EventCodec(value_field="delta")
        capacity = LATCH_CAPACITY if latch_capacity is None else latch_capacity

        def make_operator(partition: int) -> FeedbackScoreOperator:
            return FeedbackScoreOperator(operator_id=name, source_topic=source_topic, partition=partition,
                                         sketch=sketch, codec=codec, raise_at=raise_at, clear_at=clear_at,
                                         emit_scores=emit_scores, score_mode=score_mode,
                                         latch_capacity=capacity, sweep_interval_ms=sweep_interval_ms,
                                         **common)

        check_config(make_operator)
        alerts = alerts_topic or f"{name}-alerts"
        super().__init__(name, source_topic=source_topic, make_operator=make_operator, operator_id=name,
                         outputs={"alerts": alerts, "scores": scores_topic}, **kw)

    def update(self, key: Any, delta: float, *, partition: int | None = None, offset: int | None = None,
               timestamp_ms: int | None = None) -> float | None:
        """Add ``delta`` to ``key``'s score at the event's time; the new score (None: the
        event was already reflected, or refused for its time)."""
        if partition is None and offset is None and timestamp_ms is None and self.current_position is not None:
            partition, offset, timestamp_ms = self.current_position()
        core = self.core
        # The common event (bytes key, float delta, int position, in order, no timer due)
        # in as few steps as the sketch allows; any other through ``apply``, the same rules.
        if (core is not None and type(key) is bytes and type(delta) is float and type(partition) is int
                and type(offset) is int and type(timestamp_ms) is int and offset >= 0):
            slot = core.partition_slots.slots.get(partition)
            if slot is not None:
                op = cast(FeedbackScoreOperator, slot.operator)
                out = op.update_in_order(key, delta, offset, timestamp_ms)
                if out is not None:
                    if out:
                        core.publisher.publish(out)
                    return op.result  # type: ignore[no-any-return]
        result = self.apply(key, delta, partition=partition, offset=offset, timestamp_ms=timestamp_ms)
        return None if result is None else float(result)

    def update_many(self, keys: Any, deltas: Any, *, partitions: Any, offsets: Any, timestamps_ms: Any) -> int:
        """The batch form of ``update``: columns of what a loop already has (lists or numpy
        arrays, one entry per event: keys as bytes or str, deltas, partitions, offsets,
        timestamps in ms), applied as the batch worker applies a batch: per partition, one
        pass of the column pipeline (the sketch updated by one call, only the events that can
        change an alert looked at one by one). Each partition's events in offset order; any
        bad entry raises ``TypeError`` / ``ValueError`` naming it, and nothing changes.
        Returns how many events were applied (those below a restored snapshot's offset are
        skipped, those refused for their time dead-lettered); outputs are published once."""
        return self._apply_columns(keys, deltas, partitions, offsets, timestamps_ms)

    def update_messages(self, messages: Any, deltas: Any) -> int:
        """``update_many`` over confluent-kafka ``Message`` objects of the source topic (a
        ``consume()`` batch without its error messages) and one delta per message."""
        if {m.topic() for m in messages} - {self.source_topic}:
            raise ValueError(f"messages of other topics than {self.source_topic!r}")
        return self._apply_columns([m.key() for m in messages], deltas, [m.partition() for m in messages],
                                   [m.offset() for m in messages], [m.timestamp()[1] for m in messages])

    def score(self, key: Any, partition: int) -> float:
        return float(self.describe(key, partition)["score"])

    def raised(self, key: Any, partition: int) -> bool:
        return key_bytes(key) in self.operator(partition).latch


class RateLimitState(SketchState[RateLimitOperator]):
    """Token buckets per key (``TokenBucketConfig``: ``rate_per_s``, ``burst``):
    ``try_update(key, cost)`` spends ``cost`` tokens if the key has them and returns
    ``(allowed, retry_after_ms)``. Decisions go to ``decisions_topic`` if one is given."""

    kind = "rate_limit"

    def __init__(self, name: str, *, source_topic: str, bucket: Any, hash_key: HashKey | None,
                 decisions_topic: str | None = None, emit: str = "all",
                 max_future_ms: int | str | None = "auto", max_late_ms: int | str | None = "auto",
                 public_keys: bool = True, **kw: Any) -> None:
        common = common_args(name, source_topic, hash_key, public_keys, max_future_ms, max_late_ms)
        if kw.get("overrides") and not decisions_topic:
            raise ValueError("overrides: a rate limiter follows <decisions_topic>-overrides; give decisions_topic")
        codec = EventCodec(value_field="cost")

        def make_operator(partition: int) -> RateLimitOperator:
            return RateLimitOperator(operator_id=name, source_topic=source_topic, partition=partition,
                                     bucket=bucket, codec=codec, emit=emit, request_id_field=None,
                                     request_id_header=None, **common)

        check_config(make_operator)
        super().__init__(name, source_topic=source_topic, make_operator=make_operator, operator_id=name,
                         outputs={"decisions": decisions_topic}, **kw)

    def try_update(self, key: Any, cost: float = 1.0, *, partition: int | None = None,
                   offset: int | None = None, timestamp_ms: int | None = None) -> tuple[bool, int | None] | None:
        """Spend ``cost`` tokens of ``key``'s bucket if it has them: ``(allowed,
        retry_after_ms)`` (None: the event was already reflected, or refused for its time)."""
        return cast("tuple[bool, int | None] | None",
                    self.apply(key, cost, partition=partition, offset=offset, timestamp_ms=timestamp_ms))


class HeavyHitterState(SketchState[HeavyHitterOperator]):
    """Decayed counts per key (``DecayingCountMin``, ``CountMinConfig``) with top-k and an
    alert latch on the estimate: ``add(key, count)`` returns the key's estimate."""

    kind = "heavy_hitters"

    def backfill_value(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"count must be an int, not {type(value).__name__}")
        return value

    def __init__(self, name: str, *, source_topic: str, sketch: Any, raise_at: float, clear_at: float,
                 hash_key: HashKey | None, top_k: int = 100, alerts_topic: str | None = None,
                 reports_topic: str | None = None, report_interval_ms: int = 10_000,
                 max_future_ms: int | str | None = "auto", max_late_ms: int | str | None = "auto",
                 public_keys: bool = True, **kw: Any) -> None:
        common = common_args(name, source_topic, hash_key, public_keys, max_future_ms, max_late_ms)
        codec = EventCodec(value_field="count")

        def make_operator(partition: int) -> HeavyHitterOperator:
            return HeavyHitterOperator(operator_id=name, source_topic=source_topic, partition=partition,
                                       sketch=sketch, codec=codec, raise_at=raise_at, clear_at=clear_at,
                                       top_k=top_k, report_interval_ms=report_interval_ms, **common)

        check_config(make_operator)
        super().__init__(name, source_topic=source_topic, make_operator=make_operator, operator_id=name,
                         outputs={"alerts": alerts_topic or f"{name}-alerts", "reports": reports_topic}, **kw)

    def add(self, key: Any, count: int = 1, *, partition: int | None = None, offset: int | None = None,
            timestamp_ms: int | None = None) -> int | None:
        """Count ``key`` ``count`` times at the event's time; its estimate."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an int, not {type(count).__name__}")
        est = self.apply(key, count, partition=partition, offset=offset, timestamp_ms=timestamp_ms)
        return None if est is None else int(est)

    def top(self, partition: int, k: int | None = None) -> list[tuple[bytes, int]]:
        """The partition's heaviest keys at its watermark, heaviest first."""
        op = self.operator(partition)
        if op.watermark is None:
            return []
        return [(key, int(est)) for key, est in op.sketch.top(k or op.top_k, now_ms=op.watermark)]


class ForgettingSetState(SketchState[DedupOperator]):
    """A set that forgets (``ForgettingBloom``, ``BloomConfig``): ``add_if_absent(key)``
    returns True the first time a key is seen inside the window (false positives
    possible: a new key may be taken for a known one, at the configured rate)."""

    kind = "forgetting_set"

    def backfill_value(self, value: Any) -> Any:
        return None  # any value but None adds the key, as add_if_absent

    def __init__(self, name: str, *, source_topic: str, bloom: Any, hash_key: HashKey | None,
                 max_future_ms: int | str | None = "auto", max_late_ms: int | str | None = "auto",
                 public_keys: bool = True, **kw: Any) -> None:
        common = common_args(name, source_topic, hash_key, public_keys, max_future_ms, max_late_ms)
        codec = EventCodec(encoding="raw")

        def make_operator(partition: int) -> DedupOperator:
            return DedupOperator(operator_id=name, source_topic=source_topic, partition=partition,
                                 bloom=bloom, codec=codec, **common)

        check_config(make_operator)
        super().__init__(name, source_topic=source_topic, make_operator=make_operator, operator_id=name,
                         outputs={}, **kw)

    def add_if_absent(self, key: Any, *, partition: int | None = None, offset: int | None = None,
                      timestamp_ms: int | None = None) -> bool | None:
        """Add ``key``; True if it was not in the set (None: the event was already reflected)."""
        result = self.apply(key, None, partition=partition, offset=offset, timestamp_ms=timestamp_ms)
        return None if result is None else bool(result)

    def contains(self, key: Any, partition: int) -> bool:
        return bool(self.describe(key, partition)["seen"])
