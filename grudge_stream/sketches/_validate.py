"""Shared argument checks for sketch configs (private)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any, ClassVar, TypeVar

from grudge_stream.exceptions import ConfigError

U64_MAX = (1 << 64) - 1
HASHERS = ("murmur3", "siphash")
#: How a key's cell indexes derive from its 64-bit hash (docs/hashing.md, "Index schemes"):
#: ``independent`` (each level from its own 32 bits of the hash or a remix of it; the default of
#: new sketches) or ``km`` (Kirsch-Mitzenmacher, the only scheme of grudge-stream 0.2 and
#: of the Go library grudge: kept for their snapshots and test vectors).
INDEX_SCHEMES = ("independent", "km")
DEFAULT_INDEX_SCHEME = "independent"
#: What a serialized config without an ``index_scheme`` field means: it was written by
#: grudge-stream 0.2 (or is a KM config, which keeps that form; see ``scheme_dict``).
LEGACY_INDEX_SCHEME = "km"


def as_int(value: object, name: str) -> int:
    """An integer config value; bool and non-integral values are refused."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, not bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{name} must be an integer, not {type(value).__name__}") from None


def in_range(value: object, name: str, lo: int, hi: int) -> int:
    v = as_int(value, name)
    if not lo <= v <= hi:
        raise ConfigError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def check_hasher(value: object) -> str:
    if value not in HASHERS:
        raise ConfigError(f"hasher must be one of {HASHERS}, got {value!r}")
    return str(value)


def check_index_scheme(value: object) -> str:
    if value not in INDEX_SCHEMES:
        raise ConfigError(f"index_scheme must be one of {INDEX_SCHEMES}, got {value!r}")
    return str(value)


def scheme_dict(d: dict[str, Any]) -> dict[str, Any]:
    """A config's dict form with its ``index_scheme`` as serialized: a KM config keeps the
    0.2 form (no field), so its snapshots and fingerprint stay what 0.2 wrote and 0.2 can
    still read them; any other scheme is written out (and 0.2 refuses such a snapshot)."""
    if d.get("index_scheme") == LEGACY_INDEX_SCHEME:
        d = dict(d)
        del d["index_scheme"]
    return d


def scheme_of_dict(d: Any) -> str:
    """The index scheme a serialized config names (absent: ``km``, see ``scheme_dict``)."""
    if isinstance(d, dict) and "index_scheme" in d:
        return check_index_scheme(d["index_scheme"])
    return LEGACY_INDEX_SCHEME


def config_fields(cls: Any, conf: Any, what: str) -> dict[str, Any]:
    """``conf`` (a mapping of a config class's fields) as a dict, checked: no unknown field,
    every field without a default present. Shared by the config classes' ``of``."""
    if not isinstance(conf, Mapping):
        raise ConfigError(f"a {what} config must be a {cls.__name__} or a dict, not {type(conf).__name__}")
    names = [f.name for f in fields(cls)]
    unknown = [k for k in conf if k not in names]
    if unknown:
        raise ConfigError(f"unknown {what} config field(s) {sorted(map(str, unknown))}; the fields are {names}")
    missing = [f.name for f in fields(cls)
               if f.name not in conf and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ConfigError(f"a {what} config needs {missing}")
    return dict(conf)


_C = TypeVar("_C", bound="ConfigOf")


class ConfigOf:
    """What the frozen config classes share: ``kwargs()`` (the constructor arguments of the
    sketch they configure) and ``of(conf)`` (``conf`` itself, or the config a dict names:
    an absent field takes its default, an unknown field is a ConfigError). A class names
    its sketch in ``built`` and may convert fields of the dict form in ``_from_dict``."""

    __slots__ = ()
    built: ClassVar[str] = ""

    def kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def of(cls: type[_C], conf: Any) -> _C:
        if isinstance(conf, cls):
            return conf
        return cls(**cls._from_dict(config_fields(cls, conf, cls.built)))

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        return d
