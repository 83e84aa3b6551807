"""ForgettingBloom: a Bloom filter that forgets by rotating generations.

The kernel (``grudge_stream._cyext._bloom``) is the public class; this module
holds its frozen config object and the sizing rule. See
``docs/forgetting-bloom.md`` for the design, error direction and byte format.
"""

from __future__ import annotations

from grudge_stream._cyext._bloom import ForgettingBloom
from grudge_stream.sketches.bloom_config import (
    BloomConfig,
    BloomSizing,
    MAX_GENERATIONS,
    MAX_HASHES,
    MAX_POSITIONS,
    OVERLOAD_MODES,
    bloom_sizing,
)

__all__ = [
    "BloomConfig",
    "BloomSizing",
    "ForgettingBloom",
    "MAX_GENERATIONS",
    "MAX_HASHES",
    "OVERLOAD_MODES",
    "bloom_sizing",
]
