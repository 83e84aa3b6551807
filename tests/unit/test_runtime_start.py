"""The start-up rules hold for a worker started from Python, not only by the CLI: each
refusal is one ConfigError, raised before any client connects (grudge_stream.runtime.start)."""
from __future__ import annotations

import socket

import pytest

from grudge_stream.exceptions import ConfigError
from grudge_stream.topology import Settings, load_topology

SEED = "0123456789abcdef0123456789abcdef"
# Nothing listens here: a rule that connected first would fail differently (and slowly).
NOWHERE = {"bootstrap_servers": "127.0.0.1:1", "broker_wait_s": "1"}


def _topology(**settings):
    s = Settings({"seed": SEED, **NOWHERE, **settings}, environ={})
    return load_topology("abuse_scores", s), s


def test_build_app_refuses_exactly_once_before_connecting() -> None:
    from grudge_stream.runtime.faust.worker import build_app

    topology, settings = _topology(exactly_once="true")
    with pytest.raises(ConfigError, match="exactly_once needs the batch runtime"):
        build_app(topology, settings)


def test_run_batch_worker_refuses_a_taken_web_port_before_connecting() -> None:
    from grudge_stream.runtime.batch import run_batch_worker

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        topology, settings = _topology(web_host="127.0.0.1", web_port=str(port))
        with pytest.raises(ConfigError, match=f"web port 127.0.0.1:{port} is not free"):
            run_batch_worker(topology, settings)
    assert topology.overrides is None  # nothing started


def test_an_unknown_runtime_is_one_line() -> None:
    from grudge_stream.runtime.start import start_checks

    topology, settings = _topology()
    with pytest.raises(ConfigError, match="runtime must be one of batch, faust, not 'flink'"):
        start_checks(topology, settings, "flink")
