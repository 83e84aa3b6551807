"""``/live``'s watch on a member that holds no partition (liveness.GroupProgress) and the
worker's exit codes."""
from __future__ import annotations

import pytest

from grudge_stream.exceptions import (
    EXIT_FAULT, EXIT_USER_ERROR, CheckpointError, ConfigError, DeliveryError, ForeignDeployment,
    PartitionCountChanged, SnapshotRefused, WorkerFault, exit_code,
)
from grudge_stream.liveness import GroupProgress, Liveness
from grudge_stream.runtime.core import TransactionStuck


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def progress(clock: Clock) -> GroupProgress:
    return GroupProgress(30.0, position=lambda: None, interval_s=10.0, clock=clock)


def test_a_member_holding_partitions_is_live() -> None:
    clock = Clock()
    g = progress(clock)
    for _ in range(10):
        clock.t += 10
        g.tick(True)
    assert g.alive


def test_an_idle_member_is_live_while_the_group_commits_or_nothing_arrives() -> None:
    clock = Clock()
    g = progress(clock)
    committed, end = 100, 100
    for i in range(20):
        clock.t += 10
        end += 50
        committed += 50 if i % 2 == 0 else 0  # another member consumes, commit by commit
        g.observe((committed, end))
        assert g.alive
    for _ in range(10):  # a quiet topic: nothing to consume
        clock.t += 10
        g.observe((committed, end))
        assert g.alive


def test_an_idle_member_fails_once_records_arrive_and_nobody_commits() -> None:
    clock = Clock()
    g = progress(clock)
    g.observe((100, 100))
    end = 100
    for _ in range(3):
        clock.t += 10
        end += 50
        g.observe((100, end))
    assert g.alive  # 30 s: at the bound
    clock.t += 10
    end += 50
    g.observe((100, end))
    assert not g.alive
    top = Liveness(60.0, clock=clock)
    top.watch("group", g)
    status, body = top.status()
    assert status == 503 and body["parts"]["group"]["live"] is False
    g.tick(True)  # assigned again
    assert g.alive and top.status()[0] == 200


def test_an_unanswered_probe_is_not_the_members_fault() -> None:
    clock = Clock()
    g = progress(clock)
    g.observe((100, 100))
    for _ in range(10):
        clock.t += 10
        g.observe(None)
    assert g.alive


@pytest.mark.parametrize("exc, code", [
    (ConfigError("x"), EXIT_USER_ERROR),
    (SnapshotRefused("x"), EXIT_USER_ERROR),
    (ForeignDeployment("x"), EXIT_USER_ERROR),
    (PartitionCountChanged("x"), EXIT_USER_ERROR),
    (CheckpointError("x"), EXIT_FAULT),
    (DeliveryError("x"), EXIT_FAULT),
    (WorkerFault("x"), EXIT_FAULT),
    (TransactionStuck("x"), EXIT_FAULT),
])
def test_exit_codes(exc: Exception, code: int) -> None:
    assert exit_code(exc) == code
    assert EXIT_FAULT not in (0, EXIT_USER_ERROR)


def test_the_aiokafka_attributes_the_coordination_watch_reads() -> None:
    """runtime.faust.watchers.coordination_failure reads aiokafka's private attributes: a release that
    renames them must fail here, not leave fenced Faust workers running idle."""
    import inspect

    from aiokafka.consumer.consumer import AIOKafkaConsumer
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    assert "self._coordination_task = " in inspect.getsource(GroupCoordinator)
    assert "self._closing = " in inspect.getsource(GroupCoordinator)
    assert "self._coordinator = GroupCoordinator(" in inspect.getsource(AIOKafkaConsumer)
    assert "self._consumer = " in inspect.getsource(AIOKafkaConsumerThread)


def test_coordination_failure_reads_a_finished_task() -> None:
    import asyncio
    from types import SimpleNamespace

    from grudge_stream.runtime.faust.watchers import coordination_failure

    async def scenario() -> tuple:
        async def boom() -> None:
            raise RuntimeError("assignment for another incarnation")

        task = asyncio.ensure_future(boom())
        await asyncio.sleep(0)
        closing = asyncio.get_running_loop().create_future()
        coord = SimpleNamespace(_coordination_task=task, _closing=closing)
        app = SimpleNamespace(_consumer=SimpleNamespace(_thread=SimpleNamespace(
            _consumer=SimpleNamespace(_coordinator=coord))))
        failed = coordination_failure(app)
        closing.set_result(None)
        return failed, coordination_failure(app), coordination_failure(SimpleNamespace(_consumer=None))

    failed, closing, none = asyncio.run(scenario())
    assert failed is not None and "another incarnation" in failed
    assert closing is None and none is None


def test_a_recovery_that_reads_nothing_is_reported_after_stall_s() -> None:
    from grudge_stream.liveness import RecoveryStall

    clock = Clock()
    stall = RecoveryStall(60.0, clock=clock)
    progress = {"c[0]": (-1, 2000), "c[1]": (500, 500)}
    assert stall.observe(True, progress) is None
    clock.t += 59
    assert stall.observe(True, progress) is None
    clock.t += 2
    assert stall.observe(True, progress) == [("c[0]", (-1, 2000))]  # only the partition short of its offset
    clock.t += 30
    assert stall.observe(True, progress) is None  # asked once per stall_s
    clock.t += 31
    assert stall.observe(True, progress) == [("c[0]", (-1, 2000))]
    assert stall.stalls == 2


def test_a_slow_recovery_that_moves_or_no_recovery_is_never_reported() -> None:
    from grudge_stream.liveness import RecoveryStall

    clock = Clock()
    stall = RecoveryStall(10.0, clock=clock)
    for read in range(0, 2000, 10):  # 1 record per second for a long time
        clock.t += 9
        assert stall.observe(True, {"c[0]": (read, 5000)}) is None
    for _ in range(10):  # done, or not recovering: nothing to report however long
        clock.t += 60
        assert stall.observe(True, {"c[0]": (5000, 5000)}) is None
        assert stall.observe(False, {"c[0]": (10, 5000)}) is None
    with pytest.raises(ConfigError):
        RecoveryStall(0)


def test_the_faust_attributes_the_recovery_watch_reads() -> None:
    """runtime.faust.watchers.recovery_progress and request_rebalance read Faust's and aiokafka's
    private attributes: a release that renames them must fail here."""
    import inspect

    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from faust.tables.manager import TableManager
    from faust.tables.recovery import Recovery
    from mode.threads import ServiceThread

    src = inspect.getsource(Recovery)
    for attr in ("self.active_offsets", "self.active_highwaters", "self.active_tps", "self.in_recovery = "):
        assert attr in src, attr
    assert "self._recovery = " in inspect.getsource(TableManager)
    assert "def request_rejoin(self)" in inspect.getsource(GroupCoordinator)
    assert "self.thread_loop = " in inspect.getsource(ServiceThread)


def test_recovery_progress_reads_a_stalled_recovery_and_asks_for_a_rebalance() -> None:
    import asyncio
    import threading
    from types import SimpleNamespace

    from grudge_stream.runtime.faust.watchers import recovery_progress, request_rebalance

    recovery = SimpleNamespace(in_recovery=True, active_tps={"c[0]", "c[1]"},
                               active_offsets={"c[0]": -1, "c[1]": 40}, active_highwaters={"c[0]": 99, "c[1]": 40})

    class App:
        pass

    app = App()
    assert recovery_progress(app) is None  # no tables made: none made here
    app.__dict__["tables"] = SimpleNamespace(_recovery=recovery)
    assert recovery_progress(app) == (True, {"c[0]": (-1, 99), "c[1]": (40, 40)})

    loop = asyncio.new_event_loop()
    asked = threading.Event()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        app._consumer = SimpleNamespace(_thread=SimpleNamespace(
            thread_loop=loop, _consumer=SimpleNamespace(_coordinator=SimpleNamespace(request_rejoin=asked.set))))
        assert request_rebalance(app)
        assert asked.wait(5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()
    assert not request_rebalance(App())
