"""The embedding API's settings: sections and keyword arguments (grudge_stream.sections),
``settings=`` as before; without a broker."""
from __future__ import annotations

import pytest

from grudge_stream.exceptions import ConfigError
from grudge_stream.hashkey import HashKey
from grudge_stream.sections import Checkpointing, KafkaClient, Serving
from grudge_stream.settings import Settings
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
from grudge_stream.state import ScoreState

KEY = HashKey.parse("00112233445566778899aabbccddeeff")
SKETCH = ScoreSketchConfig(levels=4, cells_per_level=1000, decay=Exponential(0.01), lo=0.0, hi=1.0,
                           aggregator="min", hasher="siphash")


def state(**kw) -> ScoreState:
    return ScoreState("abuse", source_topic="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25, hash_key=KEY, **kw)


def test_sections_and_keyword_arguments_reach_the_state(monkeypatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    s = state(kafka=KafkaClient(bootstrap_servers="b:9092", sasl_username="app"),
              checkpointing=Checkpointing(checkpoint_interval_s=2.0, snapshot_max_age_s=600),
              serving=Serving(query_burst=10), broker_wait_s=30)
    assert s.sections.kafka.bootstrap_servers == "b:9092" and s.sections.kafka.sasl_username == "app"
    assert s.sections.kafka.broker_wait_s == 30.0
    assert s.sections.checkpointing.snapshot_max_age_s == 600.0 and s.sections.serving.query_burst == 10.0
    assert s.topology.checkpoint_interval_s == 2.0
    assert s.connection()[0] == "b:9092"
    assert state(checkpoint_interval_s=3, checkpointing=Checkpointing(checkpoint_interval_s=2.0)) \
        .topology.checkpoint_interval_s == 3.0  # the argument goes first
    assert state().topology.checkpoint_interval_s == 5.0 and state().connection()[0] == "127.0.0.1:9092"


def test_settings_the_old_way_still_work() -> None:
    settings = Settings({"broker_wait_s": "12"}, environ={})
    s = state(settings=settings)
    assert s.settings is settings and s.sections.kafka.broker_wait_s == 12.0
    both = state(settings=settings, broker_wait_s=3)  # the keyword over the settings' overrides
    assert both.sections.kafka.broker_wait_s == 3.0 and settings.overrides == {"broker_wait_s": "12"}


def test_bad_values_and_names_fail_at_construction_with_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^setting 'broker_wait_s' \(argument broker_wait_s\) must be >= 0"):
        state(broker_wait_s=-1)
    with pytest.raises(ConfigError, match=r"^setting 'security_protocol' \(KafkaClient\) must be one of"):
        KafkaClient(security_protocol="TLS")
    with pytest.raises(ConfigError, match=r"setting 'web_port'"):
        state(settings=Settings({"web_port": "many"}, environ={}))
    with pytest.raises(TypeError, match="did you mean 'broker_wait_s'"):
        state(broker_wait=1)
    with pytest.raises(TypeError, match="kind's own arguments"):
        state(max_key_bytes=10)


def test_the_docs_settings_example_runs_as_written(monkeypatch, capsys) -> None:
    import re
    from pathlib import Path

    for var in ("KAFKA_BOOTSTRAP_SERVERS", "GRUDGE_SEED"):
        monkeypatch.delenv(var, raising=False)
    text = (Path(__file__).resolve().parents[2] / "docs" / "embedding.md").read_text()
    code = re.search(r"```python\n(.*?)```", text[text.index("### Settings: sections or keyword arguments"):],
                     re.S).group(1)
    exec(compile(code, "embedding.md", "exec"), {})
    out = capsys.readouterr().out
    assert "bootstrap_servers='kafka-1:9092'" in out and "sasl_password=" not in out
    assert out.splitlines()[-1] == "900.0 30.0"
