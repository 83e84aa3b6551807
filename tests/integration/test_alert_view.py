"""The subscriber library against the real broker: the raised set a view materialises from
the alert state topic equals the one a full replay computes, through worker kill -9 and
subscriber restarts; overrides reach views at once and workers at the key's next event."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from grudge_stream.client import AlertView



def view_of(h, **kw) -> AlertView:
    return AlertView(h.bootstrap, h.topology.outputs["alert_state"], h.topology.overrides_topic, **kw)


def wait_for(pred, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def replay_raised(h, tmp_path) -> set[bytes]:
    """`grudge-stream replay --output jsonl`: the alert state records it emits, last per key."""
    out = tmp_path / f"replay-{time.monotonic_ns()}.jsonl"
    cmd = [sys.executable, "-m", "grudge_stream.cli", "replay", "abuse_scores", "--bootstrap-servers",
           h.bootstrap, "--output", f"jsonl:{out}", "--quiet"]
    for k, v in h.overrides.items():
        if k != "bootstrap_servers":
            cmd += ["--set", f"{k}={v}"]
    # From the test's directory, not the checkout: `-m` must import the installed package.
    subprocess.run(cmd, check=True, capture_output=True, timeout=120, cwd=str(tmp_path))
    last: dict[str, object] = {}
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        if rec["role"] == "alert_state":
            last[rec["key"]] = rec["value"]
    return {k.encode() for k, v in last.items() if v is not None}


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_view_equals_replay_through_kill9_and_subscriber_restarts(harness, tmp_path, runtime) -> None:
    h = harness(partitions=4, latch_capacity=6)  # a small latch: overflow tombstones are exercised too
    events = h.make_events(24_000, seed=5, abusers=12, users=400)
    steps = [events[i:i + 6000] for i in range(0, len(events), 6000)]
    raises: list[bytes] = []
    view = view_of(h, on_raise=lambda k, s: raises.append(k)).start(30)
    worker = h.start_worker(runtime=runtime)
    try:
        for i, chunk in enumerate(steps):
            h.produce(chunk)
            if i == 1:
                time.sleep(1.0)
                worker.kill9()  # outputs re-emitted from the last snapshot on: the state converges
                worker = h.start_worker(runtime=runtime)
            if i == 2:
                view.stop()
                view = view_of(h).start(30)  # a subscriber restart bootstraps from the topic
            h.wait_caught_up(180)
            ref = h.reference()
            expected = set().union(*(set(r["op"].latch.keys()) for r in ref.values()))
            wait_for(lambda: set(view.raised()) == expected, 30,
                     f"step {i}: view {sorted(view.raised())} != replay {sorted(expected)}")
            assert all(view.is_raised(k) for k in expected)
            assert expected, "the workload must raise someone"
        assert replay_raised(h, tmp_path) == set(view.raised())
        assert raises, "on_raise callbacks fired"
    finally:
        view.stop()
        assert worker.stop() == 0, worker.log()[-3000:]


def test_overrides_reach_views_at_once_and_workers_at_the_next_event(harness, tmp_path) -> None:
    h = harness(partitions=2)
    changes: list[tuple[str, bytes, str]] = []
    view = view_of(h, on_raise=lambda k, s: changes.append(("raised", k, s.reason)),
                   on_clear=lambda k, s: changes.append(("cleared", k, s.reason))).start(30)
    worker = h.start_worker(runtime="batch")
    now = int(time.time() * 1000)
    try:
        # An abuser raised by score.
        h.produce([(b"mallory", b'{"outcome":"bad"}', now + i) for i in range(20)])
        wait_for(lambda: view.is_raised("mallory"), 30, "mallory raised by score")

        def override(*args: str) -> str:
            cmd = [sys.executable, "-m", "grudge_stream.cli", "override", "abuse_scores", *args,
                   "--bootstrap-servers", h.bootstrap, "--reason", "test"]
            for k, v in h.overrides.items():
                if k not in ("bootstrap_servers", "seed"):
                    cmd += ["--set", f"{k}={v}"]
            return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60,
                                  cwd=str(tmp_path)).stdout

        # The CLI needs no hash key: a throw-away one names the same topics.
        assert "deny until cleared" in override("deny", "trudy")
        wait_for(lambda: view.is_raised("trudy"), 10, "deny reaches the view without any event")
        assert view.get("trudy").reason == "override:deny"
        override("allow", "mallory", "--for", "8s")
        # The entry's 8 s run from when the CLI wrote it, before it returned (a loaded machine
        # can take seconds to start the CLI): counted from here, the wait below outlasts them.
        t_allow = time.monotonic()
        wait_for(lambda: not view.is_raised("mallory"), 10, "allow clears in the view")
        # The worker acts at the keys' next events once its own follower has read the entries
        # (within a poll; a loaded machine may take longer, so events keep coming): trudy
        # raised, mallory cleared, with the reason.
        def worker_acted() -> bool:
            t = int(time.time() * 1000)
            h.produce([(b"trudy", b'{"outcome":"good"}', t), (b"mallory", b'{"outcome":"bad"}', t)])
            time.sleep(0.5)
            alerts = [json.loads(m.value()) for m in h.read_all(h.topology.outputs["alerts"])]
            return {(a["key"], a["state"], a.get("override")) for a in alerts} >= {
                ("trudy", "raised", "deny"), ("mallory", "cleared", "allow")}
        wait_for(worker_acted, 30, "worker alerts")
        # The allow entry expires after 8 s: mallory is not raised again by itself (the
        # worker tombstoned her alert state), only by new bad events after the expiry.
        time.sleep(max(0.0, t_allow + 8.5 - time.monotonic()))
        assert not view.is_raised("mallory")
        h.produce([(b"mallory", b'{"outcome":"bad"}', int(time.time() * 1000) + i) for i in range(20)])
        wait_for(lambda: view.is_raised("mallory"), 30, "mallory raised again after the allow expired")
        # Clearing the deny leaves trudy as the worker judged it (raised) until its latch
        # looks again: at trudy's next event, where the low score clears it.
        override("clear", "trudy")
        time.sleep(1.0)
        assert view.is_raised("trudy") and view.get("trudy").reason == "score"
        h.produce([(b"trudy", b'{"outcome":"good"}', int(time.time() * 1000))])
        wait_for(lambda: not view.is_raised("trudy"), 30, "trudy cleared by the worker")
        assert ("raised", b"trudy", "override:deny") in changes
        assert ("cleared", b"mallory", "override:allow") in changes and ("cleared", b"trudy", "none") in changes
        # The CLI shows the raised set.
        cmd = [sys.executable, "-m", "grudge_stream.cli", "alerts", "abuse_scores", "--json",
               "--bootstrap-servers", h.bootstrap]
        for k, v in h.overrides.items():
            if k not in ("bootstrap_servers", "seed"):
                cmd += ["--set", f"{k}={v}"]
        lines = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60,
                               cwd=str(tmp_path)).stdout.splitlines()
        shown = {json.loads(line)["key"] for line in lines}
        assert shown == {k.decode() for k in view.raised()}
        assert "mallory" in shown
        # With each key's partition and that partition's watermark, as the worker last
        # published it on its members record (a quiet partition's bans stand still with it).
        now_ms = time.time() * 1000
        for line in lines:
            rec = json.loads(line)
            assert rec["alert"] is None or isinstance(rec["watermark_ms"], int), rec
            if rec["alert"] is not None:
                assert now_ms - 600_000 < rec["watermark_ms"] <= now_ms + 1000, rec
        text = subprocess.run([c for c in cmd if c != "--json"], check=True, capture_output=True, text=True,
                              timeout=60, cwd=str(tmp_path))
        mallory = next(line for line in text.stdout.splitlines() if " mallory " in f" {line} ")
        age = int(mallory.split("watermark_age=")[1].split("s")[0])
        assert 0 <= age < 600 and "partition=" in mallory, mallory
        ages = text.stderr.split("# watermark age by partition: ")[1].splitlines()[0].split()
        assert len(ages) == 2 and all(a.endswith("s") for a in ages), text.stderr
    finally:
        view.stop()
        assert worker.stop() == 0, worker.log()[-3000:]
