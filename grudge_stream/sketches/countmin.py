"""DecayingCountMin: a count-min sketch whose counters halve every idle epoch.

The kernel (``grudge_stream._cyext._countmin``) is the public class; this
module holds its frozen config object and sizing helpers. See
``docs/count-min.md`` for the design, guarantees and byte format.
"""

from __future__ import annotations

from grudge_stream._cyext._countmin import DecayingCountMin
from grudge_stream.sketches.countmin_config import (
    CountMinConfig,
    CountMinParameters,
    MAX_CELLS,
    MAX_DEPTH,
    MAX_TOP_K,
    countmin_dimensions,
    countmin_memory_bytes,
)

__all__ = [
    "CountMinConfig",
    "CountMinParameters",
    "DecayingCountMin",
    "MAX_CELLS",
    "MAX_DEPTH",
    "MAX_TOP_K",
    "countmin_dimensions",
    "countmin_memory_bytes",
]
