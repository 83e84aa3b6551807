"""A worker's start-up rules, for every way of starting one.

``grudge-stream worker``, ``run_batch_worker`` and ``build_app`` (the Faust runtime, also under
``faust worker``) all pass through ``start_checks`` before joining their group, so a worker
used as a library keeps the same rules as the command line: the refusals (exactly-once on
the Faust runtime, security aiokafka cannot apply, a taken web port, a group consumed by the
other runtime, another deployment's topics), the topology's topics, and the overrides
follower started before any partition is restored.

Every refusal is a ``ConfigError`` of one line (exit 2 from the CLI), raised before the worker
writes anything; checks that meet a cluster still starting retry for up to ``broker_wait_s``.
"""
from __future__ import annotations

import socket

from grudge_stream.exceptions import ConfigError
from grudge_stream.sections import sections
from grudge_stream.topology import Settings, Topology

RUNTIMES = ("batch", "faust")


def check_web_port(host: str, port: int) -> None:
    """The worker's web port is free (a second worker on one machine without --web-port
    would die on it later with a traceback): one line instead."""
    if not port:
        return  # 0: any free port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"web_host {host!r}: {exc}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            raise ConfigError(f"web port {host}:{port} is not free ({exc.strerror}): another worker on this "
                              "machine? Give each worker its own --web-port (or --set web_port=...)") from None


def start_checks(topology: Topology, settings: Settings, runtime: str, *, create_topics: bool = True,
                 partitions: int | None = None, create_source: bool = False) -> dict:
    """Every rule a worker of ``runtime`` ("batch" or "faust") obeys before joining its group;
    returns the clients' configuration. Idempotent per topology: a second call (the CLI, then
    ``build_app``) checks again but starts no second overrides follower."""
    from grudge_stream.deployments import check_own_topics
    from grudge_stream.kafkaconf import check_connection, client_config
    from grudge_stream.overrides import start_override_follower
    from grudge_stream.signing import SigningKeys
    from grudge_stream.topics import check_group_runtime, ensure_topology_topics, wait_for_cluster

    if runtime not in RUNTIMES:
        raise ConfigError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
    cfg = sections(settings)
    if runtime == "faust" and cfg.checkpointing.exactly_once:
        raise ConfigError(
            "exactly_once needs the batch runtime (--runtime batch): a transaction must commit the "
            "source offsets with the consuming client's group metadata, and the Faust runtime consumes "
            "with aiokafka while outputs and snapshots go through confluent-kafka (docs/runtime.md)")
    if runtime == "faust":
        from grudge_stream.kafkaconf import faust_options
        from grudge_stream.statedir import app_state_dir

        faust_options(settings)  # refuses, before connecting, security aiokafka cannot apply
        app_state_dir(settings, topology.app_id, temporary_fallback=True)  # Faust's data directory
    if runtime == "batch" or cfg.serving.web_enabled:
        check_web_port(cfg.serving.web_host, cfg.serving.web_port)
    conf = client_config(settings)
    check_connection(settings)  # a wrong password or TLS setup: one line, not clients retrying for ever
    wait_s = cfg.kafka.broker_wait_s
    if create_topics:
        # A cluster that answers metadata may still be electing leaders or creating internal
        # topics: the checks below retry until broker_wait_s, then exit with one line.
        wait_for_cluster("creating the topology's topics", lambda: ensure_topology_topics(
            topology, settings.bootstrap_servers, partitions=partitions, create_source=create_source,
            timestamp_bounds=True, client_config=conf,
            replication_factor=cfg.identity.replication_factor), wait_s, settings.bootstrap_servers)
    check_group_runtime(settings.bootstrap_servers, topology.app_id, runtime, client_config=conf, wait_s=wait_s,
                        source_topic=topology.source_topic)
    check_own_topics(topology, settings.bootstrap_servers, conf, settings)  # one deployment's topics
    if topology.overrides is None:
        start_override_follower(topology, settings.bootstrap_servers, conf,  # before any partition is restored
                                signing=SigningKeys.from_settings(cfg.serving))
    return conf
