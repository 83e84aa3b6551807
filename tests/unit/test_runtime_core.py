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
