"""Shared argument checks for sketch configs (private)."""

from __future__ import annotations

import operator

from grudge_stream.exceptions import ConfigError

U64_MAX = (1 << 64) - 1
HASHERS = ("murmur3", "siphash")


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
