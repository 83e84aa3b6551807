"""What the commands share: their settings (``--set``, ``--bootstrap-servers``), the
connection check of a client command, and the arguments that name a topology.
"""
from __future__ import annotations

import argparse

from grudge_stream.topology import Settings


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings a command's arguments give (``--set``, ``--bootstrap-servers``,
    ``--web-port``) over the environment's."""
    overrides: dict[str, str] = {}
    for item in args.set or []:
        if "=" not in item:
            raise SystemExit(f"--set takes name=value, got {item!r}")
        k, v = item.split("=", 1)
        overrides[k.strip()] = v
    if getattr(args, "bootstrap_servers", None):
        overrides["bootstrap_servers"] = args.bootstrap_servers
    if getattr(args, "web_port", None):
        overrides["web_port"] = str(args.web_port)
    settings = Settings(overrides)
    from grudge_stream.kafkaconf import use_properties_file_bootstrap

    use_properties_file_bootstrap(settings)  # kafka_properties_file's bootstrap.servers, if nothing else
    return settings


# How long a client command (alerts, override, create-topic, replay) waits for a cluster that
# does not answer before it says so and exits 2; a worker waits broker_wait_s.
CLIENT_WAIT_S = 10.0


def connect(settings: Settings, wait_s: float = CLIENT_WAIT_S) -> dict:
    """Check the Kafka connection once (a wrong password or TLS setup, or no answer within
    ``wait_s``, is one line, exit 2, instead of clients retrying for ever) and return the
    clients' configuration."""
    from grudge_stream.kafkaconf import check_connection, client_config

    conf = client_config(settings)
    check_connection(settings, wait_s=wait_s, warn=False)
    return conf


def existing_topics(conf: dict, names: list[str]) -> dict[str, int]:
    """Partition count of each of ``names`` that exists on the cluster."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"log_level": 3, **conf}).list_topics(timeout=CLIENT_WAIT_S)
    return {n: len(md.topics[n].partitions) for n in names if n in md.topics and md.topics[n].error is None}


def add_topology_arguments(p: argparse.ArgumentParser, embedded: bool = False) -> None:
    """The arguments that name a topology (``embedded``: or an embedded state) and set its
    settings."""
    if embedded:
        p.add_argument("topology", nargs="?", default=None,
                       help="shipped topology name (grudge_stream.topologies.<name>), dotted module, or .py path; "
                            "or, for sketch state in your own app, --state / --alerts-topic")
        p.add_argument("--state", default=None, metavar="NAME",
                       help="an embedded state (grudge_stream.state, docs/embedding.md) by its name: its topics "
                            "<NAME>-alerts-state and <NAME>-alerts-overrides")
        p.add_argument("--alerts-topic", default=None, metavar="TOPIC",
                       help="an embedded state whose alerts_topic was given: TOPIC-state and TOPIC-overrides")
    else:
        p.add_argument("topology", help="shipped topology name (grudge_stream.topologies.<name>), dotted module, "
                                        "or .py path")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="topology setting (overrides the GRUDGE_<NAME> environment variable)")
    p.add_argument("--bootstrap-servers", default=None,
                   help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS or 127.0.0.1:9092)")
