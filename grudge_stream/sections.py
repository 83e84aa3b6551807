"""The common settings after binding, as frozen typed sections: one per part of a worker.

The declared settings stay one table (``grudge_stream.settings.COMMON``: types, defaults,
state/policy flags, scoped environment variables, ``describe``). ``sections(settings)``
reads them once, with the same parsing and checks as ``setting(settings, name)``, into the
sections below; each part of a worker takes the one section it needs, never the whole
``Settings``:

- ``KafkaClient``: the cluster and how to reach it (the Kafka layer);
- ``Group``: the consumer group and the consume loop (the runtimes' loops, commits);
- ``EventTime``: what an event's time and key may be (the operators' input checks);
- ``Checkpointing``: snapshots, restores and exactly-once (the checkpointer, the slots);
- ``Serving``: the HTTP pages, live queries and their access rules (serving);
- ``Identity``: the hashing seed and the topics' shape (the topology).

Every common setting is in exactly one section (tests/unit/test_sections.py checks it), so
a setting added to ``COMMON`` must be given a section.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from grudge_stream.settings import COMMON, Settings, setting


@dataclass(frozen=True)
class KafkaClient:
    bootstrap_servers: str
    security_protocol: Any
    sasl_mechanism: Any
    sasl_username: Any
    sasl_password: Any
    sasl_password_file: Any
    ssl_ca_location: Any
    ssl_certificate_location: Any
    ssl_key_location: Any
    ssl_key_password: Any
    ssl_endpoint_identification: Any
    kafka_properties_file: Any
    broker_wait_s: float


@dataclass(frozen=True)
class Group:
    app_id: Any
    app_name: Any
    runtime: str
    group_instance_id: Any
    session_timeout_s: float
    heartbeat_interval_s: float
    commit_interval_s: float
    drain: str
    batch_size: int
    batch_within_s: float
    ingest: str
    batch_max_wait_ms: int
    fetch_max_wait_ms: int
    liveness_timeout_s: float


@dataclass(frozen=True)
class EventTime:
    max_future_ms: int
    future_policy: str
    max_late_ms: Any
    late_policy: str
    max_key_bytes: int
    allow_empty_keys: bool
    idle_tick_s: float


@dataclass(frozen=True)
class Checkpointing:
    checkpoint_interval_s: float
    snapshot_replay_budget_s: float
    snapshot_max_age_s: float
    restore_fallback: str
    reset_state: bool
    snapshot_chunk_bytes: int
    snapshot_chunk_delay_s: float
    exactly_once: bool
    transaction_timeout_s: float
    open_transaction_wait_s: Any
    state_dir: Any


@dataclass(frozen=True)
class Serving:
    web_enabled: bool
    web_host: str
    web_port: int
    key_partitioner: str
    advertised_url: Any
    query_token_file: Any
    insecure_open_queries: bool
    web_tls_cert_file: Any
    web_tls_key_file: Any
    web_tls_ca_file: Any
    query_rate_per_s: float
    query_burst: Any
    query_priority_share: float
    signing_keys_file: Any
    query_debug_detail: bool


@dataclass(frozen=True)
class Identity:
    seed: Any
    seed_file: Any
    insecure_public_seed: bool
    partitions: Any
    replication_factor: Any


SECTIONS = (KafkaClient, Group, EventTime, Checkpointing, Serving, Identity)


@dataclass(frozen=True)
class Sections:
    kafka: KafkaClient
    group: Group
    event_time: EventTime
    checkpointing: Checkpointing
    serving: Serving
    identity: Identity


_DEFAULT_FROM_ENVIRONMENT = {s.name: s for s in COMMON if callable(s.default)}  # bootstrap_servers


def _value(settings: Settings, name: str) -> Any:
    spec = _DEFAULT_FROM_ENVIRONMENT.get(name)
    if spec is None:
        return setting(settings, name)
    got = settings.get(name)
    return spec.default() if got is None else got


def _read(cls: type, settings: Settings) -> Any:
    return cls(**{f.name: _value(settings, f.name) for f in fields(cls)})


def sections(settings: Settings) -> Sections:
    """The common settings of ``settings`` (bound or not) as frozen sections, read once."""
    return Sections(*(_read(cls, settings) for cls in SECTIONS))
