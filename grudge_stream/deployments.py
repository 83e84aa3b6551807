"""Deployments that own their names: a topology's topics belong to one deployment.

Two deployments of one topology that differ only in ``source_topic`` would share every
other topic (snapshots, alerts, alert state, scores, dead letters) and overwrite each
other's state. A worker or ``grudge-stream topics`` therefore reads the newest snapshot
manifest on the snapshot topic before it starts: a manifest of another source topic means
the topics belong to another deployment, and the command stops with one line naming that
deployment and the settings to change (docs/runtime.md, "Deployments and their topics").
"""
from __future__ import annotations

from grudge_stream.exceptions import ConfigError


def check_own_topics(topology, bootstrap_servers: str, client_config: dict | None = None,
                     settings=None) -> None:
    """Refuse (``ConfigError``) a snapshot topic that holds another deployment's state."""
    from confluent_kafka.admin import AdminClient

    from grudge_stream.checkpoint import CheckpointStore

    conf = {"bootstrap.servers": bootstrap_servers, **(client_config or {})}
    try:
        meta = AdminClient(conf).list_topics(topology.snapshot_topic, timeout=30)
    except Exception:  # noqa: BLE001 - the cluster's own checks report an absent cluster
        return
    info = meta.topics.get(topology.snapshot_topic)
    if info is None or info.error is not None or not info.partitions:
        return  # not created yet: nothing to share
    store = CheckpointStore(bootstrap_servers, topology.snapshot_topic, client_config=client_config)
    try:
        found = store.read_manifest(topology.operator_id, 0)
    except Exception:  # noqa: BLE001 - restore explains an unreadable snapshot topic itself
        return
    finally:
        store.close()
    if found is None or found.current.source_topic == topology.source_topic:
        return
    from grudge_stream.partitions import foreign_deployment_message

    declared = getattr(settings, "declared", {}) or {}
    names = sorted(n for n in declared if n.endswith("_topic") and n != "source_topic") or ["snapshot_topic"]
    raise ConfigError(foreign_deployment_message(topology, found.current, ", ".join(names)))
