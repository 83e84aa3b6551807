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


def test_a_worker_refuses_a_group_run_by_the_other_runtime(harness) -> None:
    h = harness(partitions=2)
    h.produce(h.make_events(2000, seed=52))
    batch = h.start_worker(runtime="batch")
    h.wait_caught_up()
    faust = h.start_worker(runtime="faust")
    assert faust.proc.wait(60) == 2
    lines = [ln for ln in faust.log().splitlines() if "grudge-stream worker:" in ln]
    assert len(lines) == 1 and "batch runtime" in lines[0] and "cannot join" in lines[0]
    assert batch.proc.poll() is None
    assert batch.stop() == 0
    # and the other way round
    h.produce(h.make_events(500, seed=53))
    faust = h.start_worker(runtime="faust")
    h.wait_caught_up()
    batch = h.start_worker(runtime="batch")
    assert batch.proc.wait(60) == 2
    assert "faust runtime" in batch.log() and "cannot join" in batch.log()
    assert faust.stop() == 0
