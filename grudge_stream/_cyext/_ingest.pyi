from array import array
from collections.abc import Callable
from typing import Any, Optional, Union

import numpy as np
import numpy.typing as npt

# (offsets, timestamps, keys, values) of one partition's records, in offset order.
Columns = tuple[list[int], list[int], list[Optional[bytes]], list[Optional[bytes]]]

def group_messages(msgs: list[Any]) -> tuple[dict[int, Columns], list[Any]]: ...
def group_records(by_tp_records: dict[Any, list[Any]]) -> dict[Any, Columns]: ...
def decode_column(
    keys: list[Optional[bytes]],
    values: list[Optional[bytes]],
    timestamps: Union[list[int], "array[int]"],  # a list, or int64 in a buffer
    start: int,
    cache: dict[bytes, Any],
    decode_value: Callable[[bytes], Union[float, str]],
    max_key_bytes: int,
    cache_max_entries: int,
    cache_max_value_bytes: int,
    allow_empty_keys: bool = False,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64], list[tuple[int, str]]]: ...
def watermark_and_weights(
    ts: npt.NDArray[np.int64],
    deltas: npt.NDArray[np.float64],
    watermark: Optional[int],
    lam_per_ms: float,
    future_limit: Optional[int] = None,
    clamp_future: bool = True,
    max_late: Optional[int] = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], int, int, list[tuple[int, int, int, int]]]: ...
