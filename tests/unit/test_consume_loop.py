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
