"""Creating and checking a topology's topics."""
from __future__ import annotations

from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from grudge_stream.checkpoint import SNAPSHOT_TOPIC_CONFIG
from grudge_stream.exceptions import ConfigError
from grudge_stream.overrides import ALERT_STATE_TOPIC_CONFIG, OVERRIDES_TOPIC_CONFIG
from grudge_stream.topology import Topology

if TYPE_CHECKING:
    from grudge_stream.repartition import RepartitionPlan


def topic_partitions(admin: AdminClient, topic: str, timeout: float = 30.0) -> int | None:
    md = admin.list_topics(timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return None
    return len(t.partitions)


def create_topics(bootstrap_servers: str, specs: dict[str, tuple[int, dict]], timeout: float = 30.0,
                  client_config: dict | None = None) -> list[str]:
    """Create the missing topics of ``{name: (partitions, config)}``; return the created names.

    ``client_config``: ``grudge_stream.kafkaconf.client_config(settings)`` (security, pass-through)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(client_config or {})})
    existing = set(admin.list_topics(timeout=timeout).topics)
    new = [NewTopic(name, num_partitions=parts, replication_factor=1, config=conf)
           for name, (parts, conf) in specs.items() if name not in existing]
    created = []
    if new:
        for name, fut in admin.create_topics(new, request_timeout=timeout).items():
            try:
                fut.result(timeout=timeout)
                created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    return created


# The partition assignor a Faust worker's group reports (faust.assignor.PartitionAssignor.name);
# the batch runtime's librdkafka consumer reports range / roundrobin / cooperative-sticky.
FAUST_ASSIGNOR = "faust"


def group_runtime(bootstrap_servers: str, group: str, client_config: dict | None = None,
                  timeout_s: float = 10.0) -> tuple[str, int] | None:
    """``(runtime, members)`` of a consumer group with members, or None (empty, unknown, or
    not describable)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(client_config or {})})
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result(timeout_s)
    except KafkaException:
        return None
    if not desc.members or not desc.partition_assignor:
        return None
    return ("faust" if desc.partition_assignor == FAUST_ASSIGNOR else "batch"), len(desc.members)


def check_group_runtime(bootstrap_servers: str, group: str, runtime: str,
                        client_config: dict | None = None) -> None:
    """Refuse to join a group that workers of the other runtime run: their group protocols
    cannot agree (Kafka answers INCONSISTENT_GROUP_PROTOCOL, forever)."""
    found = group_runtime(bootstrap_servers, group, client_config)
    if found is not None and found[0] != runtime:
        theirs, members = found
        raise ConfigError(
            f"consumer group {group!r} is run by {members} worker(s) of the {theirs} runtime; this worker "
            f"uses the {runtime} runtime and cannot join it. Operator action: stop those workers first, "
            "or run this one with the same runtime, or give it another app_id.")


def source_topic_config(topology: Topology) -> dict[str, str]:
    """Broker-side timestamp bounds matching the operator's event-time bounds: the broker then
    refuses, at produce time, records stamped further ahead than ``max_future_ms`` or further
    back than ``max_late_ms`` (producers see the error; a backfill of older history needs a
    topic without the before bound)."""
    op = topology.make_operator(0)
    conf = {}
    if op.max_future_ms is not None:
        conf["message.timestamp.after.max.ms"] = str(op.max_future_ms)
    if op.max_late_ms is not None:
        conf["message.timestamp.before.max.ms"] = str(op.max_late_ms)
    return conf


def ensure_topology_topics(topology: Topology, bootstrap_servers: str, *, partitions: int | None = None,
                           create_source: bool = False, timestamp_bounds: bool = False,
                           client_config: dict | None = None) -> int:
    """Create the output and snapshot topics (and the source, if asked); return the source's partitions.

    ``timestamp_bounds``: a source topic created here gets ``source_topic_config`` (what
    ``grudge-stream topics`` and ``worker --create-source`` do)."""
    rp = topology.extra.get("repartition")
    if rp is not None:
        # Re-keyed by a field: the source producers write, and the repartition topic the
        # operators read (its source_topic), with the source's partition count.
        n = ensure_repartition_topic(rp, bootstrap_servers, create_source=create_source, partitions=partitions,
                                     source_config=source_topic_config(topology) if timestamp_bounds else None,
                                     client_config=client_config)
    else:
        n = ensure_source_topic(topology.source_topic, bootstrap_servers, create_source=create_source,
                                partitions=partitions,
                                config=source_topic_config(topology) if timestamp_bounds else None,
                                client_config=client_config)
    specs: dict[str, tuple[int, dict]] = {t: (n, {}) for t in set(topology.outputs.values())}
    if "alert_state" in topology.outputs:
        specs[topology.outputs["alert_state"]] = (n, dict(ALERT_STATE_TOPIC_CONFIG))
    if topology.overrides_topic:
        specs[topology.overrides_topic] = (1, dict(OVERRIDES_TOPIC_CONFIG))
    specs[topology.snapshot_topic] = (n, dict(SNAPSHOT_TOPIC_CONFIG))
    create_topics(bootstrap_servers, specs, client_config=client_config)
    return n


def ensure_source_topic(topic: str, bootstrap_servers: str, *, create_source: bool = False,
                        partitions: int | None = None, config: dict | None = None,
                        client_config: dict | None = None) -> int:
    """The source topic's partition count; created with ``partitions`` (default 8) and ``config``
    when ``create_source``, else a missing source is a ConfigError with the operator action."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(client_config or {})})
    n = topic_partitions(admin, topic)
    if n is not None:
        return n
    if not create_source:
        raise ConfigError(
            f"source topic {topic!r} does not exist on {bootstrap_servers}. "
            "Operator action: create it (or run `grudge-stream topics <topology> --partitions N`)."
        )
    n = partitions or 8
    create_topics(bootstrap_servers, {topic: (n, dict(config or {}))}, client_config=client_config)
    return n


def ensure_repartition_topic(plan_: RepartitionPlan, bootstrap_servers: str, *, create_source: bool = False,
                             partitions: int | None = None, source_config: dict | None = None,
                             client_config: dict | None = None, create: bool = True) -> int:
    """Create ``plan_.topic`` with the source's partition count (and the source if asked);
    refuse a repartition topic with another count. Returns the partition count.
    ``create=False`` only checks (a worker started with ``--no-create-topics``): a producer
    must never auto-create it with the broker's default partition count.

    No timestamp bounds on it: its records keep their source timestamps, and the broker must
    not refuse a late one the stage has already accepted (the operators bound event time)."""
    n = ensure_source_topic(plan_.source_topic, bootstrap_servers, create_source=create_source,
                            partitions=partitions, config=source_config, client_config=client_config)
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(client_config or {})})
    have = topic_partitions(admin, plan_.topic)
    if have is None and not create:
        raise ConfigError(
            f"repartition topic {plan_.topic!r} does not exist on {bootstrap_servers}. Operator action: "
            "start the worker without --no-create-topics, or run `grudge-stream topics <topology>`.")
    if have is None:
        create_topics(bootstrap_servers, {plan_.topic: (n, {"cleanup.policy": "delete"})},
                      client_config=client_config)
    elif have != n:
        raise ConfigError(
            f"repartition topic {plan_.topic!r} has {have} partitions, the source {plan_.source_topic!r} "
            f"{n}. Operator action: recreate it with {n} partitions (and reset_state=true), or use "
            "another app_id.")
    return n
