"""The package's import graph: configs never load kernels, the dev broker loads none of it."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

LIGHT = ["grudge_stream", "grudge_stream.settings", "grudge_stream.exceptions",
         "grudge_stream.sketches", "grudge_stream.sketches.score_config",
         "grudge_stream.sketches.countmin_config", "grudge_stream.sketches.bloom_config"]

HEAVY = "'_cyext' in m or m == 'numpy'"


def loaded_after(modules: list[str], which: str = HEAVY) -> list[str]:
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in modules) +
            f"print(json.dumps(sorted(m for m in sys.modules if {which})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_configs_do_not_load_kernels_or_numpy() -> None:
    assert loaded_after(LIGHT) == []


def test_the_dev_broker_is_not_in_the_package_and_imports_none_of_it() -> None:
    """The dev broker is its own distribution (tools/devkafka): not in the runtime wheel, and
    importing it loads nothing of grudge_stream (so neither numpy nor the kernels)."""
    assert importlib.util.find_spec("grudge_stream.devkafka") is None
    assert loaded_after(["grudge_devkafka"], f"{HEAVY} or m.split('.')[0] == 'grudge_stream'") == []


@pytest.mark.parametrize("kernel", ["_score", "_countmin", "_bloom"])
def test_each_kernel_imports_first_without_a_cycle(kernel: str) -> None:
    assert f"grudge_stream._cyext.{kernel}" in loaded_after([f"grudge_stream._cyext.{kernel}"])


def test_lazy_names_resolve() -> None:
    import grudge_stream
    import grudge_stream.sketches as sk

    for name in ("ScoreSketch", "SplitScoreSketch", "DecayingCountMin", "ForgettingBloom", "Exponential",
                 "EventClock", "suggest_levels"):
        assert getattr(grudge_stream, name) is not None and name in dir(grudge_stream)
    for name in sk.__all__:
        assert getattr(sk, name) is not None
    with pytest.raises(AttributeError):
        grudge_stream.NoSuchThing  # noqa: B018


def test_kernel_codes_and_limits_match_the_config_module() -> None:
    from grudge_stream._cyext import _score
    from grudge_stream.sketches import score_config

    for name in ("DECAY_NONE", "DECAY_EXPONENTIAL", "DECAY_LINEAR", "MAX_LEVELS", "MAX_GENERATIONS"):
        assert getattr(_score, name) == getattr(score_config, name), name
