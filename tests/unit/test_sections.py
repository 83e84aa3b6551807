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
