"""The native ingest path's pieces without a broker: it loads from the librdkafka confluent-kafka
ships, the handle it takes from a confluent-kafka Consumer is that consumer's (the object
layout it relies on, pinned), its fetcher's life cycle, and the ``ingest`` setting."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import confluent_kafka
import pytest
from confluent_kafka import Consumer, Producer

from grudge_stream.exceptions import ConfigError
from grudge_stream.runtime import native
from grudge_stream.settings import setting
from grudge_stream.topology import Settings

NOWHERE = "127.0.0.1:9"  # nothing listens: these consumers never reach a broker


def _consumer(client_id: str = "grudge-pin") -> Consumer:
    return Consumer({"bootstrap.servers": NOWHERE, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                     "client.id": client_id, "log_level": 0})


def test_it_loads_here_from_the_librdkafka_confluent_kafka_loaded() -> None:
    assert native.unavailable() is None
    path = native.librdkafka_path()
    assert path and os.path.basename(path).startswith("librdkafka")
    # The copy inside the confluent-kafka wheel (auditwheel's confluent_kafka.libs).
    assert "confluent_kafka.libs" in path
    from grudge_stream._cyext import _native

    assert _native.loaded()
    assert _native.version() == confluent_kafka.libversion()[1]


def test_a_library_that_is_not_loaded_is_refused_not_loaded() -> None:
    from grudge_stream._cyext import _native

    why = _native.load("/nonexistent/librdkafka.so.1")
    assert _native.loaded()  # already loaded: the first load stands
    assert why is None or "not loaded" in why


def test_the_handle_is_the_consumers_own() -> None:
    """Pins confluent-kafka's client object layout (PyObject_HEAD, then rd_kafka_t *): the
    handle read from it names the consumer's client.id and is a consumer handle. A changed
    layout fails here, loudly, before any worker reads through it."""
    from grudge_stream._cyext import _native

    c1, c2 = _consumer("grudge-pin-a"), _consumer("grudge-pin-b")
    try:
        name1, kind1 = _native.client_identity(c1)
        name2, kind2 = _native.client_identity(c2)
        assert name1.startswith("grudge-pin-a#consumer-") and name2.startswith("grudge-pin-b#consumer-")
        assert kind1 == kind2 == 1  # RD_KAFKA_CONSUMER
    finally:
        c1.close()
        c2.close()
    with pytest.raises(RuntimeError, match="closed"):
        _native.client_identity(c1)
    p = Producer({"bootstrap.servers": NOWHERE, "log_level": 0})
    with pytest.raises(TypeError):
        _native.client_identity(p)


def test_the_fetcher_splits_releases_and_closes_before_its_consumer() -> None:
    c = _consumer()
    r = native.NativeReader(c, "some-topic", 100)
    r.split([0, 1, 2])
    r.split([2, 3])
    assert r.fetch.partitions == [0, 1, 2, 3]
    assert r.fetch.fetch(10, 0) == ({}, [], 0)
    r.release([1, 7])
    assert r.fetch.partitions == [0, 2, 3]
    r.close()
    assert r.fetch.closed and r.fetch.partitions == []
    r.close()  # twice: nothing
    r.release([0])
    with pytest.raises(RuntimeError):
        r.fetch.fetch(10, 0)
    with pytest.raises(RuntimeError):
        r.split([5])
    c.close()


def test_a_fetcher_left_open_is_not_touched_once_its_consumer_closed() -> None:
    c = _consumer()
    r = native.NativeReader(c, "some-topic", 10)
    r.split([0])
    c.close()  # the consumer went first: its handle is gone, so the fetcher must not use it
    with pytest.raises(RuntimeError):
        r.fetch.fetch(1, 0)
    r.close()
    del r


def test_the_ingest_setting_chooses_explicitly() -> None:
    assert setting(Settings({}, environ={}), "ingest") == "auto"
    assert setting(Settings({"ingest": "python"}, environ={}), "ingest") == "python"
    with pytest.raises(ConfigError):
        setting(Settings({"ingest": "fast"}, environ={}), "ingest")
    c = _consumer()
    try:
        assert native.open_reader("python", c, "t", 10, columns=True) is None
        auto = native.open_reader("auto", c, "t", 10, columns=True)
        assert isinstance(auto, native.NativeReader)
        auto.close()
        # Operators that read headers take records: today's path, or a refusal when asked for native.
        assert native.open_reader("auto", c, "t", 10, columns=False) is None
        with pytest.raises(ConfigError, match="ingest=native"):
            native.open_reader("native", c, "t", 10, columns=False)
        with pytest.raises(ConfigError):
            native.open_reader("turbo", c, "t", 10, columns=True)
    finally:
        c.close()


def test_native_unavailable_runs_todays_path_with_one_line_or_refuses(monkeypatch, caplog) -> None:
    monkeypatch.setattr(native, "_reason", ["the native ingest module is not built (test)"])
    c = _consumer()
    try:
        with caplog.at_level("INFO", logger="grudge_stream.runtime"):
            assert native.open_reader("auto", c, "t", 10, columns=True) is None
        lines = [r.getMessage() for r in caplog.records if "ingest" in r.getMessage()]
        assert len(lines) == 1 and "not built (test)" in lines[0]
        with pytest.raises(ConfigError, match="not built"):
            native.open_reader("native", c, "t", 10, columns=True)
    finally:
        c.close()


def _preloadable(lib: str) -> bool:
    out = subprocess.run([sys.executable, "-c", "pass"], env={**os.environ, "LD_PRELOAD": lib},
                         capture_output=True, timeout=60)
    return out.returncode == 0 and b"cannot be preloaded" not in out.stderr


_ALLOCATOR = ("from grudge_stream.runtime import native; import logging, sys; "
              "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s'); "
              "from confluent_kafka import Consumer; "
              "c = Consumer({'bootstrap.servers': '127.0.0.1:9', 'group.id': 'g', 'log_level': 0}); "
              "r = native.open_reader('auto', c, 't', 10); print(native.allocator()); r.close(); c.close()")


@pytest.mark.parametrize("preload", ["", "libjemalloc.so.2"])
def test_the_allocator_is_named_in_the_start_line(preload: str, tmp_path) -> None:
    """``allocator()`` reads what is mapped: the C library's malloc unless an allocator is
    preloaded; the native path's start-up line says which, and how to get jemalloc."""
    if preload and not _preloadable(preload):
        pytest.skip(f"{preload} is not installed here")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run([sys.executable, "-c", _ALLOCATOR], env=env, capture_output=True, text=True,
                         timeout=120, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    *lines, name = out.stdout.strip().splitlines()
    (start,) = [ln for ln in lines if ln.startswith("ingest: native")]
    if preload:
        assert name == "jemalloc" and "allocator jemalloc)" in start
    else:
        assert name == "system" and "allocator system, jemalloc took" in start
