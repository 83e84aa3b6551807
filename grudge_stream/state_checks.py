"""The argument checks of embedded state (``grudge_stream.state``).

What every kind checks before anything is built or changed: keys (bytes or str), positions
(ints >= 0), number columns of the batch forms, the operator arguments every kind takes
(``common_args``: name, topic, hash key) and a kind's whole sketch config
(``check_config``, one operator built at declaration). Each raises ``TypeError``,
``ValueError`` or ``ConfigError`` naming the argument.
"""
from __future__ import annotations

from typing import Any, Callable

from grudge_stream.exceptions import ConfigError
from grudge_stream.hashkey import HashKey
from grudge_stream.operators.base import Operator

__all__ = ["check_config", "common_args", "int_arg", "key_bytes", "number_column"]


def key_bytes(key: Any) -> bytes:
    """A key as bytes: bytes as they are, str as UTF-8; anything else is a TypeError."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"key must be bytes or str, not {type(key).__name__}")


def int_arg(name: str, v: Any) -> int:
    """``v``, an int >= 0 (a partition, an offset, a timestamp); else a TypeError or ValueError."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if v < 0:
        raise ValueError(f"{name} must be >= 0, not {v}")
    return v


def number_column(name: str, column: Any, dtype: Any) -> Any:
    """``column`` (a list, tuple or 1-d numpy array) as a contiguous array of ``dtype``
    (``np.float64``: numbers; ``np.int64``: ints); anything else in it (strings, None,
    booleans, floats for ints) is a TypeError. A list is converted with its type known,
    which costs a fraction of numpy's guessing."""
    import numpy as np

    ints = dtype is np.int64
    what = "ints" if ints else "numbers"
    if isinstance(column, np.ndarray):
        if column.ndim != 1 or column.dtype.kind not in ("iu" if ints else "fiu"):
            raise TypeError(f"{name} must be a column of {what}, not of {column.dtype} (shape {column.shape})")
        return np.ascontiguousarray(column, dtype=dtype)
    allowed = (int, np.integer) if ints else (int, float, np.integer, np.floating)
    for t in set(map(type, column)):
        if t is bool or not issubclass(t, allowed):
            raise TypeError(f"{name} must be a column of {what}, not of {t.__name__}")
    try:
        return np.fromiter(column, dtype=dtype, count=len(column))
    except OverflowError:
        raise ValueError(f"{name}: a value out of the int64 range") from None


def common_args(name: str, source_topic: str, hash_key: HashKey | None, public_keys: bool,
                max_future_ms: int | str | None, max_late_ms: int | str | None) -> dict[str, Any]:
    """The operator arguments every kind takes, checked before anything is built."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, not {name!r}")
    if not isinstance(source_topic, str) or not source_topic:
        raise ValueError(f"source_topic must be a non-empty string, not {source_topic!r}")
    if hash_key is not None and not isinstance(hash_key, HashKey):
        raise TypeError(f"hash_key must be a grudge_stream.hashkey.HashKey, not {type(hash_key).__name__}")
    if hash_key is None and public_keys:
        raise ConfigError(
            f"state {name!r} needs a secret hash_key: its keys come from the public, and with a known "
            "key anyone can frame a key or hide one (docs/security.md). Pass "
            "hash_key=HashKey.parse(<32 hex digits>), or public_keys=False for keys you choose yourself")
    return {"hash_key": hash_key, "max_future_ms": max_future_ms, "max_late_ms": max_late_ms}


def check_config(make_operator: Callable[[int], Operator]) -> None:
    """Build one operator now, so a bad config is refused where the state is declared.
    (A one-off cost at declaration, as a sketch's size; reading the state's names later
    builds nothing.)"""
    try:
        make_operator(0)
    except ValueError as exc:
        if "siphash" in str(exc):
            raise ConfigError("the sketch config's hasher must be 'siphash' when a hash_key is given "
                              "(hasher=\"siphash\")") from None
        raise
