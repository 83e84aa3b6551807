"""A topology's topics and settings: ``grudge-stream topics`` (create them),
``grudge-stream describe`` (list the settings) and ``grudge-stream create-topic`` (a plain
topic, the source of a state in your own app).
"""
from __future__ import annotations

import argparse
import json

from grudge_stream.cli.common import add_topology_arguments, connect, existing_topics, settings_from
from grudge_stream.exceptions import ConfigError
from grudge_stream.sections import sections
from grudge_stream.topology import load_topology


def cmd_topics(args: argparse.Namespace) -> int:
    from grudge_stream.topics import ensure_topology_topics, source_topic_config, topic_replication, wait_for_cluster

    settings = settings_from(args)
    topology = load_topology(args.topology, settings)
    cfg = sections(settings)
    conf = connect(settings)
    from grudge_stream.deployments import check_own_topics

    check_own_topics(topology, settings.bootstrap_servers, conf, settings)  # before creating anything
    names = _topology_topic_names(topology)
    before = topic_replication(settings.bootstrap_servers, names, conf)
    n = wait_for_cluster("creating the topology's topics", lambda: ensure_topology_topics(
        topology, settings.bootstrap_servers, partitions=args.partitions, create_source=True,
        timestamp_bounds=True, client_config=conf, replication_factor=cfg.identity.replication_factor),
        cfg.kafka.broker_wait_s, settings.bootstrap_servers)
    if args.partitions is not None and n != args.partitions:
        raise ConfigError(
            f"source topic {topology.source_topic!r} exists with {n} partitions, not {args.partitions}: "
            "grudge-stream does not change a topic's partition count (keys would move between sketches; "
            "docs/checkpoints.md)")
    rp = topology.repartition
    source = (topology.source_topic if rp is None
              else f"{rp.source_topic} (re-keyed by {rp.key_field!r} into {rp.topic})")
    print(f"{source}: {n} partitions; outputs {sorted(topology.outputs.values())}; "
          f"snapshots {topology.snapshot_topic}")
    for name, (parts, replicas) in sorted(topic_replication(settings.bootstrap_servers, names, conf,
                                                            expect=set(names) - set(before)).items()):
        print(f"  {name}: {parts} partitions, replication {replicas} ({'exists' if name in before else 'created'})")
    created_source = rp.source_topic if rp is not None else topology.source_topic
    if created_source not in before:
        bounds = source_topic_config(topology)
        if bounds:
            print(_time_bounds_line(created_source, bounds))
    return 0


def _time_bounds_line(topic: str, bounds: dict[str, str]) -> str:
    """What the source topic's broker-side timestamp bounds mean to its producers."""
    def span(ms: str) -> str:
        s = int(ms) / 1000
        return f"{s / 3600:.3g} h" if s >= 3600 else f"{s / 60:.3g} min" if s >= 60 else f"{s:.3g} s"

    window = []
    if "message.timestamp.before.max.ms" in bounds:
        window.append(f"up to {span(bounds['message.timestamp.before.max.ms'])} old")
    if "message.timestamp.after.max.ms" in bounds:
        window.append(f"up to {span(bounds['message.timestamp.after.max.ms'])} ahead")
    return (f"  {topic} takes event times {' and '.join(window)} of the broker's clock "
            "(message.timestamp.before/after.max.ms, from max_late_ms / max_future_ms); a producer "
            "sending a record outside them gets INVALID_TIMESTAMP ('Broker: Invalid timestamp'), and so "
            "do the other records of its batch. "
            "Older history goes to a topic without these bounds (docs/runtime.md, 'Event time under attack')")


def _topology_topic_names(topology) -> list[str]:
    rp = topology.repartition
    names = {topology.source_topic, topology.snapshot_topic, *topology.outputs.values()}
    if rp is not None:
        names |= {rp.source_topic, rp.topic}
    if topology.overrides_topic:
        names.add(topology.overrides_topic)
    return sorted(names)


def cmd_describe(args: argparse.Namespace) -> int:
    from grudge_stream.settings import scoped_env_name
    from grudge_stream.topology import bind_settings, load_topology_module, topology_short_name

    settings = settings_from(args)
    module = load_topology_module(args.topology)
    if getattr(module, "SETTINGS", None) is None:
        raise ConfigError(f"topology {args.topology!r} declares no SETTINGS")
    rows = bind_settings(module, args.topology, settings).describe()
    doc = (module.__doc__ or "").strip().splitlines()
    if args.json:
        print(json.dumps({"topology": args.topology, "summary": doc[0] if doc else "", "settings": rows},
                         default=str, indent=2))
        return 0
    if doc:
        print(doc[0] + "\n")
    scoped = scoped_env_name(topology_short_name(args.topology), "NAME")
    print(f"settings of {args.topology} (flag --set NAME=VALUE, env {scoped} "
          "or GRUDGE_NAME); 'state' ones make a snapshot foreign when changed:\n")
    for r in rows:
        unit = f" {r['unit']}" if r["unit"] else ""
        current = "" if r["source"] == "default" else f"  = {r['value']!r} ({r['source']})"
        print(f"  {r['name']:<28} {r['kind']:<12} {r['shapes']:<6} default {r['default']!r}{unit}{current}")
        print(f"      {r['help']}")
    return 0


def cmd_create_topic(args: argparse.Namespace) -> int:
    """Create a plain topic (the source of a state in your own app) unless it exists with as
    many partitions; a topic of another partition count is refused (one line, exit 2)."""
    from grudge_stream.topics import create_topics

    if args.partitions < 1:
        raise ConfigError(f"--partitions must be >= 1, not {args.partitions}")
    settings = settings_from(args)
    conf = connect(settings)
    have = existing_topics(conf, [args.name]).get(args.name)
    if have is not None and have != args.partitions:
        raise ConfigError(f"topic {args.name!r} exists with {have} partitions, not {args.partitions}: keys would "
                          "land on other partitions than a state split by it expects; use another name")
    if have is None:
        create_topics(settings.bootstrap_servers, {args.name: (args.partitions, {})}, client_config=conf,
                      replication_factor=args.replication_factor)
    print(f"{args.name}: {args.partitions} partitions ({'created' if have is None else 'exists'}) "
          f"on {settings.bootstrap_servers}")
    return 0


def add_topics_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream topics``."""
    t = sub.add_parser("topics", help="create a topology's topics")
    add_topology_arguments(t)
    t.add_argument("--partitions", type=int, default=None,
                   help="partitions of a source topic it creates (default 8); an existing topic must match")
    t.set_defaults(func=cmd_topics)


def add_describe_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream describe``."""
    ds = sub.add_parser("describe", help="list a topology's settings: type, default, current value, meaning")
    add_topology_arguments(ds)
    ds.add_argument("--json", action="store_true", help="as JSON")
    ds.set_defaults(func=cmd_describe)


def add_create_topic_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream create-topic``."""
    ct = sub.add_parser("create-topic", help="create a plain topic (the source topic of a state in your own app) "
                        "if missing; an existing one must have as many partitions")
    ct.add_argument("name")
    ct.add_argument("--partitions", type=int, required=True)
    ct.add_argument("--replication-factor", type=int, default=-1, help="default: the broker's")
    ct.add_argument("--set", action="append", metavar="NAME=VALUE", help="a client setting (security, kafka.*)")
    ct.add_argument("--bootstrap-servers", default=None,
                    help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS or 127.0.0.1:9092)")
    ct.set_defaults(func=cmd_create_topic)
