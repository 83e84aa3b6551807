"""Changing settings between runs on the real broker: policy keeps the state, a state-shaping
change is refused with what differs (or rebuilt on request)."""
from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_policy_change_keeps_the_state_and_a_state_change_is_refused(harness) -> None:
    h = harness(partitions=2)
    h.produce(h.make_events(6000, seed=51))
    w = h.start_worker(runtime="batch")
    h.wait_caught_up()
    assert w.stop() == 0
    before = h.final_state()
    # New thresholds, emit mode and sweep interval: the snapshots are adopted as they are.
    w = h.start_worker(runtime="batch", raise_at="0.6", clear_at="0.2", emit_scores="every",
                       sweep_interval_ms="5000", max_key_bytes="256")
    deadline = time.monotonic() + 60
    while w.log().count("restored ") < 2:  # both partitions restored: the worker is running
        assert time.monotonic() < deadline and w.proc.poll() is None, w.log()[-3000:]
        time.sleep(0.3)
    assert w.stop() == 0
    log = w.log()
    assert log.count("mode=snapshot") == 2 and "replaying" not in log, log[-3000:]
    assert h.final_state() == before
    # Another sketch geometry: refused, naming the setting, old and new values and the choices.
    w = h.start_worker(runtime="batch", cells_per_level="4000")
    assert w.proc.wait(60) == 2
    log = w.log()
    assert "cells_per_level: 5000 in the snapshot, 4000 now" in log and "reset_state=true" in log
    assert h.final_state() == before  # nothing was overwritten
