"""The embedding API (grudge_stream.state, grudge_stream.faust) without a broker: arguments,
refusals that change nothing, and per-event application equal to the record path."""
from __future__ import annotations

import json
import math
import tracemalloc

import faust
import pytest

from grudge_stream import faust as grudge
from grudge_stream.exceptions import ConfigError
from grudge_stream.hashkey import HashKey
from grudge_stream.operators.records import SourceRecord
from grudge_stream.settings import Settings
from grudge_stream.sketches.bloom_config import BloomConfig
from grudge_stream.sketches.countmin_config import CountMinConfig
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
from grudge_stream.state import (
    ForgettingSetState,
    HeavyHitterState,
    RateLimitState,
    ScoreState,
    StateNotReady,
)
from grudge_stream.topology import load_topology

KEY = HashKey.parse("00112233445566778899aabbccddeeff")
SKETCH = ScoreSketchConfig(levels=4, cells_per_level=1000, decay=Exponential(0.01), lo=0.0, hi=1.0,
                           aggregator="min", hasher="siphash")


def score_state(name="abuse", **kw) -> ScoreState:
    return ScoreState(name, source_topic="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY, **kw)


def test_names_and_topics_are_derived_from_the_state_name():
    s = score_state()
    assert s.operator_id == "abuse"
    assert s.snapshot_topic == "abuse-snapshots"
    assert s.outputs == {"alerts": "abuse-alerts", "alert_state": "abuse-alerts-state",
                         "dead_letters": "abuse-dead-letters"}
    s2 = score_state("b", alerts_topic="x-alerts", snapshot_topic="x-snaps", dead_letter_topic="x-dl")
    assert s2.outputs["alerts"] == "x-alerts" and s2.outputs["alert_state"] == "x-alerts-state"
    assert s2.snapshot_topic == "x-snaps" and s2.outputs["dead_letters"] == "x-dl"


def test_public_keys_need_a_secret_key():
    with pytest.raises(ConfigError, match="hash_key"):
        ScoreState("a", source_topic="t", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=None)
    with pytest.raises(TypeError, match="hash_key"):
        ScoreState("a", source_topic="t", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key="00" * 16)
    ScoreState("a", source_topic="t", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=None, public_keys=False)


@pytest.mark.parametrize("kw, match", [
    (dict(name=""), "name"),
    (dict(source_topic=""), "source_topic"),
    (dict(checkpoint_interval_s=0), "checkpoint_interval_s"),
    (dict(raise_at=0.1, clear_at=0.2), "clear_at"),
])
def test_bad_arguments_are_refused_naming_them(kw, match):
    args = dict(name="a", source_topic="t", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY)
    args.update(kw)
    name = args.pop("name")
    with pytest.raises((ValueError, ConfigError), match=match):
        ScoreState(name, **args)


def test_use_before_start_says_so():
    s = score_state()
    with pytest.raises(StateNotReady, match="not started"):
        s.update(b"k", 0.1, partition=0, offset=0, timestamp_ms=1000)
    with pytest.raises(StateNotReady):
        s.assign([0])


def test_position_arguments_go_together():
    s = score_state()
    with pytest.raises(TypeError, match="outside a Faust agent"):
        s.update(b"k", 0.1)
    with pytest.raises(TypeError, match="together"):
        s.update(b"k", 0.1, partition=0)
    with pytest.raises(TypeError, match="offset"):
        s.update(b"k", 0.1, partition=0, offset="1", timestamp_ms=5)
    with pytest.raises(ValueError, match="partition"):
        s.update(b"k", 0.1, partition=-1, offset=1, timestamp_ms=5)


class _Core:
    """A core holding operators without a broker (what SketchState reads of one)."""

    def __init__(self, state, partitions):
        from types import SimpleNamespace

        from grudge_stream.partitions import PartitionSlot, RestoreOutcome

        self.slots = {p: PartitionSlot(state.topology, p, RestoreOutcome(state.topology.make_operator(p), None,
                                                                         "fresh", 0.0), 4)
                      for p in partitions}
        self.partition_slots = SimpleNamespace(slots=self.slots)
        self.published = []
        self.publisher = SimpleNamespace(publish=self.published.extend)


def started(state, partitions=(0, 1)):
    state.core = _Core(state, partitions)
    return state


def test_a_bad_key_or_value_changes_nothing():
    s = started(score_state())
    op = s.operator(0)
    s.update(b"k", 0.1, partition=0, offset=0, timestamp_ms=1000)
    before = op.snapshot()
    for key, value, exc, match in [(123, 0.1, TypeError, "key"), (None, 0.1, TypeError, "key"),
                                   (b"k", math.nan, ValueError, "finite"), (b"k", "x", ValueError, "number"),
                                   (b"", 0.1, ValueError, "empty"), (b"k", True, ValueError, "number")]:
        with pytest.raises(exc, match=match):
            s.update(key, value, partition=0, offset=1, timestamp_ms=2000)
    assert op.snapshot() == before and op.next_offset == 1


def test_a_partition_not_held_is_not_ready():
    s = started(score_state(), partitions=(0,))
    with pytest.raises(StateNotReady, match="partition 3"):
        s.update(b"k", 0.1, partition=3, offset=0, timestamp_ms=1000)


def test_update_returns_scores_raises_and_skips_what_a_snapshot_covers():
    s = started(score_state())
    scores = [s.update(b"eve", 0.2, partition=0, offset=i, timestamp_ms=1000 + i) for i in range(4)]
    assert scores[0] == pytest.approx(0.2, rel=1e-3) and scores[-1] > 0.5
    assert s.raised(b"eve", 0) and s.score("eve", 0) == pytest.approx(scores[-1])
    alerts = [json.loads(o.value) for o in s.core.published if o.role == "alerts"]
    assert [a["state"] for a in alerts] == ["raised"]
    assert s.update(b"eve", 0.2, partition=0, offset=2, timestamp_ms=2000) is None  # already reflected


def test_per_event_application_equals_the_record_path():
    """The same events through ``update`` and through the operator's JSON record path give
    byte-identical state and the same alerts."""
    s = started(score_state())
    ref = s.topology.make_operator(0)
    recs, t = [], 1_000_000
    for i in range(3000):
        t += i % 7
        key = f"user-{i % 37}".encode() if i % 5 else b"eve"
        delta = 0.05 if key == b"eve" or i % 11 == 0 else -0.001
        s.update(key, delta, partition=0, offset=i, timestamp_ms=t if i % 13 else t - 500)  # some late
        recs.append(SourceRecord("logins", 0, i, t if i % 13 else t - 500, key, json.dumps({"delta": delta}).encode()))
    out = ref.process(recs)
    assert s.operator(0).snapshot() == ref.snapshot()
    assert [o.value for o in s.core.published] == [o.value for o in out]


def _traffic(n=4000, partitions=2):
    """(key, delta, partition, offset, timestamp) in an order a consumer hands them: the
    partitions interleaved, each in offset order, some events late, an abuser raised."""
    t, offsets, out = 1_000_000, [0] * partitions, []
    for i in range(n):
        t += i % 7
        key = f"user-{i % 37}".encode() if i % 5 else b"eve"
        p = (i // 3) % partitions
        delta = 0.05 if key == b"eve" or i % 11 == 0 else -0.001
        out.append((key, delta, p, offsets[p], t if i % 13 else t - 500))
        offsets[p] += 1
    return out


@pytest.mark.parametrize("score_mode", ["split", "single"])
def test_the_batch_form_equals_the_per_event_calls_and_the_record_path(score_mode):
    events = _traffic()
    one, batch = started(score_state(score_mode=score_mode)), started(score_state(score_mode=score_mode))
    for key, delta, p, o, t in events:
        one.update(key, delta, partition=p, offset=o, timestamp_ms=t)
    applied = 0
    for a in range(0, len(events), 500):  # a loop's consume() batches
        ks, ds, ps, os_, ts = zip(*events[a:a + 500])
        applied += batch.update_many(list(ks), list(ds), partitions=list(ps), offsets=list(os_), timestamps_ms=list(ts))
    assert applied == sum(one.operator(p).counters["events"] for p in (0, 1))
    ref_out = []
    for p in (0, 1):
        ref = one.topology.make_operator(p)
        ref_out += ref.process([SourceRecord("logins", p, o, t, k, json.dumps({"delta": d}).encode())
                                for k, d, q, o, t in events if q == p])
        assert batch.operator(p).snapshot() == one.operator(p).snapshot() == ref.snapshot()
    values = sorted(o.value or b"" for o in ref_out)
    assert sorted(o.value or b"" for o in batch.core.published) == values
    assert sorted(o.value or b"" for o in one.core.published) == values
    assert any(o.role == "alerts" for o in batch.core.published)
    # Again: every event below the partitions' positions now, so nothing is applied twice.
    ks, ds, ps, os_, ts = zip(*events[:500])
    assert batch.update_many(list(ks), list(ds), partitions=list(ps), offsets=list(os_), timestamps_ms=list(ts)) == 0


def test_the_batch_form_refuses_bad_columns_and_changes_nothing():
    s = started(score_state())
    s.update_many([b"k"], [0.1], partitions=[0], offsets=[0], timestamps_ms=[1000])
    before = {p: s.operator(p).snapshot() for p in (0, 1)}
    good = dict(partitions=[0, 1], offsets=[1, 1], timestamps_ms=[2000, 2000])
    for keys, deltas, kw, exc, match in [
        ([b"k", 5], [0.1, 0.1], good, TypeError, "key"),
        ([b"k", b"j"], [0.1, math.inf], good, ValueError, r"values\[1\] is not finite"),
        ([b"k", b"j"], [0.1, "x"], good, TypeError, "values must be a column of numbers"),
        ([b"k", b"j"], [True, False], good, TypeError, "numbers"),
        ([b"k", b""], [0.1, 0.1], good, ValueError, r"keys\[1\]: empty key"),
        ([b"k"], [0.1, 0.1], good, ValueError, "as long as"),
        ([b"k", b"j"], [0.1, 0.1], dict(good, partitions=[0, 3]), StateNotReady, "partition 3"),
        ([b"k", b"j"], [0.1, 0.1], dict(good, partitions=[0, 0], offsets=[2, 2]), ValueError, "must increase"),
        ([b"k", b"j"], [0.1, 0.1], dict(good, timestamps_ms=[2000, -1]), ValueError, r"timestamps_ms\[1\]"),
        ([b"k", b"j"], [0.1, 0.1], dict(good, offsets=[1.0, 2.0]), TypeError, "offsets must be a column of ints"),
    ]:
        with pytest.raises(exc, match=match):
            s.update_many(keys, deltas, **kw)
    assert {p: s.operator(p).snapshot() for p in (0, 1)} == before
    assert s.operator(0).next_offset == 1 and s.operator(1).next_offset is None


def test_the_batch_form_over_messages():
    class Message:
        def __init__(self, topic, key, p, o, t):
            self._v = (topic, key, p, o, t)

        def topic(self):
            return self._v[0]

        def key(self):
            return self._v[1]

        def partition(self):
            return self._v[2]

        def offset(self):
            return self._v[3]

        def timestamp(self):
            return (1, self._v[4])

    events = _traffic(600)
    a, b = started(score_state()), started(score_state())
    a.update_messages([Message("logins", k, p, o, t) for k, _d, p, o, t in events], [e[1] for e in events])
    b.update_many([e[0] for e in events], [e[1] for e in events], partitions=[e[2] for e in events],
                  offsets=[e[3] for e in events], timestamps_ms=[e[4] for e in events])
    assert all(a.operator(p).snapshot() == b.operator(p).snapshot() for p in (0, 1))
    with pytest.raises(ValueError, match="other topics"):
        a.update_messages([Message("other", b"k", 0, 10_000, 1)], [0.1])


def test_a_hash_key_needs_the_siphash_hasher():
    with pytest.raises(ConfigError, match="siphash"):
        HeavyHitterState("hh", source_topic="t", hash_key=KEY, raise_at=50, clear_at=10,
                         sketch=CountMinConfig(depth=4, width=512, epoch_ms=60_000))


def test_other_kinds():
    rl = started(RateLimitState("rl", source_topic="t", hash_key=KEY, bucket={"rate_per_s": 1.0, "burst": 2.0}))
    got = [rl.try_update("u", partition=0, offset=i, timestamp_ms=10_000) for i in range(3)]
    assert got[0] == (True, 0) and got[1] == (True, 0) and got[2][0] is False and got[2][1] > 0
    hh = started(HeavyHitterState("hh", source_topic="t", hash_key=KEY, raise_at=50, clear_at=10, top_k=3,
                                  sketch=CountMinConfig(depth=4, width=512, epoch_ms=60_000, hasher="siphash")))
    for i in range(60):
        assert hh.add(b"big", partition=1, offset=i, timestamp_ms=5000) == i + 1
    with pytest.raises(TypeError, match="count"):
        hh.add(b"big", 1.5, partition=1, offset=99, timestamp_ms=5000)
    assert hh.top(1)[0] == (b"big", 60)
    assert any(o.role == "alerts" for o in hh.core.published)
    fs = started(ForgettingSetState("fs", source_topic="t", hash_key=KEY,
                                    bloom=BloomConfig(capacity=1000, fp_rate=0.01, period_ms=60_000, hasher="siphash")))
    assert fs.add_if_absent(b"a", partition=0, offset=0, timestamp_ms=1) is True
    assert fs.add_if_absent(b"a", partition=0, offset=1, timestamp_ms=2) is False
    assert fs.contains(b"a", 0)


def test_faust_attach_refuses_a_second_state_of_one_name():
    app = faust.App("embedding-unit", broker="kafka://127.0.0.1:1")
    first = grudge.scores(app, "abuse", source=app.topic("logins"), sketch=SKETCH, raise_at=0.5, clear_at=0.25,
                          hash_key=KEY)
    with pytest.raises(ValueError, match="name: a sketch state named 'abuse'"):
        grudge.scores(app, "abuse", source="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY)
    assert list(app.grudge_states.states.values()) == [first]
    with pytest.raises(TypeError, match="source"):
        grudge.scores(app, "other", source=app.topic("a", "b"), sketch=SKETCH, raise_at=0.5, clear_at=0.25,
                      hash_key=KEY)
    # Outside an agent, a per-event call needs its coordinates.
    with pytest.raises(TypeError, match="outside a Faust agent"):
        first.update(b"k", 0.1)


def test_faust_attach_after_start_is_refused():
    app = faust.App("embedding-unit-2", broker="kafka://127.0.0.1:1")
    app.consumer  # noqa: B018 - what starting the app creates
    with pytest.raises(RuntimeError, match="before it starts"):
        grudge.scores(app, "abuse", source="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY)


def test_messages_faust_skips_unprocessed_do_not_move_the_acked_position():
    """Faust's streams skip, and still ack, a message that arrives while a rebalance runs
    (flow suspended) or that was fetched before the last rebalance (an older generation):
    no agent applied it to the state, so a snapshot must not claim it."""
    from faust.types import TP
    from faust.types.tuples import Message

    app = faust.App("embedding-unit-acks", broker="kafka://127.0.0.1:1")
    grudge.scores(app, "abuse", source="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY)
    consumer = app.consumer
    app.topics._acking_topics.update({"logins", "other"})
    tp, other = TP("logins", 0), TP("other", 0)
    consumer._committed_offset[tp] = consumer._committed_offset[other] = 10

    def message(topic: str, offset: int, generation: int) -> Message:
        return Message(topic, 0, offset, 0.0, 0, None, b"k", b"v", None, generation_id=generation)

    app.consumer_generation_id = 3
    app.flow_control.suspend()  # a rebalance runs
    assert consumer.ack(message("logins", 10, 3)) is False
    assert consumer.grudge_acked_position(tp) == 10
    assert consumer.ack(message("other", 10, 3)) is True  # other topics: as Faust has it
    app.flow_control.resume()
    assert consumer.ack(message("logins", 10, 2)) is False  # fetched before the rebalance
    assert consumer.grudge_acked_position(tp) == 10
    assert consumer.ack(message("logins", 10, 3)) is True  # fetched again, processed
    assert consumer.ack(message("logins", 11, 3)) is True
    assert consumer.grudge_acked_position(tp) == 12


def test_resuming_a_running_flow_drops_no_queued_event():
    """Faust's Table recovery resumes a running flow after it seeks the source partitions;
    Faust's resume clears every agent's queue, dropping events fetched after the seek, and
    an agent that goes on with the next ones would leave a hole in a state it updates. With
    a state attached, a resume that follows no suspension keeps the queues; one that ends a
    suspension (a rebalance, a stop) still clears them."""
    plain = faust.App("embedding-unit-flow-plain", broker="kafka://127.0.0.1:1")
    app = faust.App("embedding-unit-flow", broker="kafka://127.0.0.1:1")
    grudge.scores(app, "abuse", source="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY)
    for a, kept in ((plain, 0), (app, 2)):
        queue = a.FlowControlQueue(maxsize=10, clear_on_resume=True)
        a.flow_control.resume()
        queue.put_nowait("event 11")
        queue.put_nowait("event 12")
        a.flow_control.resume()  # the flow was running: Faust drops both, a state's app keeps them
        assert queue.qsize() == kept, a.conf.id
        a.flow_control.suspend()
        a.flow_control.resume()  # after a suspension both clear
        assert queue.qsize() == 0 and a.flow_control.is_active()


def test_a_seek_while_tables_recover_restores_nothing(monkeypatch):
    """Faust's fetch loop seeks back when a fetch comes in with the flow stopped, also while
    Table recovery reads the changelogs; the seek that ends the recovery follows. Only a
    seek outside recovery restores the states' partitions."""
    import asyncio

    from faust.transport.consumer import Consumer

    app = faust.App("embedding-unit-recovery-seek", broker="kafka://127.0.0.1:1")
    grudge.scores(app, "abuse", source="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY)
    consumer = app.consumer
    positioned = []

    async def on_positioned(c):
        positioned.append(app.in_recovery)

    monkeypatch.setattr(Consumer, "perform_seek", lambda self: asyncio.sleep(0))
    monkeypatch.setattr(app.grudge_states, "on_positioned", on_positioned)
    for in_recovery in (True, False):
        app.in_recovery = in_recovery
        asyncio.run(consumer.perform_seek())
    assert positioned == [False]


def test_the_committable_offset_never_passes_an_offset_not_acked_yet():
    """Faust's own rule lets the first offset after the committed one be missing (11 and 12
    acked, 10 not: it would commit 13). On a state's topic the position stays until 10 is."""
    from faust.types import TP
    from faust.types.tuples import Message

    app = faust.App("embedding-unit-acks-2", broker="kafka://127.0.0.1:1")
    grudge.scores(app, "abuse", source="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY)
    consumer = app.consumer
    app.topics._acking_topics.add("logins")
    app.flow_control.resume()
    tp = TP("logins", 0)
    consumer._committed_offset[tp] = 10
    gen = app.consumer_generation_id
    for offset in (11, 12):
        assert consumer.ack(Message("logins", 0, offset, 0.0, 0, None, b"k", b"v", None, generation_id=gen))
    assert consumer._new_offset(tp) is None
    assert consumer.grudge_acked_position(tp) == 10
    assert consumer.ack(Message("logins", 0, 10, 0.0, 0, None, b"k", b"v", None, generation_id=gen))
    assert consumer._new_offset(tp) == 13


@pytest.mark.parametrize("name", ["abuse_scores", "rate_limit", "heavy_hitters", "dedup", "known_keys",
                                  "heavy_global"])
def test_reading_a_topology_builds_no_sketch(name, monkeypatch):
    monkeypatch.setenv("GRUDGE_SEED", "00112233445566778899aabbccddeeff")
    topology = load_topology(name, Settings())
    tracemalloc.start()
    try:
        (topology.operator_id, topology.source_topic, dict(topology.outputs), topology.snapshot_topic,
         topology.app_id, topology.needs_headers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100_000


@pytest.mark.parametrize("name,extra", [("abuse_scores", {}), ("rate_limit", {}), ("rate_limit", {"request_id_header": ""}),
                                        ("heavy_hitters", {}), ("dedup", {}), ("known_keys", {}),
                                        ("heavy_global", {})])
def test_a_topology_says_whether_its_operators_read_headers(name, extra, monkeypatch):
    """The runtimes choose columns or header-carrying records from the topology, without
    building an operator; what it says must be what its operators do."""
    monkeypatch.setenv("GRUDGE_SEED", "00112233445566778899aabbccddeeff")
    topology = load_topology(name, Settings(extra))
    assert topology.needs_headers is topology.make_operator(0).needs_headers


def test_a_state_learns_its_runtime_through_one_context_handed_over_at_attach() -> None:
    from grudge_stream.state import StateContext

    state = score_state("ctx")
    assert state.context == StateContext() and state.current_position is None and state.app_group is None
    with pytest.raises(TypeError, match="outside a Faust agent"):
        state.update("k", 1.0)  # no position given and no runtime to ask
    with pytest.raises(AttributeError):
        state.current_position = lambda: (0, 0, 0)  # type: ignore[misc]  # not set from outside
    state.bind_context(StateContext(current_position=lambda: (3, 7, 1_000), app_group="app"))
    assert state.current_position is not None and state.current_position() == (3, 7, 1_000)
    assert state.app_group == "app" and state.restore_on_demand is None
