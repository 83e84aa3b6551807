"""The runtime-neutral pieces both runtimes share: checkpoint cadence, declared setting
defaults, the one producer configuration."""
from __future__ import annotations

import pytest

from grudge_stream.kafkaconf import PRODUCER_MAX_MESSAGE_BYTES, producer_config
from grudge_stream.runtime.core import CheckpointCadence
from grudge_stream.settings import COMMON, setting
from grudge_stream.topology import Settings


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_cadence_is_due_an_interval_after_the_last_round() -> None:
    clock = FakeClock()
    c = CheckpointCadence(5.0, clock)
    assert not c.due()
    clock.t = 104.999
    assert not c.due()
    clock.t = 105.0
    assert c.due()
    clock.t = 107.0
    c.done()  # a round (successful or not) restarts the interval from its end
    clock.t = 111.9
    assert not c.due()
    clock.t = 112.0
    assert c.due()


def test_zero_interval_is_always_due() -> None:
    clock = FakeClock()
    c = CheckpointCadence(0.0, clock)
    assert c.due()
    c.done()
    assert c.due()


@pytest.mark.parametrize("decl", [s for s in COMMON if not callable(s.default)], ids=lambda s: s.name)
def test_setting_reads_the_declared_default(decl) -> None:
    assert setting(Settings({}, environ={}), decl.name) == decl.default


def test_setting_reads_an_override_before_the_default() -> None:
    assert setting(Settings({"checkpoint_interval_s": "7.5"}, environ={}), "checkpoint_interval_s") == 7.5
    with pytest.raises(KeyError):
        setting(Settings({}, environ={}), "no_such_setting")


def test_producer_config_keeps_its_guarantees_over_client_properties() -> None:
    conf = producer_config({"acks": "1", "enable.idempotence": False, "security.protocol": "SSL",
                            "compression.type": "zstd"}, bootstrap_servers="h:1", linger_ms=0)
    assert conf["acks"] == "all" and conf["enable.idempotence"] is True  # never weakened
    assert conf["security.protocol"] == "SSL"
    assert conf["compression.type"] == "zstd"  # a tuning property may pass through
    assert conf["linger.ms"] == 0 and conf["bootstrap.servers"] == "h:1"
    assert conf["message.max.bytes"] == PRODUCER_MAX_MESSAGE_BYTES


def test_producer_config_extra_comes_last() -> None:
    conf = producer_config({}, extra={"transactional.id": "t-1", "acks": "1"})
    assert conf["transactional.id"] == "t-1"
    assert conf["acks"] == "1"  # the caller's own override, on purpose
    assert "bootstrap.servers" not in conf
    assert "message.max.bytes" not in producer_config({}, max_message_bytes=None)


def test_open_transaction_wait_defaults_to_the_brokers_abort_time_and_zero_means_none() -> None:
    from grudge_stream.checkpoint import BROKER_ABORT_CHECK_INTERVAL_S, OPEN_TRANSACTION_MARGIN_S
    from grudge_stream.runtime.core import open_transaction_wait

    default = open_transaction_wait(Settings({}, environ={}))
    assert default == 60.0 + BROKER_ABORT_CHECK_INTERVAL_S + OPEN_TRANSACTION_MARGIN_S
    assert open_transaction_wait(Settings({"transaction_timeout_s": 20.0}, environ={})) == default - 40.0
    assert open_transaction_wait(Settings({"open_transaction_wait_s": 0.0}, environ={})) == 0.0
    assert open_transaction_wait(Settings({"open_transaction_wait_s": 7.5}, environ={})) == 7.5


def _budget_core(budget_s: float, rate: float, slots: dict, max_age_s: float = 3600.0):
    from types import SimpleNamespace

    from grudge_stream.runtime.checkpointer import SnapshotBudget

    held = SimpleNamespace(slots={p: SimpleNamespace(partition=p, dirty=dirty, unsnapshotted=n, last_snapshot_wall=wall)
                                  for p, (dirty, n, wall) in slots.items()})
    budget = SnapshotBudget(budget_s, max_age_s, held)  # the worker core's budget part, on these slots
    budget.rate = SimpleNamespace(per_s=rate)
    return budget


def test_the_snapshot_budget_holds_for_the_workers_whole_restore() -> None:
    # 1,000 records/s: 5 s of budget = 5,000 records over all partitions.
    core = _budget_core(5.0, 1000.0, {0: (True, 1500, 100.0), 1: (True, 1500, 100.0), 2: (True, 1000, 100.0)})
    assert core.due_snapshots(now=101.0) == [], "4,000 records: within the budget, nothing is written"
    core.holder.slots[2].unsnapshotted = 2500  # now 5,500: the largest go first until half the budget is left
    assert [s.partition for s in core.due_snapshots(now=101.0)] == [2, 0]
    core.holder.slots[1].dirty, core.holder.slots[1].unsnapshotted = False, 0  # an idle partition is never rewritten
    core.holder.slots[2].unsnapshotted = 4000
    assert [s.partition for s in core.due_snapshots(now=101.0)] == [2]
    # A snapshot past snapshot_max_age_s is due whatever the budget.
    old = _budget_core(5.0, 1000.0, {0: (True, 1, 0.0), 1: (True, 1, 100.0)}, max_age_s=60.0)
    assert [s.partition for s in old.due_snapshots(now=100.0)] == [0]
    # Budget 0: every changed partition, every round.
    every = _budget_core(0.0, 1000.0, {0: (True, 1, 100.0), 1: (False, 0, 100.0), 2: (True, 5, 100.0)})
    assert [s.partition for s in every.due_snapshots(now=101.0)] == [0, 2]


def test_the_restore_budget_report_names_the_partitions_past_it() -> None:
    core = _budget_core(2.0, 1000.0, {0: (True, 2000, 100.0), 1: (True, 0, 100.0)})
    report = core.replay_report()
    assert report[0]["replay_records"] == 2000 and report[0]["replay_s"] == 2.0
    assert core.budget_exceeded(report) == [], "2 s is within 1.5x a 2 s budget"
    core.holder.slots[0].unsnapshotted = 3500
    assert core.budget_exceeded(core.replay_report()) == [0]


class _Consumer:
    """Answers committed() from a script: an exception or a list of partitions per call."""

    def __init__(self, answers) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.confs: list[dict] = []

    def __call__(self, conf):  # stands in for confluent_kafka.Consumer: one per attempt
        self.confs.append(conf)
        return self

    def committed(self, partitions, timeout=None):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def close(self) -> None:
        pass


def _core_like(consumer, wait_s: float, monkeypatch):
    import logging

    import confluent_kafka

    from grudge_stream.runtime.commits import GroupOffsets

    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    offsets = GroupOffsets("app", "events", Settings({"broker_wait_s": wait_s}), {}, logging.getLogger("test"))
    return offsets.committed


def _result(offsets: dict[int, int], errors: dict | None = None):
    import types

    return [types.SimpleNamespace(topic="events", partition=p, offset=o, error=(errors or {}).get(p))
            for p, o in offsets.items()]


def test_group_committed_waits_out_an_open_transactions_offsets_never_reading_them_as_none(monkeypatch) -> None:
    from confluent_kafka import KafkaError, KafkaException

    unstable = KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT)
    admin = _Consumer([_result({0: -1001, 1: 40}, errors={0: unstable}), _result({0: 12, 1: 40})])
    # broker_wait_s 0.1 is over before the retry: an open transaction is waited out for longer
    assert _core_like(admin, 0.1, monkeypatch)([0, 1]) == {0: 12, 1: 40}
    assert admin.calls == 2
    # the group's own consumer (never joining it), asking for stable offsets only
    assert admin.confs[0]["group.id"] == "app" and admin.confs[0]["isolation.level"] == "read_committed"
    # an open transaction's offsets, as librdkafka's consumer reports them: a timeout, waited out too
    admin = _Consumer([KafkaException(KafkaError(KafkaError._TIMED_OUT)), _result({0: 12})])
    assert _core_like(admin, 0.1, monkeypatch)([0]) == {0: 12}


def test_group_committed_retries_a_loading_coordinator_then_answers(monkeypatch) -> None:
    from confluent_kafka import KafkaError, KafkaException

    loading = KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS))
    admin = _Consumer([loading, KafkaException(KafkaError(KafkaError.NOT_COORDINATOR)), _result({0: 17, 1: -1001})])
    assert _core_like(admin, 30.0, monkeypatch)([0, 1]) == {0: 17}  # partition 1 has no committed offset
    assert admin.calls == 3


def test_group_committed_gives_up_after_broker_wait_s_and_at_once_on_a_refusal(monkeypatch) -> None:
    from confluent_kafka import KafkaError, KafkaException

    down = KafkaException(KafkaError(KafkaError._TRANSPORT))
    admin = _Consumer([down] * 50)
    with pytest.raises(KafkaException):
        _core_like(admin, 0.6, monkeypatch)([0])
    assert 2 <= admin.calls <= 4  # retried with backoff, within broker_wait_s
    refused = KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    admin = _Consumer([refused, _result({0: 1})])
    with pytest.raises(KafkaException):
        _core_like(admin, 30.0, monkeypatch)([0])
    assert admin.calls == 1


def test_a_slow_shutdown_reports_its_progress(caplog) -> None:
    import logging
    import time
    from types import SimpleNamespace

    from grudge_stream.runtime.core import WorkerCore

    core = SimpleNamespace(log=logging.getLogger("grudge_stream.test_stop"))

    def reports() -> list:
        return [r for r in caplog.records if "final snapshots still running after" in r.getMessage()]
    with caplog.at_level(logging.INFO, logger="grudge_stream.test_stop"):
        t0 = time.monotonic()
        with WorkerCore.shutdown_progress(core, "final snapshots", every_s=0.05):
            # Until three reports (a loaded machine wakes the reporter late), at least 0.3 s.
            while time.monotonic() - t0 < 0.3 or (len(reports()) < 3 and time.monotonic() - t0 < 10):
                time.sleep(0.01)
        elapsed = time.monotonic() - t0
    still = reports()
    # One report per 0.05 s at most: never more than the time allows.
    assert 3 <= len(still) <= elapsed / 0.05 + 1 and all(r.levelno == logging.WARNING for r in still)
    assert "killing the worker loses nothing" in still[0].getMessage()
    assert caplog.records[-1].getMessage().startswith("stopping: final snapshots done after")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="grudge_stream.test_stop"):
        with WorkerCore.shutdown_progress(core, "final snapshots", every_s=5):
            pass
    assert caplog.records == []  # a quick one says nothing


def test_a_transactional_call_is_resumed_while_it_fails_retriably_and_given_up_when_it_blocks() -> None:
    import threading
    import time

    from confluent_kafka import KafkaError, KafkaException

    from grudge_stream.runtime.core import TransactionStuck, _resume

    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:  # what commit_transaction raises while the cluster is away
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "retry call to resume", retriable=True))
        return "committed"

    assert _resume(flaky, limit_s=5) == "committed" and len(calls) == 3

    def refused() -> None:
        raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))

    with pytest.raises(KafkaException, match="fenced"):
        _resume(refused, limit_s=5)

    # A call that blocks past its own timeout (librdkafka's send_offsets_to_transaction with
    # the group coordinator gone): given up after the limit, never waited for.
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(TransactionStuck):
        _resume(lambda: release.wait(30), limit_s=0.3)
    assert time.monotonic() - t0 < 5
    release.set()


def test_exactly_once_replaces_a_fenced_or_stuck_producer_but_not_one_fenced_twice_in_a_row() -> None:
    """A producer the broker fenced after an outage, or one stuck inside a call, is replaced
    and the held partitions reset; fenced again within a minute means a second live
    instance shares the transactional id: that ends the worker (raised)."""
    import types

    from confluent_kafka import KafkaError, KafkaException

    from grudge_stream.runtime.batch import BatchWorker
    from grudge_stream.runtime.core import TransactionStuck
    from grudge_stream.sections import sections

    renewed: list[bool] = []
    aborted: list[int] = []
    core = types.SimpleNamespace(
        sections=sections(Settings({})),
        transactions=types.SimpleNamespace(transaction=types.SimpleNamespace(open=True)),
        checkpointer=types.SimpleNamespace(writer=None, queue=[1]),
        renew_producer=lambda stuck=False: renewed.append(stuck),
        metrics=types.SimpleNamespace(producers_renewed=types.SimpleNamespace(inc=lambda: None),
                                      transactions_aborted=types.SimpleNamespace(inc=lambda: aborted.append(1))))
    worker = types.SimpleNamespace(settings=Settings({}), core=core, reset_pending=False, _fenced_at=float("-inf"))
    worker._renew_producer = lambda exc, stuck=False: BatchWorker._renew_producer(worker, exc, stuck)
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))

    BatchWorker.abort_transaction(worker, fenced)
    assert renewed == [False] and worker.reset_pending and core.checkpointer.queue == [] and aborted == [1]
    BatchWorker.abort_transaction(worker, TransactionStuck("blocked"))  # stuck: never counts as a fencing
    assert renewed == [False, True]
    with pytest.raises(KafkaException, match="fenced"):
        BatchWorker.abort_transaction(worker, fenced)  # fenced again at once
    assert renewed == [False, True]
    other_fatal = KafkaException(KafkaError(KafkaError._FATAL, "fatal", fatal=True))
    with pytest.raises(KafkaException):
        BatchWorker.abort_transaction(worker, other_fatal)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_background_rounds_run_in_order_on_one_kept_thread_that_close_ends() -> None:
    import threading

    from grudge_stream.runtime.checkpointer import WriterThread

    runner = WriterThread(name="test-writer")
    seen: list[tuple[int, int]] = []
    done = [threading.Event() for _ in range(3)]

    def job(i: int):
        def run() -> None:
            seen.append((i, threading.get_ident()))
            done[i].set()
        return run

    for i in range(2):
        runner.submit(job(i))
    assert done[1].wait(5)
    assert [i for i, _ in seen] == [0, 1]
    assert seen[0][1] == seen[1][1] != threading.get_ident()  # one thread, kept between rounds
    thread = runner._thread
    assert thread is not None and thread.daemon and thread.is_alive()

    # A round that raises ends the thread; the next round starts another.
    runner.submit(lambda: 1 / 0)
    thread.join(5)
    assert not thread.is_alive()
    runner.submit(job(2))
    assert done[2].wait(5)
    assert runner._thread is not thread and runner._thread.is_alive()

    last = runner._thread
    runner.close()
    last.join(5)
    assert not last.is_alive()
    runner.close()  # twice is harmless
