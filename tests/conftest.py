"""Shared fixtures: a real Kafka broker for the tests that need one.

``kafka_bootstrap`` (session scope) yields a bootstrap address, taken from the
first of these that works:

1. ``KAFKA_BOOTSTRAP_SERVERS`` when set (a broker someone else runs);
2. a testcontainers ``apache/kafka`` container when a Docker engine answers;
3. a local single-node KRaft broker from Apache Kafka's jars
   (``grudge_devkafka.LocalKafka`` from tools/devkafka; jars via Maven, cached in .cache/).

``GRUDGE_KAFKA_BACKEND=local|docker`` skips the detection and forces one
backend. Tests that use ``kafka_bootstrap`` (directly or through
``make_topic``) get the ``kafka`` marker automatically, so ``-m "not kafka"``
runs everything that needs no broker.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping

import pytest

KAFKA_MARKER = "kafka: needs a real Kafka broker (started by the session fixture)"


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so the marker works whatever pyproject.toml says.
    config.addinivalue_line("markers", KAFKA_MARKER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)


def _docker_engine_answers() -> bool:
    """True if a Docker engine replies to a ping within a couple of seconds."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no SDK, no socket, no engine, a refusal: all mean "no"
        return False


def _testcontainers_kafka() -> Iterator[str]:
    """An ``apache/kafka`` KRaft container published on 127.0.0.1 only.

    The client port is bound to a fixed free host port so that the advertised
    listener (which clients reconnect to) can be known before the container
    starts.
    """
    from testcontainers.core.container import DockerContainer

    from grudge_devkafka import free_port, kafka_version, new_cluster_id, wait_until_ready

    image = os.environ.get("GRUDGE_KAFKA_IMAGE", f"apache/kafka:{kafka_version()}")
    host_port = free_port()
    env = {
        "CLUSTER_ID": new_cluster_id(),
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{host_port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "4",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_NUM_PARTITIONS": "1",
    }
    container = DockerContainer(image)
    for key, value in env.items():
        container = container.with_env(key, value)
    # docker-py accepts (host_ip, host_port): publish on loopback only.
    container.ports["9092/tcp"] = ("127.0.0.1", host_port)  # type: ignore[assignment]
    try:
        container.start()
        bootstrap = f"127.0.0.1:{host_port}"
        wait_until_ready(bootstrap, time.monotonic() + 90)
        yield bootstrap
    finally:
        container.stop()


def _local_kafka() -> Iterator[str]:
    from grudge_devkafka import LocalKafka

    with LocalKafka() as kafka:  # temp state dir, deleted at stop
        assert kafka.bootstrap is not None
        yield kafka.bootstrap


@pytest.fixture(scope="session", autouse=True)
def _state_dir_outside_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Workers a test starts without a ``state_dir`` keep Faust's data directory in a session
    temp dir, not in the user's ~/.local/state (grudge_stream.statedir honours XDG_STATE_HOME)."""
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    yield
    if old is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = old


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address ``host:port`` of a real Kafka broker for this session."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        yield given
        return
    backend = os.environ.get("GRUDGE_KAFKA_BACKEND", "auto").lower()
    if backend not in ("auto", "docker", "local"):
        raise pytest.UsageError(
            f"GRUDGE_KAFKA_BACKEND must be auto, docker or local, not {backend!r}"
        )
    if backend == "docker" or (backend == "auto" and _docker_engine_answers()):
        yield from _testcontainers_kafka()
    else:
        yield from _local_kafka()


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str):
    """A confluent-kafka AdminClient on the session broker."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": kafka_bootstrap, "logger": client_logger()})


def client_logger() -> logging.Logger:
    """Route librdkafka's log lines through logging instead of raw stderr.

    pytest shows them with a failing test's captured logs; the NullHandler
    keeps "broker went away" noise from clients that outlive the session
    broker off the terminal.
    """
    log = logging.getLogger("tests.kafka.client")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
    return log


def create_topic(
    admin,
    name: str,
    partitions: int = 1,
    *,
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> str:
    """Create ``name`` and wait until every partition has a leader."""
    from confluent_kafka.admin import NewTopic

    futures = admin.create_topics(
        [
            NewTopic(
                name, num_partitions=partitions, replication_factor=1, config=dict(config or {})
            )
        ],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    futures[name].result(timeout)
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if (
            md is not None
            and md.error is None
            and len(md.partitions) == partitions
            and all(p.leader >= 0 for p in md.partitions.values())
        ):
            return name
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name} has no leader for every partition after {timeout} s")
        time.sleep(0.05)


@pytest.fixture
def make_topic(request: pytest.FixtureRequest, kafka_admin) -> Iterator[Callable[..., str]]:
    """Factory: ``make_topic(4, config={...}, suffix="in")`` returns a fresh unique topic name.

    Names carry the test name and a random part, so reruns against a shared
    broker never collide. The topics are deleted after the test.
    """
    from confluent_kafka import KafkaException

    created: list[str] = []
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:80].strip("-")

    def factory(
        partitions: int = 1, *, config: Mapping[str, str] | None = None, suffix: str = ""
    ) -> str:
        name = f"t-{slug}-{suffix + '-' if suffix else ''}{uuid.uuid4().hex[:8]}"
        create_topic(kafka_admin, name, partitions, config=config)
        created.append(name)
        return name

    yield factory
    if created:
        for name, future in kafka_admin.delete_topics(created, operation_timeout=10).items():
            try:
                future.result(15)
            except (KafkaException, TimeoutError) as exc:  # best effort: broker may be gone
                client_logger().warning("could not delete topic %s: %s", name, exc)
