"""Public sketch API: config objects, sizing helpers and the compiled sketch classes."""

from __future__ import annotations
