"""Which partitions a worker ticks (grudge_stream.runtime.ticks), without a broker."""
from __future__ import annotations

from types import SimpleNamespace

from grudge_stream.runtime.ticks import IdleTicks


class FakeOp:
    def __init__(self, raised: bool) -> None:
        self.next_offset: int | None = 10
        self.raised = raised

    def wants_tick(self) -> bool:
        return self.raised


def ticks(after_s: float) -> tuple[IdleTicks, list[int]]:
    t = IdleTicks("events", after_s, {"bootstrap.servers": "127.0.0.1:1"})
    sent: list[int] = []
    t._send = sent.append  # type: ignore[method-assign]
    return t, sent


def test_only_quiet_partitions_holding_raised_keys_are_ticked_once_per_interval() -> None:
    t, sent = ticks(5.0)
    slots = {0: SimpleNamespace(operator=FakeOp(True)), 1: SimpleNamespace(operator=FakeOp(False)),
             2: SimpleNamespace(operator=FakeOp(True))}
    assert t.check(slots, now=100.0) == []  # first sight: quiet from now on
    slots[2].operator.next_offset = 11  # partition 2 gets a record
    assert t.check(slots, now=103.0) == []
    assert t.check(slots, now=105.5) == [0] and sent == [0]  # 1 wants none; 2 moved at 103
    assert t.check(slots, now=106.0) == []  # looked at most once a second
    assert t.check(slots, now=108.0) == [2]
    assert t.check(slots, now=110.6) == [0]  # again after another interval of quiet
    slots[0].operator.raised = False
    assert t.check(slots, now=120.0) == [2]
    del slots[2]  # revoked: forgotten
    assert t.check(slots, now=130.0) == [] and set(t._seen) == {0, 1}


def test_off_by_default_and_off_for_good_without_write_access() -> None:
    t, sent = ticks(0.0)
    slots = {0: SimpleNamespace(operator=FakeOp(True))}
    assert not t.enabled and t.check(slots, now=0.0) == [] and t.check(slots, now=1000.0) == []
    t, sent = ticks(1.0)
    err = SimpleNamespace(name=lambda: "TOPIC_AUTHORIZATION_FAILED", __str__=lambda self: "denied")
    t._delivered(err, SimpleNamespace(partition=lambda: 0))
    assert not t.enabled and t.off_reason
    t, sent = ticks(1.0)
    t._delivered(None, SimpleNamespace(partition=lambda: 0))
    assert t.enabled and t.sent == 1
