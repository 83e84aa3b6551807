"""Backfill for embedded state (grudge_stream.backfill, ``grudge-stream backfill``) without a
broker: what a backfill hands the state equals the app's per-event calls, byte for byte, and
bad arguments are one line and exit 2. On the real broker:
tests/integration/test_embedded_backfill.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import faust
import pytest

from grudge_stream import faust as grudge
from grudge_stream.backfill import backfill, group_of, record_applier
from grudge_stream.exceptions import ConfigError
from grudge_stream.hashkey import HashKey
from grudge_stream.sketches.bloom_config import BloomConfig
from grudge_stream.sketches.countmin_config import CountMinConfig
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
from grudge_stream.state import ForgettingSetState, HeavyHitterState, ScoreState

KEY = HashKey.parse("00112233445566778899aabbccddeeff")
SKETCH = ScoreSketchConfig(levels=4, cells_per_level=1000, decay=Exponential(0.01), lo=0.0, hi=1.0,
                           aggregator="min", hasher="siphash")


def score_state(name="abuse", **kw) -> ScoreState:
    return ScoreState(name, source_topic="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY, **kw)


def delta_of(key, value):
    """The app's code: a JSON outcome to a delta; None for what the state is left alone on."""
    try:
        outcome = json.loads(value or b"").get("outcome")
    except (ValueError, AttributeError):
        return None
    return {"bad": 0.05, "good": -0.001}.get(outcome) if key else None


def records(n=3000):
    """(offset, timestamp, key, payload) of one partition: an abuser, late events, payloads
    the app skips (no key, not JSON, an unknown outcome)."""
    out, t = [], 1_000_000
    for i in range(n):
        t += i % 7
        key = f"user-{i % 37}".encode() if i % 5 else b"eve"
        bad = key == b"eve" or i % 11 == 0
        payload = json.dumps({"outcome": "bad" if bad else "good"}).encode()
        if i % 97 == 0:
            payload = b"not json"
        elif i % 89 == 0:
            payload = b'{"outcome":"meh"}'
        out.append((i, t if i % 13 else t - 500, None if i % 101 == 0 else key, payload))
    return out


def per_event(state, recs, value_of, call):
    """The live app: its agent calls the state per record (here, the operator as the state's
    per-event call drives it) for the records ``value_of`` gives a value."""
    op, out = state.topology.make_operator(0), []
    for o, t, k, v in recs:
        value = value_of(k, v)
        if value is not None:
            out += call(op, k, value, o, t) or []
    op.next_offset = recs[-1][0] + 1  # the snapshot covers what the agents saw
    return op, out


@pytest.mark.parametrize("score_mode", ["split", "single"])
def test_a_backfill_gives_the_state_of_the_per_event_calls(score_mode):
    state = score_state(score_mode=score_mode)
    recs = records()
    ref, ref_out = per_event(state, recs, delta_of,
                             lambda op, k, v, o, t: op.apply_event(k, v, offset=o, timestamp_ms=t))
    counts = {"records": 0, "applied": 0}
    apply = record_applier(state, delta_of, counts)
    op, out = state.topology.make_operator(0), []
    for a in range(0, len(recs), 500):  # the replay's batches
        offs, ts, keys, vals = (list(c) for c in zip(*recs[a:a + 500]))
        out += apply(op, offs, ts, keys, vals)
        op.next_offset = max(op.next_offset or 0, offs[-1] + 1)  # as the replay does
    assert op.snapshot() == ref.snapshot()
    assert [o.value for o in out] == [o.value for o in ref_out] and any(o.role == "alerts" for o in out)
    assert counts["records"] == len(recs) and 0 < counts["applied"] < len(recs)


def test_other_kinds_go_event_by_event_as_their_calls():
    hh = HeavyHitterState("hh", source_topic="t", hash_key=KEY, raise_at=50, clear_at=10, top_k=3,
                          sketch=CountMinConfig(depth=4, width=512, epoch_ms=60_000, hasher="siphash"))
    fs = ForgettingSetState("fs", source_topic="t", hash_key=KEY,
                            bloom=BloomConfig(capacity=1000, fp_rate=0.01, period_ms=60_000, hasher="siphash"))
    recs = [(i, 5000 + i, b"big" if i % 2 else f"k{i % 7}".encode(), b"x") for i in range(200)]
    for state, value_of in ((hh, lambda k, v: 1), (fs, lambda k, v: True)):
        value = state.backfill_value(value_of(None, None))
        ref, _ = per_event(state, recs, value_of,
                           lambda op, k, v, o, t: op.apply_event(k, value, offset=o, timestamp_ms=t))
        op = state.topology.make_operator(0)
        record_applier(state, value_of, {"records": 0, "applied": 0})(op, *map(list, zip(*recs)))
        op.next_offset = 200
        assert op.snapshot() == ref.snapshot(), state.kind
    with pytest.raises(ConfigError, match="count must be an int"):
        record_applier(hh, lambda k, v: 1.5, {"records": 0, "applied": 0})(
            hh.topology.make_operator(0), [0], [1], [b"k"], [b""])


@pytest.mark.parametrize("value_of, match", [
    (lambda k, v: 0.1 if k is None else None, "without a key"),
    (lambda k, v: float("nan") if k else None, "nan for logins\\[0\\] offset 1: .*finite"),
    (lambda k, v: "x" if k else None, "'x' for logins\\[0\\] offset 1: .*number"),
    (lambda k, v: 1 / 0, "value_of raised on logins\\[0\\] offset 0: ZeroDivisionError"),
])
def test_what_value_of_gives_is_checked_naming_the_record(value_of, match):
    state = score_state()
    op = state.topology.make_operator(0)
    before = op.snapshot()
    with pytest.raises(ConfigError, match=match):
        record_applier(state, value_of, {"records": 0, "applied": 0})(op, [0, 1], [10, 11], [None, b"k"], [b"", b""])
    assert op.snapshot() == before


def test_the_group_is_the_faust_apps_or_given():
    app = faust.App("backfill-unit", broker="kafka://127.0.0.1:1")
    attached = grudge.scores(app, "abuse", source="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25,
                             hash_key=KEY)
    assert group_of(attached, None) == "backfill-unit"
    assert group_of(attached, "other") == "other"
    with pytest.raises(ConfigError, match="not attached to a Faust app"):
        group_of(score_state(), None)


@pytest.mark.parametrize("kw, match", [
    (dict(value_of=3), "value_of must be callable"),
    (dict(uncommitted="sometimes"), "uncommitted"),
    (dict(output="everywhere"), "output must be"),
    (dict(output={"nope": "t"}), "roles \\['nope'\\]"),
    (dict(group=""), "group must be"),
])
def test_bad_arguments_are_refused_before_connecting(kw, match):
    state = score_state(bootstrap_servers="127.0.0.1:1")  # nothing listens: a connection would hang
    args = dict(value_of=delta_of, group="g")
    args.update(kw)
    with pytest.raises(ConfigError, match=match):
        backfill(state, args.pop("value_of"), **args)


APP = textwrap.dedent('''
    from grudge_stream.hashkey import HashKey
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
    from grudge_stream.state import ScoreState

    abuse = ScoreState("app-abuse", source_topic="logins", bootstrap_servers="127.0.0.1:1",
                       hash_key=HashKey.parse("00112233445566778899aabbccddeeff"),
                       sketch=ScoreSketchConfig(levels=2, cells_per_level=100, decay=Exponential(0.01),
                                                hasher="siphash"),
                       raise_at=0.5, clear_at=0.25)
    not_a_function = 3

    def delta_of(key, value):
        return 0.1
''')


@pytest.mark.parametrize("args, match", [
    (["missing.py", "--state", "app-abuse", "--value-of", "delta_of"], "missing.py: no such file"),
    (["app.py", "--state", "other", "--value-of", "delta_of"], "no state named 'other'.*'app-abuse'"),
    (["app.py", "--state", "app-abuse", "--value-of", "not_a_function"], "--value-of: 'not_a_function' is not"),
    (["app.py", "--state", "app-abuse", "--value-of", "delta_of", "--output", "state"],
     "--output state would write to the live deployment's topics"),
    (["app.py", "--state", "app-abuse", "--value-of", "delta_of", "--to-live"], "go with --output state"),
    (["app.py", "--state", "app-abuse", "--value-of", "delta_of", "--output", "topics"], "--output must be"),
    (["app.py", "--state", "app-abuse", "--value-of", "delta_of"], "not attached to a Faust app.*--group"),
    (["broken.py", "--state", "x", "--value-of", "f"], "cannot import broken.py: KeyError: 'BROKER'"),
])
def test_the_command_refuses_in_one_line(tmp_path, args, match):
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "broken.py").write_text("import os\nos.environ['BROKER']\n")
    res = subprocess.run([sys.executable, "-m", "grudge_stream.cli", "backfill", *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grudge-stream backfill: "), res.stderr
    assert re.search(match, lines[0]), lines[0]
