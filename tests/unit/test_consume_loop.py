"""The one consume loop (grudge_stream.runtime.loop): shapes, errors, counting, stopping."""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from grudge_stream.runtime.loop import COLUMNS, MESSAGES, RECORDS, ConsumeLoop


class Msg:
    def __init__(self, p, o, key=b"k", value=b"v", headers=None, ts=1_000, err=None):
        self._t = (p, o, key, value, headers, ts, err)

    def topic(self):
        return "in"

    def partition(self):
        return self._t[0]

    def offset(self):
        return self._t[1]

    def key(self):
        return self._t[2]

    def value(self):
        return self._t[3]

    def headers(self):
        return self._t[4]

    def timestamp(self):
        return (1, self._t[5])

    def error(self):
        return self._t[6]


class Consumer:
    def __init__(self, batches):
        self.batches = list(batches)
        self.calls = []

    def consume(self, n, timeout):
        self.calls.append((n, timeout))
        return self.batches.pop(0) if self.batches else []


EOF = KafkaError(KafkaError._PARTITION_EOF)
BROKEN = KafkaError(KafkaError._TRANSPORT, "broker gone")


def batch():
    return [Msg(0, 10, b"a", b"1", ts=5), Msg(1, 3, b"b", b"2", headers=[("h", b"x")], ts=6), Msg(0, 11, b"c", b"3", ts=7),
            Msg(1, -1, err=EOF), Msg(2, -1, err=BROKEN)]


def test_columns_by_partition_with_errors_reported_but_a_partition_end():
    errors = []
    loop = ConsumeLoop(Consumer([batch()]), "in", batch_size=500, wait_s=0.25, on_error=errors.append)
    b = loop.read()
    assert b.count == 3 and errors == [BROKEN]
    assert b.groups == {0: ([10, 11], [5, 7], [b"a", b"c"], [b"1", b"3"]), 1: ([3], [6], [b"b"], [b"2"])}
    assert b.offsets(0, COLUMNS) == [10, 11]
    assert loop.consumer.calls == [(500, 0.25)]


def test_records_carry_headers_and_messages_stay_as_consumed():
    recs = ConsumeLoop(Consumer([batch()]), "in", batch_size=10, wait_s=0, shape=RECORDS,
                       on_error=lambda e: None).read()
    assert [(r.offset, r.key) for r in recs.groups[0]] == [(10, b"a"), (11, b"c")]
    assert recs.groups[1][0].headers == [("h", b"x")] and recs.groups[1][0].topic == "in"
    assert recs.offsets(1, RECORDS) == [3]
    msgs = ConsumeLoop(Consumer([batch()]), "in", batch_size=10, wait_s=0, shape=MESSAGES,
                       on_error=lambda e: None).read()
    assert [m.offset() for m in msgs.groups[0]] == [10, 11] and msgs.offsets(1, MESSAGES) == [3]
    assert msgs.count == 3


def test_an_error_the_reader_calls_final_stops_the_loop():
    def final(err):
        raise RuntimeError(err.str())

    with pytest.raises(RuntimeError, match="broker gone"):
        ConsumeLoop(Consumer([batch()]), "in", batch_size=10, wait_s=0, on_error=final).run(lambda b: None,
                                                                                           until=lambda: False)


def test_run_steps_every_read_empty_ones_too_and_beats_before_each_until_told():
    seen, beats = [], []
    consumer = Consumer([[Msg(0, 1)], [], [Msg(0, 2)]])

    def step(b):
        seen.append(b.count)

    ConsumeLoop(consumer, "in", batch_size=10, wait_s=0, beat=lambda: beats.append(1)).run(
        step, until=lambda: len(seen) == 4)
    assert seen == [1, 0, 1, 0] and len(beats) == 4 and len(consumer.calls) == 4


@pytest.mark.parametrize("kw,match", [({"shape": "rows"}, "shape"), ({"batch_size": 0}, "batch_size")])
def test_bad_arguments_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        ConsumeLoop(Consumer([]), "in", **{"batch_size": 1, "wait_s": 0, **kw})


def test_headed_columns_carry_headers_and_timestamp_types():
    from grudge_stream.runtime.loop import HEADED

    b = ConsumeLoop(Consumer([batch()]), "in", batch_size=10, wait_s=0, shape=HEADED, on_error=lambda e: None).read()
    assert b.count == 3
    assert b.groups == {0: ([10, 11], [5, 7], [b"a", b"c"], [b"1", b"3"], [None, None], [1, 1]),
                        1: ([3], [6], [b"b"], [b"2"], [[("h", b"x")]], [1])}
    assert b.offsets(0, HEADED) == [10, 11]


class Fetch:
    """The native kernel's fetcher, faked: hands out the columns it is given, once."""

    closed = False

    def __init__(self, groups, errors=()):
        self.out = (groups, list(errors), sum(len(c[0]) for c in groups.values()))
        self.calls = []

    def fetch(self, n, timeout_ms, headers=False, arrays=False):
        self.calls.append((n, timeout_ms, headers))
        out, self.out = self.out, ({}, [], 0)
        return out


class Backlog:
    """A fetcher with ``ready`` records queued: each call takes what it asks for of them."""

    closed = False

    def __init__(self, ready):
        self.ready, self.next, self.calls = ready, 0, []

    def fetch(self, n, timeout_ms, headers=False, arrays=False):
        self.calls.append((n, timeout_ms))
        k = min(n, self.ready)
        self.ready -= k
        offs = list(range(self.next, self.next + k))
        self.next += k
        return ({0: (offs, [1] * k, [b"k"] * k, [b"v"] * k)} if k else {}), [], k


def _reader(consumer, fetch):
    from grudge_stream.runtime import native

    r = object.__new__(native.NativeReader)
    r.consumer, r.fetch, r.topic, r._eof = consumer, fetch, "in", -191
    return r


def test_the_native_reader_gives_records_and_headed_columns_strays_first():
    from grudge_stream.operators.records import SourceRecord
    from grudge_stream.runtime.loop import HEADED

    headed = {1: ([4, 5], [60, 70], [b"d", None], [b"4", b"5"], [[("t", None)], None], [1, 2])}
    stray = [Msg(1, 3, b"b", b"2", headers=[("h", b"x")], ts=6)]
    fetch = Fetch({p: tuple(list(c) for c in cols) for p, cols in headed.items()})
    loop = ConsumeLoop(Consumer([stray]), "in", batch_size=10, wait_s=0.02, shape=RECORDS,
                       native=_reader(Consumer([stray]), fetch))
    b = loop.read()
    assert fetch.calls == [(9, 0, True)]  # the rest of the batch, no wait: a record came already
    assert b.count == 3
    assert b.groups[1] == [SourceRecord("in", 1, 3, 6, b"b", b"2", [("h", b"x")]),
                           SourceRecord("in", 1, 4, 60, b"d", b"4", [("t", None)]),
                           SourceRecord("in", 1, 5, 70, None, b"5", None)]
    fetch = Fetch({p: tuple(list(c) for c in cols) for p, cols in headed.items()})
    loop = ConsumeLoop(None, "in", batch_size=10, wait_s=0.02, shape=HEADED, native=_reader(Consumer([]), fetch))
    b = loop.read()
    assert fetch.calls == [(10, 20, True)] and b.groups == headed and b.count == 2
    fetch = Fetch({1: ([4], [60], [b"d"], [b"4"])})
    loop = ConsumeLoop(None, "in", batch_size=10, wait_s=0, native=_reader(Consumer([]), fetch))
    assert loop.read().groups == {1: ([4], [60], [b"d"], [b"4"])} and fetch.calls == [(10, 0, False)]


def test_a_backlog_is_read_in_bigger_batches_without_waiting_and_ends_with_a_short_one():
    fetch = Backlog(10 + 40 + 25)
    reader = _reader(Consumer([]), fetch)
    reader.backlog_factor = 4
    loop = ConsumeLoop(None, "in", batch_size=10, wait_s=0.02, native=reader)
    counts = [loop.read().count for _ in range(5)]
    # 10 (a full batch): the next asks 4x without a wait; 40 and 25 (at least batch_size): the
    # backlog goes on; none (fewer than batch_size): back to 10 with the wait.
    assert counts == [10, 40, 25, 0, 0]
    assert fetch.calls == [(10, 20), (40, 0), (40, 0), (40, 0), (10, 20)]
    off = _reader(Consumer([]), Backlog(30))  # factor 1 (the default): batch_size every time
    loop = ConsumeLoop(None, "in", batch_size=10, wait_s=0.02, native=off)
    assert [loop.read().count for _ in range(4)] == [10, 10, 10, 0]
    assert off.fetch.calls == [(10, 20)] * 4


def test_the_native_path_gives_no_messages():
    with pytest.raises(ValueError, match="HEADED"):
        ConsumeLoop(Consumer([]), "in", batch_size=10, wait_s=0, shape=MESSAGES, native=object())


class Recorder:
    """Records each method call, with its owner's name, in a log it shares."""

    def __init__(self, name, log, topic=None):
        self.name, self.log, self.topic = name, log, topic

    def __getattr__(self, method):
        return lambda *args: self.log.append((self.name, method, *args))


def test_split_before_the_assignment_release_after_the_unassignment():
    from confluent_kafka import TopicPartition

    from grudge_stream.runtime import native

    log: list = []
    c, reader = Recorder("consumer", log), Recorder("reader", log, topic="in")
    tps = [TopicPartition("in", 0, 5), TopicPartition("other", 1), TopicPartition("in", 2)]
    native.assign(c, reader, tps, incremental=False)
    native.unassign(c, reader, tps[:1], incremental=True)
    native.assign(c, reader, tps[2:], incremental=True)
    native.unassign(c, reader, tps, incremental=False)
    assert log == [("reader", "split", [0, 2]), ("consumer", "assign", tps),
                   ("consumer", "incremental_unassign", tps[:1]), ("reader", "release", [0]),
                   ("reader", "split", [2]), ("consumer", "incremental_assign", tps[2:]),
                   ("consumer", "unassign"), ("reader", "release", [0, 2])]
    log.clear()
    native.assign(c, None, tps[:1], incremental=False)  # today's path: only the assignment
    assert log == [("consumer", "assign", tps[:1])]
