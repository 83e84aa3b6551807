"""Backfill for embedded state, on the real broker (docs/embedding.md, "Backfill").

The app of examples/faust_app runs first as it was before its grudge-stream state was
added (its Table agent counting logins, tests/integration/embedded_app_before_state.py),
over a topic that already holds history and goes on growing. The state is then added
the documented way: ``grudge-stream backfill`` (a first pass while the old app runs, a
second one with it stopped), then the example app, which has the state, starts, and more
traffic comes. Afterwards:

- every partition's snapshot is byte for byte that of an uninterrupted in-process replay
  of the whole topic, and the state's alerts (the backfill's, published on the state's
  own topics with ``--to-live``, and the app's) are the replay's, alert by alert;
- the Table agent counted every record exactly once: no record was handed to the app's
  agents again, and the group's offsets reached the end of the topic.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "faust_app" / "app.py"
BEFORE = Path(__file__).resolve().parent / "embedded_app_before_state.py"
ARGS = ["worker", "-l", "info", "--web-host", "127.0.0.1", "--web-port", "{port}"]


@pytest.fixture
def scenario(embedded):
    return embedded(EXAMPLE, ARGS, table="logins-per-user")


def run_backfill(scenario, *extra: str) -> subprocess.CompletedProcess:
    env = {**scenario.env, "EXAMPLE_DATADIR": str(scenario.tmp / "backfill-data")}
    return subprocess.run([sys.executable, "-m", "grudge_stream.cli", "backfill", str(EXAMPLE),
                           "--state", scenario.state.name, "--value-of", "delta_of", "--quiet", *extra],
                          env=env, cwd=str(scenario.tmp), capture_output=True, text=True, timeout=300)


def wait_committed(scenario, app, timeout: float = 120) -> None:
    """Until the group's offsets reach the end of the source topic."""
    deadline = time.monotonic() + timeout
    while True:
        ends = scenario.end_offsets(scenario.source)
        committed = scenario.committed()
        if all(committed.get(p) == ends[p] for p in ends):
            return
        assert time.monotonic() < deadline, f"not committed: {committed} of {ends}\n{app.log_text()}"
        time.sleep(0.5)


def test_backfill_a_state_added_to_a_running_app(scenario):
    events = scenario.events(30_000, seed=31, abusers=6, users=2000)
    scenario.produce(events[:12_000])
    before = scenario.start("before", BEFORE)  # the app without the state
    wait_committed(scenario, before)

    # While the app runs, a backfill is refused unless it is said to be a first pass.
    refused = run_backfill(scenario)
    assert refused.returncode == 2, refused.stderr
    assert "active member" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr

    feeder = scenario.produce_slowly(events[12_000:18_000], seconds=6)
    first = run_backfill(scenario, "--while-live", "--output", "state", "--to-live")
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert not report["complete"] and report["live_members"] >= 1 and not report["continued"], report
    assert "run it again" in first.stderr
    feeder.join(60)
    wait_committed(scenario, before)
    assert before.stop() == 0, before.log()[-3000:]

    second = run_backfill(scenario, "--output", "state", "--to-live")
    assert second.returncode == 0, second.stderr
    report2 = json.loads(second.stdout)
    assert report2["complete"] and report2["continued"], report2
    assert report2["end"] == {str(p): o for p, o in scenario.committed().items()}, (report2, scenario.committed())
    assert report["records"] + report2["records"] == 18_000, (report, report2)

    after = scenario.start("after")  # the example app: the same app with the state added
    scenario.produce(events[18_000:])
    scenario.wait_done()
    assert after.stop() == 0, after.log()[-3000:]
    res = scenario.check()
    print(f"embedded backfill: {report['records']} + {report2['records']} records backfilled in "
          f"{report['seconds']} + {report2['seconds']} s; {res['alerts']} alerts, "
          f"table counted {res['table_excess']} records twice")
    assert res["raised"] >= 3, res
    assert not res["divergent_state"], (f"snapshots differ from the replay on partitions {res['divergent_state']}; "
                                        f"their snapshots in order: {res['history']}")
    assert not res["lost"], f"alerts lost: {sorted(res['lost'])[:5]}"
    assert not res["extra"], f"alerts no replay emits: {sorted(res['extra'])[:5]}"
    assert not res["differing"], res["differing"][:5]
    # The app's other agent saw each record once: no loss, and no re-delivery.
    assert not res["dropped"], f"the Table agent lost records: {list(res['dropped'].items())[:5]}"
    assert res["table_excess"] == 0, f"the Table agent counted {res['table_excess']} records twice"
    assert res["committed"] == res["ends"], res
    log = after.log()
    assert "restored" in log and "were not applied to the state" not in log, after.log_text()
    assert scenario.view_raised() == res["ref_raised"]
