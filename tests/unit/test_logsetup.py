"""Repeated log lines are collapsed; JSON lines on request."""
from __future__ import annotations

import json
import logging

from grudge_stream import logsetup


def test_repeats_are_collapsed_and_counted(monkeypatch) -> None:
    now = [100.0]
    monkeypatch.setattr(logsetup.time, "monotonic", lambda: now[0])
    f = logsetup.RepeatFilter(interval_s=10)
    rec = lambda i: logging.LogRecord("aiokafka", logging.ERROR, "x", 1, "Unable connect to node %s: %s",  # noqa: E731
                                      (1, i), None)
    passed = []
    for i in range(500):
        r = rec(i)
        if f.filter(r):
            passed.append(r.getMessage())
        now[0] += 0.05  # 20 a second for 25 s
    assert len(passed) == 3
    assert passed[1].endswith(" more like this in the last 10 s]") and "[and 19" in passed[1] or "[and 200" in passed[1]
    other = logging.LogRecord("grudge", logging.INFO, "x", 1, "restored %s", ("p0",), None)
    assert f.filter(other)  # another template passes at once


def test_json_lines() -> None:
    r = logging.LogRecord("grudge_stream.batch", logging.WARNING, "x", 1, "lag %d", (5,), None)
    body = json.loads(logsetup.JsonFormatter().format(r))
    assert body["level"] == "WARNING" and body["message"] == "lag 5" and body["logger"] == "grudge_stream.batch"


def test_own_lines_per_partition_all_pass() -> None:
    f = logsetup.RepeatFilter(interval_s=10)
    recs = [logging.LogRecord("grudge_stream.partitions", logging.INFO, "x", 1, "restored %s[%d] mode=%s",
                              ("t", p, "snapshot"), None) for p in range(8)]
    assert all(f.filter(r) for r in recs)
    again = logging.LogRecord("grudge_stream.partitions", logging.INFO, "x", 1, "restored %s[%d] mode=%s",
                              ("t", 0, "snapshot"), None)
    assert not f.filter(again)
