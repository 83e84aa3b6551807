"""Creating and checking a topology's topics."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from grudge_stream.checkpoint import SNAPSHOT_TOPIC_CONFIG
from grudge_stream.exceptions import ConfigError
from grudge_stream.overrides import ALERT_STATE_TOPIC_CONFIG, OVERRIDES_TOPIC_CONFIG
from grudge_stream.topology import Topology

if TYPE_CHECKING:
    from grudge_stream.topology import RepartitionPlan

log = logging.getLogger(__name__)
T = TypeVar("T")

# Answers of a cluster that is starting, electing leaders or loading a coordinator: a
# startup check retries them (librdkafka marks most, not all, of them retriable).
_TRANSIENT = {KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
              KafkaError._UNKNOWN_PARTITION, KafkaError._WAIT_COORD,
              KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
              KafkaError.NOT_COORDINATOR, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.REQUEST_TIMED_OUT,
              KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_CONTROLLER, KafkaError.BROKER_NOT_AVAILABLE,
              KafkaError.UNSTABLE_OFFSET_COMMIT}


def transient(exc: BaseException) -> bool:
    """True for an error a healthy cluster stops giving in seconds: a timeout, a moving
    leader, a loading coordinator, brokers briefly down."""
    if isinstance(exc, TimeoutError):
        return True
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err = exc.args[0]
        return err.retriable() or err.code() in _TRANSIENT
    return False


def wait_for_cluster(what: str, check: Callable[[], T], wait_s: float, bootstrap_servers: str = "",
                     backoff_s: float = 0.5) -> T:
    """Run a startup ``check`` until it stops failing transiently; after ``wait_s`` (the
    ``broker_wait_s`` setting) a ConfigError of one line (exit 2), never a traceback.

    Errors that are not transient (a refused request, a bad setting) pass through at once."""
    t0 = time.monotonic()
    warned_at = None
    while True:
        try:
            return check()
        except (KafkaException, TimeoutError) as exc:
            if not transient(exc):
                raise
            now = time.monotonic()
            if isinstance(exc, KafkaException) and isinstance(exc.args[0], KafkaError):
                detail = f"{exc.args[0].name()}: {' '.join(exc.args[0].str().split())}"
            else:
                detail = str(exc) or "timed out"
            if now - t0 >= wait_s:
                where = f" at {bootstrap_servers}" if bootstrap_servers else ""
                raise ConfigError(
                    f"{what}: the Kafka cluster{where} did not answer within {now - t0:.0f} s (last error: "
                    f"{detail}). Operator action: check that the brokers are up and the group coordinator "
                    "is loaded; broker_wait_s sets how long a starting worker waits") from None
            if warned_at is None or now - warned_at >= 15:
                log.warning("%s: %s; retrying for up to %.0f s (broker_wait_s)", what, detail, wait_s)
                warned_at = now
            time.sleep(min(backoff_s, max(0.0, t0 + wait_s - now)))


def topic_partitions(admin: AdminClient, topic: str, timeout: float = 30.0) -> int | None:
    md = admin.list_topics(timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return None
    return len(t.partitions)


def check_replication_factor(replication_factor: int, brokers: int) -> None:
    """One line for a replication factor the cluster cannot hold (Kafka would refuse every topic)."""
    if replication_factor == 0 or replication_factor < -1:
        raise ConfigError(f"replication_factor={replication_factor}: give 1 or more, or -1 (the broker's "
                          "default.replication.factor)")
    if replication_factor > brokers:
        raise ConfigError(
            f"replication_factor={replication_factor} is more than the {brokers} broker(s) of the cluster. "
            "Operator action: lower it, or leave it at -1 (the broker's default.replication.factor)")


def create_topics(bootstrap_servers: str, specs: dict[str, tuple[int, dict]], timeout: float = 30.0,
                  client_config: dict | None = None, replication_factor: int = -1) -> list[str]:
    """Create the missing topics of ``{name: (partitions, config)}``; return the created names.

    ``replication_factor``: -1 (default) leaves it to the broker's ``default.replication.factor``.
    ``client_config``: ``grudge_stream.kafkaconf.client_config(settings)`` (security, pass-through)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(client_config or {})})
    md = admin.list_topics(timeout=timeout)
    check_replication_factor(replication_factor, len(md.brokers))
    existing = set(md.topics)
    new = [NewTopic(name, num_partitions=parts, replication_factor=replication_factor, config=conf)
           for name, (parts, conf) in specs.items() if name not in existing]
    created = []
    if new:
        for name, fut in admin.create_topics(new, request_timeout=timeout).items():
            try:
                fut.result(timeout=timeout)
                created.append(name)
            except KafkaException as exc:
                code = exc.args[0].code()
                if code == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                if code in (KafkaError.INVALID_REPLICATION_FACTOR, KafkaError.INVALID_CONFIG,
                            KafkaError.POLICY_VIOLATION, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                            KafkaError.CLUSTER_AUTHORIZATION_FAILED):
                    raise ConfigError(f"cannot create topic {name!r}: {' '.join(exc.args[0].str().split())}. "
                                      "Operator action: fix the setting or create the topic by hand") from None
                raise
    return created


def topic_replication(bootstrap_servers: str, names: list[str], client_config: dict | None = None,
                      timeout: float = 30.0, expect: Iterable[str] = ()) -> dict[str, tuple[int, int]]:
    """``{topic: (partitions, replicas)}`` of the topics that exist among ``names``.
    ``expect``: topics just created; the broker answering may not know them yet (on a
    cluster, metadata reaches each broker a moment after the create returns), so it is
    asked again, for up to ``timeout``, until it lists them all."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(client_config or {})})
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        out = {}
        for name in names:
            t = md.topics.get(name)
            if t is not None and t.error is None and t.partitions:
                out[name] = (len(t.partitions), min(len(p.replicas) for p in t.partitions.values()))
        if all(name in out for name in expect) or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def broker_default_replication(bootstrap_servers: str, client_config: dict | None = None,
                               timeout: float = 30.0) -> int:
    """The cluster's ``default.replication.factor`` (asked of one broker): what -1 means, for
    clients that cannot send -1 (aiokafka's CreateTopics is older than KIP-464)."""
    from confluent_kafka.admin import ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(client_config or {})})
    md = admin.list_topics(timeout=timeout)
    broker = min(md.brokers)
    res = ConfigResource(ConfigResource.Type.BROKER, str(broker))
    conf = admin.describe_configs([res], request_timeout=timeout)[res].result(timeout + 5)
    entry = conf.get("default.replication.factor")
    return max(1, min(int(entry.value), len(md.brokers))) if entry is not None and entry.value else 1


# The partition assignor a Faust worker's group reports (faust.assignor.PartitionAssignor.name);
# the batch runtime's librdkafka consumer reports range / roundrobin / cooperative-sticky.
FAUST_ASSIGNOR = "faust"


def group_runtime(bootstrap_servers: str, group: str, client_config: dict | None = None,
                  timeout_s: float = 10.0) -> tuple[str, int, set[str]] | None:
    """``(runtime, members, topics assigned to them)`` of a consumer group with members, or
    None (empty, unknown, or not describable)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(client_config or {})})
    try:
        # A little longer than the request's own timeout, so the request's error (say a coordinator
        # still loading) arrives instead of a bare TimeoutError.
        desc = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result(timeout_s + 5)
    except KafkaException as exc:
        if transient(exc):
            raise  # the caller retries (wait_for_cluster): a loading coordinator is not an empty group
        return None
    if not desc.members or not desc.partition_assignor:
        return None
    topics = {tp.topic for m in desc.members if m.assignment is not None
              for tp in (m.assignment.topic_partitions or ())}
    return ("faust" if desc.partition_assignor == FAUST_ASSIGNOR else "batch"), len(desc.members), topics


def check_group_runtime(bootstrap_servers: str, group: str, runtime: str,
                        client_config: dict | None = None, wait_s: float = 120.0,
                        source_topic: str | None = None) -> None:
    """Refuse to join a group that workers of the other runtime run: their group protocols
    cannot agree (Kafka answers INCONSISTENT_GROUP_PROTOCOL, forever); or, given
    ``source_topic``, a group whose workers consume other topics (another deployment's
    group: joining it would rebalance those workers, again and again). A coordinator that is
    still loading is waited for, up to ``wait_s``."""
    found = wait_for_cluster(f"describing consumer group {group!r}",
                             lambda: group_runtime(bootstrap_servers, group, client_config),
                             wait_s, bootstrap_servers)
    if found is not None and source_topic is not None and found[2] and source_topic not in found[2]:
        raise ConfigError(
            f"consumer group {group!r} (app_id) is used by {found[1]} worker(s) of source topic(s) "
            f"{', '.join(sorted(found[2]))}, another deployment; this one reads {source_topic!r}. Joining "
            "would rebalance those workers and mix two topics' offsets in one group. Operator action: "
            "give this deployment an app_id of its own (unset, it is grudge-<operator_id>-<source_topic>)")
    if found is not None and found[0] != runtime:
        theirs, members, _topics = found
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
                           client_config: dict | None = None, replication_factor: int = -1) -> int:
    """Create the output and snapshot topics (and the source, if asked); return the source's partitions.

    ``timestamp_bounds``: a source topic created here gets ``source_topic_config`` (what
    ``grudge-stream topics`` and ``worker --create-source`` do)."""
    rp = topology.repartition
    if rp is not None:
        # Re-keyed by a field: the source producers write, and the repartition topic the
        # operators read (its source_topic), with the source's partition count.
        n = ensure_repartition_topic(rp, bootstrap_servers, create_source=create_source, partitions=partitions,
                                     source_config=source_topic_config(topology) if timestamp_bounds else None,
                                     client_config=client_config, replication_factor=replication_factor)
    else:
        n = ensure_source_topic(topology.source_topic, bootstrap_servers, create_source=create_source,
                                partitions=partitions,
                                config=source_topic_config(topology) if timestamp_bounds else None,
                                client_config=client_config, replication_factor=replication_factor)
    specs: dict[str, tuple[int, dict]] = {t: (n, {}) for t in set(topology.outputs.values())}
    if "alert_state" in topology.outputs:
        specs[topology.outputs["alert_state"]] = (n, dict(ALERT_STATE_TOPIC_CONFIG))
    if topology.overrides_topic:
        specs[topology.overrides_topic] = (1, dict(OVERRIDES_TOPIC_CONFIG))
    specs[topology.snapshot_topic] = (n, dict(SNAPSHOT_TOPIC_CONFIG))
    create_topics(bootstrap_servers, specs, client_config=client_config, replication_factor=replication_factor)
    return n


def ensure_source_topic(topic: str, bootstrap_servers: str, *, create_source: bool = False,
                        partitions: int | None = None, config: dict | None = None,
                        client_config: dict | None = None, replication_factor: int = -1) -> int:
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
    create_topics(bootstrap_servers, {topic: (n, dict(config or {}))}, client_config=client_config,
                  replication_factor=replication_factor)
    return n


def ensure_repartition_topic(plan_: RepartitionPlan, bootstrap_servers: str, *, create_source: bool = False,
                             partitions: int | None = None, source_config: dict | None = None,
                             client_config: dict | None = None, create: bool = True,
                             replication_factor: int = -1) -> int:
    """Create ``plan_.topic`` with the source's partition count (and the source if asked);
    refuse a repartition topic with another count. Returns the partition count.
    ``create=False`` only checks (a worker started with ``--no-create-topics``): a producer
    must never auto-create it with the broker's default partition count.

    No timestamp bounds on it: its records keep their source timestamps, and the broker must
    not refuse a late one the stage has already accepted (the operators bound event time)."""
    n = ensure_source_topic(plan_.source_topic, bootstrap_servers, create_source=create_source,
                            partitions=partitions, config=source_config, client_config=client_config,
                            replication_factor=replication_factor)
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 3, **(client_config or {})})
    have = topic_partitions(admin, plan_.topic)
    if have is None and not create:
        raise ConfigError(
            f"repartition topic {plan_.topic!r} does not exist on {bootstrap_servers}. Operator action: "
            "start the worker without --no-create-topics, or run `grudge-stream topics <topology>`.")
    if have is None:
        create_topics(bootstrap_servers, {plan_.topic: (n, {"cleanup.policy": "delete"})},
                      client_config=client_config, replication_factor=replication_factor)
    elif have != n:
        raise ConfigError(
            f"repartition topic {plan_.topic!r} has {have} partitions, the source {plan_.source_topic!r} "
            f"{n}. Operator action: recreate it with {n} partitions (and reset_state=true), or use "
            "another app_id.")
    return n
