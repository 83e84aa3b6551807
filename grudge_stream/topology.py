"""A topology: which topic feeds which operator, and where its outputs and snapshots go.

Topology modules (``topologies/*.py``) define ``build(settings) -> Topology``;
the runtimes (Faust worker, batch runner, replay) take it from there.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping

from grudge_stream.exceptions import ConfigError
from grudge_stream.hashkey import hash_key_from_settings
from grudge_stream.operators.base import AUTO, Operator

RESTORE_FALLBACKS = ("replay", "fail")


class Settings:
    """Configuration from flags (``--set name=value``) over environment variables over defaults.

    ``settings.get("raise_at", 0.5)`` reads the flag ``raise_at``, else the environment
    variable ``GRUDGE_RAISE_AT``, else the default, converted to the default's type.
    """

    def __init__(self, overrides: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self.environ = os.environ if environ is None else environ

    @property
    def bootstrap_servers(self) -> str:
        return self.get("bootstrap_servers", self.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))

    def get(self, name: str, default):
        raw = self.overrides.get(name)
        if raw is None:
            raw = self.environ.get("GRUDGE_" + name.upper())
        if raw is None:
            return default
        if default is None or isinstance(default, str):
            return raw
        try:
            if isinstance(default, bool):
                if str(raw).lower() in ("1", "true", "yes", "on"):
                    return True
                if str(raw).lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(raw)
            return type(default)(raw)
        except ValueError:
            raise ConfigError(f"setting {name!r} must be a {type(default).__name__}, got {raw!r}") from None


def _time_bound(settings: Settings, name: str) -> int | str | None:
    raw = settings.get(name, AUTO)
    text = str(raw).strip().lower()
    if text == AUTO:
        return AUTO
    if text in ("none", "off"):
        return None
    try:
        v = int(text)
    except ValueError:
        raise ConfigError(f"setting {name!r} must be 'auto', 'none' or milliseconds, got {raw!r}") from None
    if v < 0:
        raise ConfigError(f"setting {name!r} must be >= 0, got {v}")
    return v


def operator_settings(settings: Settings, topology: str) -> dict:
    """The settings every operator takes (docs/runtime.md): event-time bounds and their
    policies, and the secret hash key (required; see grudge_stream.hashkey)."""
    return {
        "max_future_ms": _time_bound(settings, "max_future_ms"),
        "future_policy": settings.get("future_policy", "clamp"),
        "max_late_ms": _time_bound(settings, "max_late_ms"),
        "late_policy": settings.get("late_policy", "dead_letter"),
        "hash_key": hash_key_from_settings(settings, topology),
    }


def codec_settings(settings: Settings) -> dict:
    """Key checks every codec applies: ``max_key_bytes`` (1024: longer keys are
    dead-lettered) and ``allow_empty_keys`` (false: empty keys are dead-lettered)."""
    n = settings.get("max_key_bytes", 1024)
    if n < 0:
        raise ConfigError(f"setting 'max_key_bytes' must be >= 0, got {n}")
    return {"max_key_bytes": n, "allow_empty_keys": settings.get("allow_empty_keys", False)}


@dataclass
class Topology:
    """Topics in, one operator per source partition, topics out."""

    name: str
    source_topic: str
    make_operator: Callable[[int], Operator]
    outputs: dict[str, str]
    snapshot_topic: str
    checkpoint_interval_s: float = 5.0
    restore_fallback: str = "replay"
    description: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.restore_fallback not in RESTORE_FALLBACKS:
            raise ConfigError(f"restore_fallback must be one of {RESTORE_FALLBACKS}")
        if self.checkpoint_interval_s <= 0:
            raise ConfigError("checkpoint_interval_s must be > 0")
        if "dead_letters" not in self.outputs:
            raise ConfigError("a topology needs a dead_letters output topic")

    def output_topic(self, role: str) -> str | None:
        return self.outputs.get(role)

    @property
    def operator_id(self) -> str:
        return self.make_operator(0).operator_id


def load_topology(name: str, settings: Settings | None = None) -> Topology:
    """Load ``topologies.<name>``, a dotted module path, or a ``.py`` file, and build it."""
    settings = settings or Settings()
    if name.endswith(".py") or os.sep in name:
        spec = importlib.util.spec_from_file_location(f"grudge_topology_{abs(hash(name))}", name)
        if spec is None or spec.loader is None:
            raise ConfigError(f"cannot load topology file {name!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        modname = name if "." in name else f"topologies.{name}"
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name not in (modname, "topologies"):
                raise
            repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            cwd = os.getcwd()
            for root in (cwd, repo_root):
                if os.path.isdir(os.path.join(root, "topologies")) and root not in sys.path:
                    sys.path.append(root)
            try:
                module = importlib.import_module(modname)
            except ModuleNotFoundError:
                raise ConfigError(
                    f"unknown topology {name!r}: no module {modname!r} (run from the project root, "
                    "or pass a path to a topology .py file)"
                ) from None
    build = getattr(module, "build", None)
    if build is None:
        raise ConfigError(f"topology module {module.__name__!r} has no build(settings) function")
    return build(settings)
