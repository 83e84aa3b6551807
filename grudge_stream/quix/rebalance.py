"""The one private hook into Quix Streams: its rebalance callbacks, wrapped so that a bound
state restores its partitions on assignment and lets them go on revocation
(``_hook_rebalance``), for the Quix Streams versions in ``QUIX_SUPPORTED``.
"""
from __future__ import annotations

from typing import Any, Callable

from quixstreams import Application

# The Quix Streams versions this binding is tested with (the ``quix`` extra pins them):
# [lowest, first unsupported).
QUIX_SUPPORTED = ((3, 28, 1), (3, 29, 0))


def _version() -> tuple[int, ...]:
    import quixstreams

    parts = []
    for piece in str(quixstreams.__version__).split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


_REBALANCE_CALLBACKS = ("_on_assign", "_on_revoke", "_on_lost")


def _hook_rebalance(app: Application, assigned: Callable[[list], None], revoked: Callable[[list], None],
                    lost: Callable[[list], None]) -> None:
    """Call ``assigned`` after Quix's own assignment callback, ``revoked`` after its
    revocation callback (which commits Quix's checkpoint first) and ``lost`` after it drops
    lost partitions, each with the callback's ``TopicPartition`` list.

    PRIVATE to Quix Streams: ``Application._on_assign`` / ``_on_revoke`` / ``_on_lost`` are
    the callbacks ``Application._run_dataframe`` hands to ``consumer.subscribe``, read from
    the instance when ``run()`` starts, so instance attributes replace them. Quix has no
    public rebalance hook (3.28). Checked here and by tests/unit/test_quix_binding.py."""
    missing = [n for n in _REBALANCE_CALLBACKS if not callable(getattr(app, n, None))]
    if missing:
        raise RuntimeError(
            f"Quix Streams {'.'.join(map(str, _version()))} has no Application.{', '.join(missing)}: "
            f"grudge_stream.quix restores on assignment through them and supports Quix Streams "
            f">={'.'.join(map(str, QUIX_SUPPORTED[0]))},<{'.'.join(map(str, QUIX_SUPPORTED[1]))} "
            "(pip install 'grudge-stream[quix]')")
    own_assign, own_revoke, own_lost = (getattr(app, n) for n in _REBALANCE_CALLBACKS)

    def on_assign(consumer: Any, partitions: list) -> None:
        own_assign(consumer, partitions)
        if partitions:
            assigned(partitions)

    def on_revoke(consumer: Any, partitions: list) -> None:
        try:
            own_revoke(consumer, partitions)
        finally:
            if partitions:
                revoked(partitions)

    def on_lost(consumer: Any, partitions: list) -> None:
        try:
            own_lost(consumer, partitions)
        finally:
            if partitions:
                lost(partitions)

    app._on_assign = on_assign  # type: ignore[method-assign]
    app._on_revoke = on_revoke  # type: ignore[method-assign]
    app._on_lost = on_lost  # type: ignore[method-assign]
