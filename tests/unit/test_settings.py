"""Declared settings: typed, validated, scoped; one line and exit 2 for every user error."""
from __future__ import annotations

import secrets

import pytest

from grudge_stream import cli
from grudge_stream.exceptions import ConfigError
from grudge_stream.topology import Settings, load_topology

KEY = secrets.token_hex(16)


def load(name="abuse_scores", environ=None, **flags):
    return load_topology(name, Settings({"seed": KEY, **flags}, environ=environ or {}))


def test_precedence_flag_then_scoped_env_then_env_then_default() -> None:
    env = {"GRUDGE_RAISE_AT": "0.7", "GRUDGE_ABUSE_SCORES__RAISE_AT": "0.8", "GRUDGE_CLEAR_AT": "0.1"}
    s = Settings({"seed": KEY}, environ=env)
    load_topology("abuse_scores", s)
    assert s.get("raise_at") == 0.8 and s.get("clear_at") == 0.1 and s.get("levels") == 4
    s = Settings({"seed": KEY, "raise_at": "0.6"}, environ=env)
    load_topology("abuse_scores", s)
    assert s.get("raise_at") == 0.6 and s.sources["raise_at"] == "--set raise_at"
    # another topology's scoped variables are not ours
    load("abuse_scores", environ={"GRUDGE_DEDUP__CAPACITY": "5"})


@pytest.mark.parametrize("flags,env,message", [
    ({"rasie_at": "0.9"}, {}, "unknown setting 'rasie_at' for abuse_scores; did you mean 'raise_at'?"),
    ({}, {"GRUDGE_RASIE_AT": "0.9"}, "GRUDGE_RASIE_AT is not a setting of abuse_scores; did you mean 'GRUDGE_RAISE_AT'"),
    ({}, {"GRUDGE_ABUSE_SCORES__NOPE": "1"}, "GRUDGE_ABUSE_SCORES__NOPE names no setting"),
    ({"raise_at": "5"}, {}, "above the score's upper clamp 1.0: it can never raise"),
    ({"clear_at": "0.5"}, {}, "clear_at (0.5) must be below raise_at (0.5)"),
    ({"good_delta": "nan"}, {}, "must be finite"),
    ({"bad_delta": "0"}, {}, "must be > 0"),
    ({"levels": "four"}, {}, "must be an integer"),
    ({"emit_scores": "sometimes"}, {}, "must be one of none, crossings, every"),
    ({"max_future_ms": "-5"}, {}, "must be >= 0"),
    ({"max_late_ms": "soon"}, {}, "must be 'auto', 'none' or an integer"),
    ({"exactly_once": "perhaps"}, {}, "must be true or false"),
])
def test_mistakes_are_refused_by_name(flags, env, message) -> None:
    with pytest.raises(ConfigError) as exc:
        load(environ=env, **flags)
    assert message in str(exc.value)


def test_unknown_topology_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="the topologies are: abuse_scores, dedup, heavy_global, heavy_hitters"):
        load("abuse_scorse")


def test_every_topology_declares_what_it_reads() -> None:
    for name, flags in [("rate_limit", {"burst": "5"}), ("heavy_hitters", {"clear_at": "10", "raise_at": "20"}),
                        ("dedup", {"fp_rate": "0.01"}), ("known_keys", {"capacity": "10"})]:
        load(name, **flags)
    with pytest.raises(ConfigError, match="clear_at"):
        load("heavy_hitters", clear_at="30", raise_at="20")
    with pytest.raises(ConfigError, match="fp_rate"):
        load("dedup", fp_rate="0.9")


def test_app_id_defaults_to_operator_and_source_topic() -> None:
    assert load().app_id == "grudge-abuse-scores-abuse-events"
    assert load(operator_id="x", source_topic="t").app_id == "grudge-x-t"
    assert load(app_id="mine").app_id == "mine"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv,needle", [
    (["worker", "abuse_scores", "--set", "rasie_at=0.9", "--set", f"seed={KEY}"], "did you mean 'raise_at'"),
    (["worker", "no_such", "--set", f"seed={KEY}"], "the topologies are"),
    (["worker", "abuse_scores", "--set", "raise_at=5", "--set", f"seed={KEY}"], "can never raise"),
    (["replay", "abuse_scores", "--set", f"seed={KEY}", "--output", "jsonl:/nonexistent/dir/x.jsonl"],
     "cannot write it"),
    (["replay", "abuse_scores", "--set", f"seed={KEY}", "--output-topic", "alerts=x"],
     "--output-topic, --topic-prefix and --to-live go with --output topology"),
    # A what-if must not write into the live deployment's topics by accident.
    (["replay", "abuse_scores", "--set", f"seed={KEY}", "--output", "topology"],
     "would write to the live deployment's topics"),
    (["replay", "abuse_scores", "--set", f"seed={KEY}", "--output", "topology", "--output-topic",
      "alerts=whatif-alerts"], "scores -> abuse-scores"),
    (["replay", "abuse_scores", "--set", f"seed={KEY}", "--output", "topology", "--topic-prefix", "what if"],
     "--topic-prefix 'what if'"),
    (["replay", "abuse_scores", "--set", f"seed={KEY}", "--output", "topology", "--output-topic", "nope=x"],
     "--output-topic takes ROLE=TOPIC"),
    (["topics", "abuse_scores"], "GRUDGE_SEED"),
    (["worker", "abuse_scores", "--set", f"seed={KEY}", "--set", "exactly_once=true"],
     "exactly_once needs the batch runtime"),
])
def test_user_errors_are_one_line_and_exit_2(capsys, monkeypatch, argv, needle) -> None:
    for var in [v for v in __import__("os").environ if v.startswith("GRUDGE_") and v != "GRUDGE_KAFKA_CACHE"]:
        monkeypatch.delenv(var)
    # No broker: every one of these mistakes must be caught before connecting.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("GRUDGE_BROKER_WAIT_S", "0")
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_describe_lists_settings_and_hides_secrets(capsys) -> None:
    code, out, err = run_cli(capsys, "describe", "abuse_scores", "--set", f"seed={KEY}", "--set", "raise_at=0.7")
    assert code == 0
    assert "raise_at" in out and "0.7 (--set raise_at)" in out and "cells_per_level" in out
    assert KEY not in out and "(set)" in out
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("grudge-stream ")


def test_a_score_line_shows_how_old_the_partitions_watermark_is() -> None:
    import time

    from grudge_stream.cli.score import _score_line

    line = _score_line({"key": "eve", "score": 0.7, "raised": True, "partition": 3,
                        "watermark_ms": int(time.time() * 1000) - 7_200_000, "served_by": "w0"})
    age = int(line.split("watermark_age=")[1].split("s")[0])
    assert 7190 <= age <= 7210 and "raised=True" in line


def test_bound_settings_are_parsed_once_and_read_only() -> None:
    settings = Settings({"seed": secrets.token_hex(16), "max_future_ms": "1500", "raise_at": "0.7"}, environ={})
    load_topology("abuse_scores", settings)
    assert settings["max_future_ms"] == 1500 and settings["raise_at"] == 0.7  # typed
    with pytest.raises(TypeError):
        settings.values["raise_at"] = 0.1  # type: ignore[index]
    assert settings["raise_at"] == 0.7
