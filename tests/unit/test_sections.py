from __future__ import annotations

import dataclasses

import pytest

from grudge_stream.sections import SECTIONS, sections
from grudge_stream.settings import COMMON, setting
from grudge_stream.topology import Settings


def test_every_common_setting_is_in_exactly_one_section() -> None:
    placed = [f.name for cls in SECTIONS for f in dataclasses.fields(cls)]
    assert sorted(placed) == sorted(s.name for s in COMMON)
    assert len(placed) == len(set(placed))


def test_sections_read_what_setting_reads_and_are_frozen() -> None:
    s = Settings({"checkpoint_interval_s": "2.5", "web_port": "8123", "exactly_once": "true"}, environ={})
    got = sections(s)
    assert got.checkpointing.checkpoint_interval_s == 2.5 and got.checkpointing.exactly_once is True
    assert got.serving.web_port == 8123
    for section in (got.kafka, got.group, got.event_time, got.checkpointing, got.serving, got.identity):
        for f in dataclasses.fields(section):
            if f.name != "bootstrap_servers":  # its default comes from the environment
                assert getattr(section, f.name) == setting(s, f.name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.serving.web_port = 1  # type: ignore[misc]


def test_a_section_by_hand_has_the_declared_defaults_and_checks() -> None:
    from grudge_stream.exceptions import ConfigError
    from grudge_stream.sections import Checkpointing, KafkaClient, Serving

    assert Checkpointing() == sections(Settings({}, environ={})).checkpointing
    assert Checkpointing(reset_state="yes").reset_state is True
    assert Checkpointing(reset_state=True).given() == {"reset_state": True}
    with pytest.raises(ConfigError, match=r"^setting 'checkpoint_interval_s' \(Checkpointing\) must be > 0"):
        Checkpointing(checkpoint_interval_s=0)
    with pytest.raises(ConfigError, match="web_port"):
        Serving(web_port=70000)
    assert "hunter2" not in repr(KafkaClient(sasl_password="hunter2"))  # secrets never shown


def test_overrides_of_sections_and_keyword_arguments() -> None:
    from grudge_stream.exceptions import ConfigError
    from grudge_stream.sections import Checkpointing, KafkaClient, overrides

    got = overrides({"kafka": KafkaClient(bootstrap_servers="b:9092", broker_wait_s=5),
                     "checkpointing": Checkpointing(), "broker_wait_s": "7"})
    assert got == {"bootstrap_servers": "b:9092", "broker_wait_s": 7.0}  # the keyword over the section
    s = Settings(got, environ={})
    assert sections(s).kafka.broker_wait_s == 7.0 and sections(s).kafka.bootstrap_servers == "b:9092"
    with pytest.raises(TypeError, match="did you mean 'broker_wait_s'"):
        overrides({"broker_wait": 1})
    with pytest.raises(TypeError, match="KafkaClient"):
        overrides({"kafka": Checkpointing()})
    with pytest.raises(ConfigError, match=r"^setting 'broker_wait_s' \(argument broker_wait_s\) must be a number"):
        overrides({"broker_wait_s": "soon"})


def test_parts_take_their_section_or_the_settings_it_is_read_from() -> None:
    from grudge_stream.liveness import Liveness
    from grudge_stream.runtime.commits import open_transaction_wait
    from grudge_stream.sections import Checkpointing, Group, Serving
    from grudge_stream.serving.members import advertised_url
    from grudge_stream.webauth import QueryAccess

    s = Settings({"liveness_timeout_s": "7.5", "open_transaction_wait_s": "3", "web_port": "7000"}, environ={})
    assert Liveness.from_settings(s).timeout_s == Liveness.from_settings(Group.of(s)).timeout_s == 7.5
    assert open_transaction_wait(s) == open_transaction_wait(Checkpointing(open_transaction_wait_s=3)) == 3.0
    assert advertised_url(s) == advertised_url(Serving(web_port=7000)) == "http://127.0.0.1:7000"
    assert QueryAccess.from_settings(Serving()).tokens is None
