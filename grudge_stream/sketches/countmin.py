"""DecayingCountMin: a count-min sketch whose counters halve every idle epoch.

The kernel (``grudge_stream._cyext._countmin``) is the public class; this
module holds its frozen config object and sizing helpers. See
``docs/count-min.md`` for the design, guarantees and byte format.
"""

from __future__ import annotations

from grudge_stream._cyext._countmin import DecayingCountMin as DecayingCountMin
from grudge_stream.sketches import countmin_config as _config
from grudge_stream.sketches.countmin_config import *  # noqa: F401,F403 - the config and sizing, re-exported

__all__ = sorted([*_config.__all__, "DecayingCountMin"])
