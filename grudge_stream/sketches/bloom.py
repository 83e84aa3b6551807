"""ForgettingBloom: a Bloom filter that forgets by rotating generations.

The kernel (``grudge_stream._cyext._bloom``) is the public class; this module
holds its frozen config object and the sizing rule. See
``docs/forgetting-bloom.md`` for the design, error direction and byte format.
"""

from __future__ import annotations

from grudge_stream._cyext._bloom import ForgettingBloom as ForgettingBloom
from grudge_stream.sketches import bloom_config as _config
from grudge_stream.sketches.bloom_config import *  # noqa: F401,F403 - the config and sizing, re-exported

__all__ = sorted([*_config.__all__, "ForgettingBloom"])
