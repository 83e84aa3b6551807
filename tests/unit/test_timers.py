"""Event-time timers on Operator: armed by the first event, fired once per crossing, kept in snapshots."""
from __future__ import annotations

import pytest

from grudge_stream import ConfigError
from grudge_stream.operators import EventCodec, SourceRecord
from grudge_stream.operators.base import Operator


class Ticks(Operator):
    kind = "ticks"

    def __init__(self, **kw) -> None:
        super().__init__(operator_id="t", source_topic="src", partition=0,
                         codec=EventCodec(encoding="raw"), max_future_ms=None, **kw)
        self.every("tick", 1000)
        self.fired: list[tuple[int, int]] = []
        self.applied: list[int] = []

    def config_dict(self) -> dict:
        return {}

    def on_timer(self, name, now_ms, rec, out) -> None:
        self.fired.append((now_ms, rec.offset))

    def apply(self, ev, rec, now_ms, late_ms, out) -> None:
        self.applied.append(rec.offset)

    def state_sections(self):
        return []

    def load_sections(self, sections, scalars) -> None:
        pass


def recs(times: list[int], start: int = 0) -> list[SourceRecord]:
    return [SourceRecord("src", 0, start + i, t, b"k", b"") for i, t in enumerate(times)]


def test_armed_by_the_first_event_then_fired_once_per_crossing_before_the_event() -> None:
    op = Ticks()
    op.process(recs([500, 900, 1000, 1500, 5200, 5300, 4000, 6000]))
    # 500 arms (due 1000); 1000 fires; a jump to 5200 fires once; a late event (4000) is
    # applied at the watermark 5300 and fires nothing; 6000 fires.
    assert op.fired == [(1000, 2), (5200, 4), (6000, 7)]
    assert op.timers == {"tick": 7000} and op.next_timer() == 7000
    assert op.applied == list(range(8))


def test_due_times_survive_a_snapshot() -> None:
    a = Ticks()
    a.process(recs([500, 1200]))
    b = Ticks()
    b.restore(a.snapshot())
    assert b.timers == {"tick": 2000}
    b.process(recs([1900, 2100], start=2))
    assert b.fired == [(2100, 3)]


def test_intervals_must_be_positive() -> None:
    op = Ticks()
    with pytest.raises(ConfigError, match="tock_interval_ms must be >= 1"):
        op.every("tock", 0)
