"""Watchers of a Faust app's consumer group and Table recovery, each a thread.

``watch_coordination`` ends a worker whose consumer's group coordination ended for good
(``coordination_failure``); ``watch_recovery`` reports a Table recovery that reads nothing
(``recovery_progress``), and ``request_rebalance`` asks the group to start it again. Used
by the worker runtime (``grudge_stream.runtime.faust.worker``) and by the states embedded
in a user's app (``grudge_stream.runtime.faust.states``).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from grudge_stream.exceptions import WorkerFault
from grudge_stream.liveness import RecoveryStall
from grudge_stream.runtime.faust.consumer import coordination_task, group_coordinator, table_recovery

# How often a thread checks that the consumer's group coordination still runs.
COORDINATION_CHECK_S = 2.0
RECOVERY_CHECK_S = 2.0


def coordination_failure(app: Any) -> str | None:
    """Why the app consumer's group coordination ended for good, or None while it runs.

    aiokafka runs the group membership (joins, heartbeats, assignments) as one task; an
    error it does not expect ends that task (a static member whose rejoin met another
    incarnation's assignment, say), and the consumer goes on fetching nothing, a member in
    name only, for ever. aiokafka's private attributes, read only (by
    ``grudge_stream.runtime.faust.consumer``, pinned by tests/unit/test_group_progress.py);
    a consumer not started yet or closing is None."""
    coordinator, _ = group_coordinator(app)
    task, closing = coordination_task(coordinator)
    if task is None or not task.done() or (closing is not None and closing.done()):
        return None
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return repr(exc) if exc is not None else "it returned"


def watch_coordination(app: Any, failed: Callable[[WorkerFault], None], done: Callable[[], bool],
                       every_s: float = COORDINATION_CHECK_S) -> threading.Thread:
    """A thread that calls ``failed`` once (with one line's worth of reason) when ``app``'s
    consumer group coordination has ended for good (``coordination_failure``), until
    ``done()``. A thread, not a Faust timer: a member in that state may never start them."""
    def watch() -> None:
        while not done():
            time.sleep(every_s)
            failure = coordination_failure(app)
            if failure is not None and not done():
                failed(WorkerFault(
                    f"the consumer's group coordination ended ({failure}): this member can neither hold "
                    f"nor take partitions any more (a static member fenced by another with its "
                    f"group_instance_id, say); ending the worker for a restart, without a snapshot"))
                return

    t = threading.Thread(target=watch, name="grudge-coordination-watch", daemon=True)
    t.start()
    return t


def recovery_progress(app: Any) -> tuple[bool, dict] | None:
    """Faust's Table recovery as it stands: whether it runs, and per changelog partition
    it reads for the app's active tables, ``(offset read, offset to reach)``. None before
    the app has tables, or when read mid-change (the next look gets it). Faust's private
    attributes, read only (``table_recovery``), from any thread (pinned by
    tests/unit/test_group_progress.py)."""
    recovery = table_recovery(app)
    if recovery is None:
        return None
    try:
        offsets = dict(recovery.active_offsets)
        highwaters = dict(recovery.active_highwaters)
        tps = list(recovery.active_tps)
    except RuntimeError:  # changed size while copied
        return None
    return bool(recovery.in_recovery), {tp: (offsets.get(tp), highwaters.get(tp)) for tp in tps}


def request_rebalance(app: Any) -> bool:
    """Ask the app consumer's group for a rebalance (aiokafka's rejoin, on the consumer's
    own thread); False when the consumer does not run."""
    coordinator, loop = group_coordinator(app)
    if coordinator is None or loop is None or loop.is_closed():
        return False
    loop.call_soon_threadsafe(coordinator.request_rejoin)
    return True


def watch_recovery(app: Any, stall_s: Callable[[], float], stalled: Callable[[list], None],
                   done: Callable[[], bool], every_s: float = RECOVERY_CHECK_S) -> threading.Thread:
    """A thread that calls ``stalled`` with the partitions of a Table recovery that read
    nothing for ``stall_s()`` seconds (liveness.RecoveryStall), until ``done()``; 0 is off."""
    def watch() -> None:
        stall: RecoveryStall | None = None
        while not done():
            time.sleep(every_s)
            limit = stall_s()
            if not limit:
                stall = None
                continue
            if stall is None or stall.stall_s != limit:
                stall = RecoveryStall(limit)
            seen = recovery_progress(app)
            if seen is None:
                continue
            short = stall.observe(*seen)
            if short and not done():
                stalled(short)

    t = threading.Thread(target=watch, name="grudge-recovery-watch", daemon=True)
    t.start()
    return t
