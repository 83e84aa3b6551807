"""More workers than partitions: the member with no partition is ready (it is in the group,
takes over at the next rebalance and forwards score queries), so a Deployment with more
replicas than partitions does not stay NotReady and a rolling update does not stall."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def ready(port: int) -> tuple[int | None, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=3) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except OSError:
        return None, {}


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_a_member_without_partitions_is_ready(harness, runtime: str) -> None:
    h = harness(partitions=1, runtime=runtime, session_timeout_s=10, heartbeat_interval_s=1)
    h.produce(h.make_events(500, seed=3))
    a = h.start_worker()
    h.wait_caught_up(timeout=120)
    b = h.start_worker()
    deadline = time.monotonic() + 90
    answers = {}
    while time.monotonic() < deadline:
        answers = {w.web_port: ready(w.web_port) for w in (a, b)}
        if all(status == 200 for status, _ in answers.values()):
            break
        assert a.proc.poll() is None and b.proc.poll() is None, a.log()[-2000:] + b.log()[-2000:]
        time.sleep(0.5)
    bodies = [body for _, body in answers.values()]
    assert all(status == 200 for status, _ in answers.values()), (answers, b.log()[-3000:])
    # One holds the partition, the other none and says it is idle.
    assert sorted(len(body["assigned"]) for body in bodies) == [0, 1], bodies
    assert [body["idle"] for body in bodies if not body["assigned"]] == [True]
    assert a.stop() == 0 and b.stop() == 0
