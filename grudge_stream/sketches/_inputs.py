"""Batch-argument normalisation shared by the sketch kernels (private).

Everything here runs once per batch, before a kernel touches any cell, so a
bad argument raises with the sketch unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from grudge_stream.clock import as_ms
from grudge_stream.exceptions import InvalidInputError

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
U64_MAX = (1 << 64) - 1

# Source kinds for keys of a batch.
PREHASHED, SEQUENCE, ROWS = 0, 1, 2


def prepare_keys(keys: Any) -> tuple[np.ndarray | None, Any, int]:
    """Return ``(hashes, source, kind)``; ``hashes`` is None for a SEQUENCE or ROWS, which
    the kernel hashes itself with its own hasher, secret key included (``gkeys.hash_items``,
    ``gkeys.hash_rows``).

    - a 1-D numpy array (or buffer) of 8-byte integers: pre-hashed keys, used as they
      are (int64 reinterpreted as uint64); ``source`` is None;
    - a 2-D C-contiguous uint8 array: fixed-width keys, one per row;
    - a list or tuple (or any iterable) of bytes / str / bytearray keys.
    """
    if isinstance(keys, (bytes, str, bytearray)):
        raise TypeError("a batch takes a sequence of keys (or a uint64 array), not a single key")
    if isinstance(keys, (list, tuple)):
        return None, keys, SEQUENCE
    if isinstance(keys, np.ndarray) or hasattr(keys, "__buffer__") or isinstance(keys, memoryview):
        arr = np.asarray(keys)
        if arr.dtype.kind in "iu" and arr.ndim == 1:
            if arr.dtype.itemsize != 8:
                raise TypeError(
                    f"pre-hashed keys must be uint64 (or int64) values, got {arr.dtype}; "
                    "hash keys with grudge_stream.hashing.hash64_many or pass them as bytes"
                )
            return np.ascontiguousarray(arr).view(np.uint64), None, PREHASHED
        if arr.dtype == np.uint8 and arr.ndim == 2:
            return None, np.ascontiguousarray(arr), ROWS
        if arr.dtype.kind in "OSU" and arr.ndim == 1:
            return None, arr.tolist(), SEQUENCE
        raise TypeError(f"cannot use an array of dtype {arr.dtype} and shape {arr.shape} as keys")
    return None, list(keys), SEQUENCE


def key_at(source: Any, kind: int, i: int) -> Any:
    """The key object to remember for batch position i (bytes for rows and bytearrays)."""
    if kind == SEQUENCE:
        k = source[i]
        return bytes(k) if isinstance(k, bytearray) else k
    if kind == ROWS:
        return source[i].tobytes()
    return None


def count_value(count: Any, what: str = "count") -> int:
    """A single non-negative integer weight (integral floats accepted; bool, NaN, Inf refused)."""
    if isinstance(count, bool):
        raise InvalidInputError(f"{what} must be a non-negative integer, not bool")
    if isinstance(count, (float, np.floating)):
        if not math.isfinite(count) or count != math.floor(count):
            raise InvalidInputError(f"{what} must be a non-negative integer, got {count!r}")
        count = int(count)
    try:
        v = int(count.__index__())  # type: ignore[union-attr]
    except (AttributeError, TypeError):
        raise InvalidInputError(
            f"{what} must be a non-negative integer, not {type(count).__name__}"
        ) from None
    if v < 0:
        raise InvalidInputError(f"{what} must be non-negative, got {v}")
    return v


def prepare_counts(counts: Any, n: int) -> tuple[int, np.ndarray | None]:
    """``(scalar, None)`` for None / one weight, or ``(0, uint64 array)`` for per-event weights."""
    if counts is None:
        return 1, None
    if np.ndim(counts) == 0 and not isinstance(counts, (list, tuple)):
        return min(
            count_value(counts.item() if isinstance(counts, np.ndarray) else counts), U64_MAX
        ), None
    arr = np.asarray(counts)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise InvalidInputError(
            f"counts must be a scalar or a 1-D array of length {n}, got shape {arr.shape}"
        )
    kind = arr.dtype.kind
    if kind == "u":
        return 0, np.ascontiguousarray(arr, dtype=np.uint64)
    if kind == "i":
        if n and arr.min() < 0:
            raise InvalidInputError(f"counts must be non-negative, got {int(arr.min())}")
        return 0, np.ascontiguousarray(arr.astype(np.uint64))
    if kind == "f":
        if n and not np.isfinite(arr).all():
            raise InvalidInputError("counts must be finite (found NaN or Inf)")
        if n and (arr.min() < 0 or (arr != np.floor(arr)).any()):
            raise InvalidInputError("counts must be non-negative integers")
        return 0, np.minimum(arr, float(U64_MAX)).astype(np.uint64)
    if kind == "O":
        return 0, np.array([min(count_value(c), U64_MAX) for c in arr], dtype=np.uint64)
    raise InvalidInputError(f"counts must be non-negative integers, got dtype {arr.dtype}")


def time_value(now_ms: Any) -> int:
    """One timestamp, validated and within int64 (as ``grudge_stream.clock.as_ms``)."""
    try:
        t = as_ms(now_ms)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(str(exc)) from None
    if not I64_MIN <= t <= I64_MAX:
        raise InvalidInputError(f"now_ms must fit in a signed 64-bit integer, got {t}")
    return t


def prepare_times(now_ms: Any, n: int) -> tuple[int | None, np.ndarray | None]:
    """``(None, None)`` (read the clock), ``(t, None)`` (one time), or ``(None, int64 array)``."""
    if now_ms is None:
        return None, None
    if np.ndim(now_ms) == 0 and not isinstance(now_ms, (list, tuple)):
        return time_value(now_ms.item() if isinstance(now_ms, np.ndarray) else now_ms), None
    arr = np.asarray(now_ms)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise InvalidInputError(
            f"now_ms must be a scalar or a 1-D array of length {n}, got shape {arr.shape}"
        )
    kind = arr.dtype.kind
    if kind == "i":
        return None, np.ascontiguousarray(arr, dtype=np.int64)
    if kind == "u":
        if n and arr.max() > I64_MAX:
            raise InvalidInputError("now_ms values must fit in a signed 64-bit integer")
        return None, np.ascontiguousarray(arr.astype(np.int64))
    if kind == "f":
        if n and not np.isfinite(arr).all():
            raise InvalidInputError("now_ms must be finite (found NaN or Inf)")
        if n and (arr.min() < I64_MIN or arr.max() >= 2.0**63):
            raise InvalidInputError("now_ms values must fit in a signed 64-bit integer")
        return None, np.trunc(arr).astype(np.int64)
    if kind == "O":
        return None, np.array([time_value(t) for t in arr], dtype=np.int64)
    raise InvalidInputError(f"now_ms must be integers (milliseconds), got dtype {arr.dtype}")
