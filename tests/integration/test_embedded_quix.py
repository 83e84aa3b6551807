"""grudge-stream state inside a Quix Streams application of one's own (examples/quix_app.py),
on the real broker.

The example app has one dataframe over the logins: a ``judge`` step updates a
``ScoreState`` (alerts on crossings) and a ``count`` step counts logins per user in Quix's
own state, writing each new count to ``<app>-login-counts``. The app is killed with
SIGKILL mid-stream and restarted (and, separately, run as two instances that rebalance);
afterwards:

- the grudge state's alerts equal those of an uninterrupted in-process replay of the same
  records, alert by alert (0 lost, 0 divergent; a duplicate carries the same alert_id),
  and every partition's final snapshot is byte-identical to the replay's state;
- Quix's own count lost nothing: each user's last published count is at least the number
  of their logins (more would be Quix's at-least-once, reported, not asserted away), and
  the group's offsets are committed to the end of the topic;
- ``AlertView`` on the state's alert-state topic holds the replay's raised set.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("quixstreams", reason="Quix Streams is not installed: pip install 'grudge-stream[quix]' "
                                          "(make test installs it with the test extras)")

from tests.integration.conftest import EmbeddedScenario  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quix_app.py"


class QuixScenario(EmbeddedScenario):
    """The embedded scenario, with Quix's own per-user count read from the counts topic the
    example writes (the last count of each user is Quix's state for them at the end)."""

    def _load_example(self):
        # Quix looks its topics up on the broker as the module declares them: the test's broker.
        saved = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        os.environ["KAFKA_BOOTSTRAP_SERVERS"] = self.bootstrap
        try:
            return super()._load_example()
        finally:
            if saved is None:
                os.environ.pop("KAFKA_BOOTSTRAP_SERVERS", None)
            else:
                os.environ["KAFKA_BOOTSTRAP_SERVERS"] = saved

    def check(self) -> dict:
        res = super().check()
        truth = Counter(m.key() for m in self.read_all(self.source))
        last: dict[bytes, int] = {}
        for m in self.read_committed(f"{self.app_id}-login-counts"):
            last[m.key()] = json.loads(m.value())
        res["dropped"] = {k: (last.get(k, 0), n) for k, n in truth.items() if last.get(k, 0) < n}
        res["table_excess"] = sum(max(0, last.get(k, 0) - n) for k, n in truth.items())
        return res

    def settled_ends(self, topic: str, timeout: float = 150) -> dict[int, int]:
        """``topic``'s end offsets once no transaction is open on it (its last stable offset
        has reached its high watermark). Under exactly-once Quix gives each process a new
        ``transactional.id``, so the transaction a SIGKILLed instance left open is aborted
        only when it times out (``transaction.timeout.ms``, 60 s by default), and until then
        a read_committed reader sees nothing written after it."""
        from confluent_kafka import Consumer, TopicPartition

        def ends(isolation: str) -> dict[int, int]:
            c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "embedded-wm",
                          "isolation.level": isolation})
            try:
                return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                        for p in range(self.PARTITIONS)}
            finally:
                c.close()

        deadline = time.monotonic() + timeout
        while True:
            stable, high = ends("read_committed"), ends("read_uncommitted")
            if stable == high:
                return high
            assert time.monotonic() < deadline, f"{topic}: a transaction still open: stable {stable}, high {high}"
            time.sleep(1)

    def read_committed(self, topic: str) -> list:
        """Every committed record of ``topic`` in offset order per partition (Quix writes it in
        transactions under exactly-once: aborted ones are left out, and the transaction
        markers take offsets, so the read ends at each partition's end, not at a count)."""
        import uuid

        from confluent_kafka import Consumer, TopicPartition

        ends = self.settled_ends(topic)
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": False, "isolation.level": "read_committed"})
        parts = [p for p in range(self.PARTITIONS) if ends[p]]
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        got, deadline = [], time.monotonic() + 60
        try:
            while True:
                got.extend(m for m in c.consume(1000, timeout=0.5) if not m.error())
                pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in parts])}
                if all(pos[p] >= ends[p] for p in parts):
                    break
                assert time.monotonic() < deadline, f"timed out reading {topic}: at {pos}, ends {ends}"
        finally:
            c.close()
        return sorted(got, key=lambda m: (m.partition(), m.offset()))

    def expected_raised(self) -> set[bytes]:
        """The keys raised at the end, from the alerts (which equal the replay's)."""
        latest: dict[bytes, str] = {}
        for m in sorted(self.read_all(self.state.outputs["alerts"]), key=lambda m: (m.partition(), m.offset())):
            a = json.loads(m.value())
            latest[a["key"].encode()] = a["state"]
        return {k for k, s in latest.items() if s == "raised"}


@pytest.fixture
def scenario(kafka_bootstrap, tmp_path):
    s = QuixScenario(kafka_bootstrap, tmp_path, EXAMPLE, ["--web-port", "{port}"], table=None)
    yield s
    s.close()


def assert_exact(res: dict) -> None:
    assert res["raised"] >= 3, res  # the planted abusers were raised: the test means something
    assert not res["lost"], f"alerts lost: {sorted(res['lost'])[:5]}"
    assert not res["extra"], f"alerts no replay emits: {sorted(res['extra'])[:5]}"
    assert not res["differing"], res["differing"][:5]
    assert not res["divergent_state"], (f"snapshots differ from the replay on partitions {res['divergent_state']}; "
                                        f"their snapshots in order: {res['history']}")
    assert not res["dropped"], f"Quix's own count lost records: {list(res['dropped'].items())[:5]}"
    assert res["committed"] == res["ends"], res


def assert_alert_view(scenario: QuixScenario) -> None:
    from grudge_stream.client import AlertView

    want = scenario.expected_raised()
    with AlertView(scenario.bootstrap, scenario.state.outputs["alert_state"]) as view:
        view.start(timeout_s=30)
        assert set(view.raised()) == want


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_quix_app_kill9_mid_stream_and_restart(scenario, guarantee):
    """Under Quix's exactly-once too: the sketch state is exact either way; its outputs are
    at-least-once with stable alert ids (they are outside Quix's transaction)."""
    t0 = time.monotonic()
    scenario.env["EXAMPLE_GUARANTEE"] = guarantee
    events = scenario.events(30_000, seed=41, abusers=6, users=2000)
    scenario.produce(events[:10_000])
    app = scenario.start("first")
    feeder = scenario.produce_slowly(events[10_000:20_000], seconds=8)
    scenario.wait_snapshot_progress()
    time.sleep(1.0)
    app.kill9()
    feeder.join(60)
    scenario.produce(events[20_000:])
    app = scenario.start("second")
    scenario.wait_done()
    assert app.stop() == 0, app.log()[-3000:]
    res = scenario.check()
    print(f"embedded quix kill -9 ({guarantee}): {res['alerts']} alerts, {len(res['lost'])} lost, "
          f"{len(res['extra']) + len(res['differing'])} divergent; Quix's count counted "
          f"{res['table_excess']} records twice; {time.monotonic() - t0:.1f}s")
    assert_exact(res)
    assert "restored" in app.log()
    assert_alert_view(scenario)


def test_quix_two_instances_rebalance(scenario):
    t0 = time.monotonic()
    events = scenario.events(30_000, seed=43, abusers=6, users=2000)
    scenario.produce(events[:10_000])
    a = scenario.start("a")
    scenario.wait_snapshot_progress()
    feeder = scenario.produce_slowly(events[10_000:20_000], seconds=10)
    b = scenario.start("b")  # joins the group: partitions move to it
    time.sleep(12)
    assert a.stop() == 0, a.log()[-3000:]  # leaves: its partitions move to b
    feeder.join(60)
    scenario.produce(events[20_000:])
    scenario.wait_done()
    assert b.stop() == 0, b.log()[-3000:]
    res = scenario.check()
    print(f"embedded quix rebalance: {res['alerts']} alerts, {len(res['lost'])} lost, "
          f"{len(res['extra']) + len(res['differing'])} divergent; Quix's count counted "
          f"{res['table_excess']} records twice; {time.monotonic() - t0:.1f}s")
    assert_exact(res)
    # Both instances held partitions of the state at some point.
    assert "restored" in a.log() and "restored" in b.log()
    assert_alert_view(scenario)


# -- bad input to the binding (Quix looks topics up on the broker, hence here) --------------

@pytest.fixture
def topics(make_topic):
    return [make_topic(1, suffix="logins"), make_topic(1, suffix="payments")]


@pytest.fixture
def app(kafka_bootstrap, tmp_path):
    from quixstreams import Application

    return Application(broker_address=kafka_bootstrap, consumer_group="bad-input", state_dir=str(tmp_path),
                       loglevel=None)


KEY = "00112233445566778899aabbccddeeff"


def sketch():
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

    return ScoreSketchConfig(levels=2, cells_per_level=500, decay=Exponential(0.01), lo=0.0, hi=1.0,
                             hasher="siphash")


def score_state(topic, name="abuse"):
    from grudge_stream.hashkey import HashKey
    from grudge_stream.state import ScoreState

    return ScoreState(name, source_topic=topic, hash_key=HashKey.parse(KEY), sketch=sketch(), raise_at=0.5,
                      clear_at=0.25)


def test_a_state_declared_twice_under_one_name(app, topics) -> None:
    from grudge_stream import quix as grudge
    from grudge_stream.hashkey import HashKey

    kw = dict(hash_key=HashKey.parse(KEY), sketch=sketch(), raise_at=0.5, clear_at=0.25)
    grudge.scores(app, "abuse", source=app.topic(topics[0]), **kw)
    with pytest.raises(ValueError, match="^name: a sketch state named 'abuse' is already bound"):
        grudge.scores(app, "abuse", source=topics[0], **kw)


def test_a_state_on_a_topic_the_dataframe_does_not_read(app, topics) -> None:
    from grudge_stream import quix as grudge

    bound = grudge.bind(app, score_state(topics[0]))
    sdf = app.dataframe(app.topic(topics[1]))
    with pytest.raises(ValueError) as err:
        bound.update(sdf, lambda v: 0.1)
    assert str(err.value).startswith(f"sdf: state 'abuse' is bound to topic {topics[0]!r}, but this "
                                     f"StreamingDataFrame reads [{topics[1]!r}]"), err.value


def test_steps_check_their_arguments(app, topics) -> None:
    from grudge_stream import quix as grudge
    from grudge_stream.hashkey import HashKey

    bound = grudge.bind(app, score_state(topics[0]))
    sdf = app.dataframe(app.topic(topics[0]))
    with pytest.raises(TypeError, match="^sdf must be a Quix StreamingDataFrame"):
        bound.update(topics[0], lambda v: 0.1)
    with pytest.raises(TypeError, match="^value_of is required"):
        bound.update(sdf)
    with pytest.raises(TypeError, match="^value_of must be callable"):
        bound.update(sdf, 0.1)
    with pytest.raises(TypeError, match="^source must be a topic name"):
        grudge.scores(app, "x", source=3, hash_key=HashKey.parse(KEY), sketch=sketch(), raise_at=0.5,
                      clear_at=0.25)
    with pytest.raises(TypeError, match="^app must be a quixstreams.Application"):
        grudge.bind(object(), score_state(topics[0], "y"))


def test_use_outside_a_running_application(app, topics) -> None:
    from quixstreams.models import MessageContext

    from grudge_stream import quix as grudge
    from grudge_stream.state import StateNotReady

    bound = grudge.bind(app, score_state(topics[0]))
    sdf = app.dataframe(app.topic(topics[0]))
    step = bound._step(sdf, lambda v: 0.1, None)
    with pytest.raises(StateNotReady, match="outside a running Quix application"):
        step(b"x", b"alice", 1_000)
    # With a message context but no running app (sdf.test): the state holds nothing.
    sdf = bound.update(sdf, lambda v: 0.1)
    with pytest.raises(StateNotReady, match="outside a running Quix application"):
        sdf.test(value=b"x", key=b"alice", timestamp=1_000, ctx=MessageContext(topics[0], 0, 0, 1))


def test_apply_and_filter_steps_in_a_running_app(kafka_bootstrap, make_topic, tmp_path) -> None:
    """A rate limiter as a filter and a forgetting set as an apply, chained on one dataframe
    of a running app (``app.run(timeout=...)``): what the steps let through and compute, and
    the states closed with the run."""
    from confluent_kafka import Producer
    from quixstreams import Application

    from grudge_stream import quix as grudge
    from grudge_stream.hashkey import HashKey
    from grudge_stream.sketches.bloom_config import BloomConfig

    topic = make_topic(1)
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i, key in enumerate([b"u", b"u", b"u", b"v", b"u", b"v"]):
        p.produce(topic, key=key, value=b"login", timestamp=now + i)
    p.flush(10)

    app = Application(broker_address=kafka_bootstrap, consumer_group=f"{topic}-g", auto_offset_reset="earliest",
                      state_dir=str(tmp_path / "quix"), loglevel=None)
    src = app.topic(topic, key_deserializer="bytes", value_deserializer="bytes")
    key = HashKey.parse(KEY)
    limiter = grudge.rate_limiter(app, f"{topic}-rl", source=src, bootstrap_servers=kafka_bootstrap, hash_key=key,
                                  bucket={"rate_per_s": 0.001, "burst": 2.0})
    seen = grudge.forgetting_set(app, f"{topic}-seen", source=src, bootstrap_servers=kafka_bootstrap, hash_key=key,
                                 bloom=BloomConfig(capacity=1000, fp_rate=0.01, period_ms=600_000, hasher="siphash"))
    got: list = []
    sdf = app.dataframe(src)
    sdf = limiter.filter(sdf)  # two logins per user get through, the rest are limited
    sdf = seen.apply(sdf)  # the value becomes "first time seen?"
    sdf = sdf.update(lambda value: got.append(value))
    app.run(timeout=8)
    assert got == [True, False, True, False], got  # u, u (3rd u limited), v, v (last u limited)
    assert limiter.state.core is None and seen.state.core is None  # closed with the run
