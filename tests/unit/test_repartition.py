"""The repartition plan, field extraction, the stage's batch logic (fake clients) and the
header plumbing into forwarded records."""
from __future__ import annotations

import json

import pytest

from grudge_stream.exceptions import ConfigError
from grudge_stream.liveness import Liveness
from grudge_stream.operators.codec import BadRecord
from grudge_stream.operators.records import SourceRecord
from grudge_stream.repartition import RepartitionPlan, Repartitioner, extract_key, plan
from grudge_stream.replay.runner import group_source_records
from grudge_stream.topology import Settings, load_topology

SEED = {"seed": "00" * 16}


def settings(**kw) -> Settings:
    return Settings({**SEED, **{k: str(v) for k, v in kw.items()}}, environ={})


def test_plan_modes() -> None:
    s = settings()
    assert plan(s, source="in", operator_id="d", key_field=None, dead_letter_topic="dlq") is None
    p = plan(s, source="in", operator_id="d", key_field="id", dead_letter_topic="dlq")
    assert (p.topic, p.group, p.app_id, p.source_topic) == ("grudge-d-in-repartition", "grudge-d-in-repartition",
                                                            "grudge-d-in", "in")
    assert plan(settings(repartition="off"), source="in", operator_id="d", key_field="id",
                dead_letter_topic="dlq") is None
    with pytest.raises(ConfigError, match="needs key_field"):
        plan(settings(repartition="on"), source="in", operator_id="d", key_field=None, dead_letter_topic="dlq")


@pytest.mark.parametrize("name", ["dedup", "known_keys"])
def test_topology_reads_the_repartition_topic_keyed_by_the_field(name) -> None:
    t = load_topology(name, settings(key_field="id", app_id="app", source_topic="in"))
    rp = t.repartition
    assert t.source_topic == rp.topic == "app-repartition" and rp.source_topic == "in" and t.app_id == "app"
    op = t.make_operator(0)
    assert op.source_topic == "app-repartition" and op.codec.key_field is None  # the record key is the id
    plain = load_topology(name, settings(key_field="id", repartition="off", source_topic="in"))
    assert plain.source_topic == "in" and "repartition" not in plain.extra
    assert plain.make_operator(0).codec.key_field == "id"
    assert plain.make_operator(0).fingerprint != op.fingerprint  # keys moved: the state is another one


def test_heavy_hitters_key_field() -> None:
    t = load_topology("heavy_hitters", settings(key_field="ip", encoding="json", source_topic="in"))
    assert t.repartition.key_field == "ip" and t.source_topic.endswith("-repartition")
    with pytest.raises(ConfigError, match="encoding=json"):
        load_topology("heavy_hitters", settings(key_field="ip"))


def test_extract_key() -> None:
    codec = RepartitionPlan("in", "t", "g", "a", "op", "id", "dlq", max_key_bytes=8).codec()
    assert extract_key(codec, b"k", b'{"id":"abc"}', 5) == b"abc"
    assert extract_key(codec, None, b'{"id":42}', 5) == b"42"
    for value, reason in ((b'{"x":1}', "missing key field 'id'"), (b'{"id":true}', "must be a string"),
                          (b"nope", "not JSON"), (None, "tombstone"), (b'{"id":""}', "empty key"),
                          (b'{"id":"123456789"}', "over the limit")):
        with pytest.raises(BadRecord, match=reason):
            extract_key(codec, b"k", value, 5)


def test_extract_key_fast_path_agrees_with_the_codec() -> None:
    """The fast path must give the codec's key, and leave every refusal to the codec."""
    codec = RepartitionPlan("in", "t", "g", "a", "op", "id", "dlq", max_key_bytes=8).codec()
    values = [b'{"id":"abc"}', b'{"id":"\\u00e9t\\u00e9"}', '{"id":"été"}'.encode(), b'{"id":7}', b'{"id":""}',
              b'{"id":"123456789"}', b'\xef\xbb\xbf{"id":"bom"}', '{"id":"u16"}'.encode("utf-16"), b"[1]",
              b'{"id":null}', b'{"id":1.5}', b"\xff\xfe", b"", None, b'{"id":"a","id":"b"}']
    for value in values:
        for ts in (5, -1, 2**53):
            def outcome(f):
                try:
                    return f()
                except BadRecord as exc:
                    return "bad: " + str(exc)
            assert outcome(lambda: extract_key(codec, b"k", value, ts)) == \
                outcome(lambda: codec.decode(b"k", value, ts).key), (value, ts)


def test_dedup_forwards_headers_and_timestamp() -> None:
    t = load_topology("dedup", settings(source_topic="in"))
    op = t.make_operator(0)
    assert op.needs_headers
    h = [("trace", b"abc")]
    out = op.process([SourceRecord("in", 0, 0, 1_000, b"a", b"v1", h), SourceRecord("in", 0, 1, 2_000, b"a", b"v2"),
                      SourceRecord("in", 0, 2, 3_000, b"b", b"v3")], processing_ms=10_000)
    # Plus the output id in grudge-id (docs/runtime.md, "Output ids").
    assert all(o.headers[-1][0] == "grudge-id" for o in out)
    assert [(o.key, o.value, o.headers[:-1] or None, o.timestamp_ms) for o in out] == [(b"a", b"v1", h, 1_000),
                                                                                     (b"b", b"v3", None, 3_000)]


def test_known_keys_check_carries_headers() -> None:
    t = load_topology("known_keys", settings(source_topic="in"))
    op = t.make_operator(0)
    out = op.process([SourceRecord("in", 0, 0, 1_000, b"k", b'{"event":"seen"}', [("trace", b"t1")])],
                     processing_ms=10_000)
    assert [(o.role, o.headers[:-1], o.timestamp_ms) for o in out] == [("checks", [("trace", b"t1")], 1_000)]
    assert out[0].headers[-1] == ("grudge-id", json.loads(out[0].value)["id"].encode())


def test_column_operators_do_not_ask_for_headers() -> None:
    assert not load_topology("abuse_scores", settings()).make_operator(0).needs_headers


class Msg:
    def __init__(self, p, o, key, value, headers=None, ts=1_000, err=None, topic="in"):
        self._t = (topic, p, o, key, value, headers, ts, err)

    def topic(self):
        return self._t[0]

    def partition(self):
        return self._t[1]

    def offset(self):
        return self._t[2]

    def key(self):
        return self._t[3]

    def value(self):
        return self._t[4]

    def headers(self):
        return self._t[5]

    def timestamp(self):
        return (1, self._t[6])

    def error(self):
        return self._t[7]


def test_group_source_records_keeps_headers() -> None:
    groups, errors = group_source_records("in", [Msg(0, 5, b"k", b"v", [("h", b"1")]), Msg(1, 7, b"k2", b"v2"),
                                                 Msg(0, 6, b"k3", b"v3", [])])
    assert errors == []
    assert groups[0] == [SourceRecord("in", 0, 5, 1_000, b"k", b"v", [("h", b"1")]),
                         SourceRecord("in", 0, 6, 1_000, b"k3", b"v3", None)]
    assert groups[1] == [SourceRecord("in", 1, 7, 1_000, b"k2", b"v2", None)]


class FakeConsumer:
    def __init__(self, batches):
        self.batches, self.commits, self.seeks = list(batches), [], []

    def consume(self, n, timeout):
        return self.batches.pop(0) if self.batches else []

    def commit(self, offsets, asynchronous):
        self.commits.append({(tp.partition, tp.offset) for tp in offsets})

    def seek(self, tp):
        self.seeks.append((tp.partition, tp.offset))


class FakeProducer:
    def __init__(self, fail=None):
        self.sent, self.fail = [], fail
        self._pending = []

    def produce(self, topic, key=None, value=None, on_delivery=None, headers=None, timestamp=None):
        self.sent.append((topic, key, value, headers, timestamp))
        self._pending.append((on_delivery, topic))

    def poll(self, t):
        return 0

    def flush(self, t):
        for cb, topic in self._pending:
            cb(self.fail, type("M", (), {"topic": lambda s, t=topic: t})())
        self._pending = []
        return 0

    def __len__(self):
        return len(self._pending)


def stage(consumer, producer) -> Repartitioner:
    rp = plan(settings(), source="in", operator_id="op", key_field="id", dead_letter_topic="dlq")
    live = Liveness(60.0)
    r = Repartitioner(rp, settings(bootstrap_servers="x:1"), liveness=live)
    r.consumer, r.producer = consumer, producer
    return r


def test_stage_rekeys_dead_letters_and_commits_after_delivery() -> None:
    c = FakeConsumer([[Msg(0, 10, b"r1", b'{"id":"a"}', [("h", b"1")], ts=111), Msg(1, 3, b"r2", b"junk"),
                       Msg(0, 11, b"r3", b'{"id":"b"}', ts=222)]])
    p = FakeProducer()
    r = stage(c, p)
    assert r.run_once() == 3
    topic = r.plan.topic
    # By partition, in offset order within each (the consume loop groups a batch).
    assert p.sent[0] == (topic, b"a", b'{"id":"a"}', [("h", b"1")], 111)
    assert p.sent[1] == (topic, b"b", b'{"id":"b"}', None, 222)
    dl = json.loads(p.sent[2][2])
    assert p.sent[2][0] == "dlq" and dl["stage"] == "repartition" and dl["source"]["offset"] == 3
    assert c.commits == [{(0, 12), (1, 4)}]
    assert r.counters["forwarded"] == 2 and r.counters["dead_letters"] == 1


def test_stage_redoes_a_batch_whose_delivery_failed() -> None:
    from confluent_kafka import KafkaError

    c = FakeConsumer([[Msg(0, 10, b"r1", b'{"id":"a"}'), Msg(2, 4, b"r2", b'{"id":"b"}')]])
    r = stage(c, FakeProducer(fail=KafkaError(KafkaError._MSG_TIMED_OUT)))
    r.stopping.wait = lambda t: None  # no back-off pause in a unit test
    assert r.run_once() == 0
    assert c.commits == [] and sorted(c.seeks) == [(0, 10), (2, 4)] and r.counters["retries"] == 1


def test_liveness_watches_parts() -> None:
    now = [0.0]
    main, part = Liveness(10.0, clock=lambda: now[0]), Liveness(5.0, clock=lambda: now[0])
    main.watch("repartition", part)
    now[0] = 6.0
    main.beat()
    status, body = main.status()
    assert status == 503 and not body["parts"]["repartition"]["live"]
    part.beat()
    assert main.status()[0] == 200


class FakeTxnProducer(FakeProducer):
    def __init__(self, fail_commit=None):
        super().__init__()
        self.calls, self.fail_commit = [], fail_commit

    def begin_transaction(self):
        self.calls.append("begin")

    def send_offsets_to_transaction(self, offsets, meta, timeout):
        self.calls.append(("offsets", {(tp.partition, tp.offset) for tp in offsets}))

    def commit_transaction(self, timeout):
        if self.fail_commit is not None:
            from confluent_kafka import KafkaException

            raise KafkaException(self.fail_commit)
        self.calls.append("commit")

    def abort_transaction(self, timeout):
        self.calls.append("abort")


class TxnConsumer(FakeConsumer):
    def consumer_group_metadata(self):
        return object()


def test_stage_exactly_once_commits_offsets_in_the_transaction() -> None:
    from confluent_kafka import KafkaError

    c = TxnConsumer([[Msg(0, 10, b"r1", b'{"id":"a"}'), Msg(1, 2, b"r2", b'{"id":"b"}')],
                     [Msg(0, 11, b"r3", b'{"id":"c"}')]])
    p = FakeTxnProducer()
    r = stage(c, p)
    r.exactly_once = True
    assert r.run_once() == 2
    assert p.calls == ["begin", ("offsets", {(0, 11), (1, 3)}), "commit"] and c.commits == []
    # An abortable failure: the transaction is aborted and the batch read again.
    p.fail_commit = KafkaError(KafkaError._STATE, "abortable")
    r.stopping.wait = lambda t: None
    assert r.run_once() == 0
    assert p.calls[-1] == "abort" and c.seeks == [(0, 11)] and r.counters["forwarded"] == 2


def test_stage_producer_takes_murmur2_random_unless_a_pass_through_overrides_it(monkeypatch) -> None:
    import confluent_kafka

    made: list[dict] = []
    monkeypatch.setattr(confluent_kafka, "Producer", lambda conf: made.append(conf) or FakeProducer())
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda conf: type("C", (), {"subscribe": lambda *a, **k: None})())
    rp = plan(settings(), source="in", operator_id="op", key_field="id", dead_letter_topic="dlq")
    # (client_config: the worker's client properties, pass-through ``kafka.*`` included)
    for extra, want in (({}, "murmur2_random"), ({"partitioner": "consistent_random"}, "consistent_random")):
        r = Repartitioner(rp, settings(bootstrap_servers="x:1"), liveness=Liveness(60.0), client_config=extra)
        r._open()
        assert made[-1]["partitioner"] == want
        assert made[-1]["delivery.report.only.error"] is True and made[-1]["acks"] == "all"


def test_stage_on_the_native_path_produces_what_it_produces_from_messages() -> None:
    """The same batch as headed columns (the native ingest path's shape) and as messages: the
    same records produced, dead letters, commits and counters."""
    from grudge_stream.runtime.loop import Batch

    msgs = [Msg(0, 10, b"r1", b'{"id":"a"}', [("h", b"1"), ("n", None)], ts=111), Msg(1, 3, b"r2", b"junk", ts=5),
            Msg(0, 11, b"r3", b'{"id":"b"}', ts=222)]
    c, p = FakeConsumer([msgs]), FakeProducer()
    r = stage(c, p)
    assert r.run_once() == 3
    headed = {0: ([10, 11], [111, 222], [b"r1", b"r3"], [b'{"id":"a"}', b'{"id":"b"}'],
                  [[("h", b"1"), ("n", None)], None], [1, 1]),
              1: ([3], [5], [b"r2"], [b"junk"], [None], [1])}
    c2, p2 = FakeConsumer([]), FakeProducer()
    r2 = stage(c2, p2)
    r2.native = object()  # a reader: the stage then reads headed columns
    assert r2.handle(Batch(headed, 3, 0.0)) == 3
    assert p2.sent == p.sent and c2.commits == c.commits == [{(0, 12), (1, 4)}]
    assert r2.counters == r.counters
    # The timestamp is set only where the source record has one (type not 0), as before.
    r3 = stage(FakeConsumer([]), FakeProducer())
    r3.native = object()
    r3.handle(Batch({0: ([7], [50], [None], [b'{"id":"z"}'], [None], [0])}, 1, 0.0))
    assert r3.producer.sent == [(r3.plan.topic, b"z", b'{"id":"z"}', None, None)]
