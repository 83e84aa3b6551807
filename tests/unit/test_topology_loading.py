"""Naming a topology: a shipped name, a dotted module (found in the working directory too),
a .py file, and the 0.1 ``topologies.<name>`` path; the shipped ones install under
grudge_stream, never as a top-level package."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import secrets
import sys
import textwrap

import pytest

from grudge_stream import cli
from grudge_stream.exceptions import ConfigError
from grudge_stream.topology import Settings, load_topology, load_topology_module, topology_names

KEY = secrets.token_hex(16)

CUSTOM = textwrap.dedent('''
    """Fraud scores for payments."""
    import dataclasses

    from grudge_stream.settings import Setting
    from grudge_stream.topologies import abuse_scores

    SETTINGS = [*abuse_scores.SETTINGS, Setting("merchant_weight", "float", 2.0, "weight of a merchant's events")]

    def build(settings):
        return dataclasses.replace(abuse_scores.build(settings), name="fraud")
''')


@pytest.fixture
def clean_path(monkeypatch):
    """sys.path and sys.modules restored after the test (the loader may add the cwd)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("mytopos", "grudge_topology_")):
            del sys.modules[name]


def test_the_shipped_topologies_are_modules_of_grudge_stream() -> None:
    names = topology_names()
    assert names == ["abuse_scores", "dedup", "heavy_global", "heavy_hitters", "known_keys", "rate_limit"]
    for name in names:
        assert load_topology_module(name).__name__ == f"grudge_stream.topologies.{name}"


def test_the_wheel_installs_no_top_level_topologies_package(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # not a source tree, whose topologies/ would be found
    assert importlib.util.find_spec("topologies") is None
    files = importlib.metadata.files("grudge-stream") or []
    tops = {f.parts[0] for f in files if f.parts and not f.parts[0].endswith((".dist-info", ".data"))}
    assert tops <= {"grudge_stream", "..", "bin"}, tops
    assert any(f.as_posix() == "grudge_stream/topologies/rate_limit.py" for f in files)


def test_a_dotted_module_is_found_in_the_working_directory(tmp_path, monkeypatch, clean_path) -> None:
    (tmp_path / "mytopos").mkdir()
    (tmp_path / "mytopos" / "__init__.py").write_text("")
    (tmp_path / "mytopos" / "fraud.py").write_text(CUSTOM)
    monkeypatch.chdir(tmp_path)
    assert str(tmp_path) not in sys.path
    topology = load_topology("mytopos.fraud", Settings({"seed": KEY, "merchant_weight": "3"}, environ={}))
    assert topology.name == "fraud"
    # its scoped variables take the module's last name
    s = Settings({"seed": KEY}, environ={"GRUDGE_FRAUD__MERCHANT_WEIGHT": "4"})
    load_topology("mytopos.fraud", s)
    assert s.get("merchant_weight") == 4.0


def test_a_module_that_imports_something_missing_shows_what(tmp_path, monkeypatch, clean_path) -> None:
    (tmp_path / "mytopos").mkdir()
    (tmp_path / "mytopos" / "__init__.py").write_text("")
    (tmp_path / "mytopos" / "broken.py").write_text("import no_such_dependency_here\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_here"):
        load_topology_module("mytopos.broken")


def test_an_unknown_dotted_module_is_one_line_listing_the_shipped_names(tmp_path, monkeypatch,
                                                                         clean_path) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"unknown topology 'mytopos.nope'; the topologies are: abuse_scores"):
        load_topology_module("mytopos.nope")


def test_the_0_1_module_path_still_loads_with_a_warning(caplog, tmp_path, monkeypatch, clean_path) -> None:
    monkeypatch.chdir(tmp_path)  # not a source tree, whose topologies/ would be importable
    with caplog.at_level(logging.WARNING):
        module = load_topology_module("topologies.rate_limit")
    assert module.__name__ == "grudge_stream.topologies.rate_limit"
    assert "moved to grudge_stream.topologies" in caplog.text and "'rate_limit'" in caplog.text
    with pytest.raises(ConfigError, match="unknown topology 'topologies.nope'"):
        load_topology_module("topologies.nope")


def test_describe_names_the_scoped_variables_of_a_file_topology(tmp_path, capsys, clean_path) -> None:
    path = tmp_path / "fraud.py"
    path.write_text(CUSTOM)
    assert cli.main(["describe", str(path), "--set", f"seed={KEY}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Fraud scores for payments.")
    assert "env GRUDGE_FRAUD__NAME or GRUDGE_NAME" in out and "merchant_weight" in out
    s = Settings({"seed": KEY}, environ={"GRUDGE_FRAUD__MERCHANT_WEIGHT": "5"})
    load_topology(str(path), s)
    assert s.get("merchant_weight") == 5.0
