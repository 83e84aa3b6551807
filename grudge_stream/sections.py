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

A section can also be built by hand, by keyword (``Checkpointing(reset_state=True)``): a
field not given has its declared default (``bootstrap_servers``: ``$KAFKA_BOOTSTRAP_SERVERS``,
else ``127.0.0.1:9092``), and every field is parsed and checked by its declaration, so a bad
value fails at construction with the same one line as a bad flag. ``Section.of(settings)``
reads one section of a ``Settings``; ``overrides(...)`` turns sections and keyword
arguments back into the ``--set`` overrides of a ``Settings`` (the embedded states).
"""
from __future__ import annotations

import difflib
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Mapping, TypeVar

from grudge_stream.settings import COMMON, Settings, setting

_SPECS = {s.name: s for s in COMMON}
T = TypeVar("T", bound="_Section")


def _d(name: str) -> Any:
    """The field of a common setting, with its declared default."""
    spec = _SPECS[name]
    shown = spec.kind != "secret"  # a secret never in a repr (logs, tracebacks)
    if callable(spec.default):
        return field(default_factory=spec.default, repr=shown)
    return field(default=spec.default, repr=shown)


class _Section:
    """Parsing, checks and reading shared by the sections."""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            value = _SPECS[f.name].parse(getattr(self, f.name), type(self).__name__)
            object.__setattr__(self, f.name, value)

    @classmethod
    def of(cls: type[T], settings: Settings) -> T:
        """This section of ``settings`` (bound or not), read as ``setting`` reads it."""
        return cls(**{f.name: _value(settings, f.name) for f in fields(cls)})  # type: ignore[arg-type]

    def given(self) -> dict[str, Any]:
        """The fields not at their declared default (what ``overrides`` hands on)."""
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            factory: Any = f.default_factory
            default = factory() if f.default is MISSING else f.default
            value = getattr(self, f.name)
            if value != default:
                out[f.name] = value
        return out


@dataclass(frozen=True)
class KafkaClient(_Section):
    """The cluster and how to reach it: brokers, security, the client properties file, ``broker_wait_s``."""

    bootstrap_servers: str = _d("bootstrap_servers")
    security_protocol: Any = _d("security_protocol")
    sasl_mechanism: Any = _d("sasl_mechanism")
    sasl_username: Any = _d("sasl_username")
    sasl_password: Any = _d("sasl_password")
    sasl_password_file: Any = _d("sasl_password_file")
    ssl_ca_location: Any = _d("ssl_ca_location")
    ssl_certificate_location: Any = _d("ssl_certificate_location")
    ssl_key_location: Any = _d("ssl_key_location")
    ssl_key_password: Any = _d("ssl_key_password")
    ssl_endpoint_identification: Any = _d("ssl_endpoint_identification")
    kafka_properties_file: Any = _d("kafka_properties_file")
    broker_wait_s: float = _d("broker_wait_s")


@dataclass(frozen=True)
class Group(_Section):
    """The consumer group and the consume loop: ids, session and commit timing, batching, liveness."""

    app_id: Any = _d("app_id")
    app_name: Any = _d("app_name")
    runtime: str = _d("runtime")
    group_instance_id: Any = _d("group_instance_id")
    session_timeout_s: float = _d("session_timeout_s")
    heartbeat_interval_s: float = _d("heartbeat_interval_s")
    commit_interval_s: float = _d("commit_interval_s")
    drain: str = _d("drain")
    batch_size: int = _d("batch_size")
    batch_within_s: float = _d("batch_within_s")
    ingest: str = _d("ingest")
    batch_max_wait_ms: int = _d("batch_max_wait_ms")
    batch_backlog_factor: int = _d("batch_backlog_factor")
    fetch_max_wait_ms: int = _d("fetch_max_wait_ms")
    liveness_timeout_s: float = _d("liveness_timeout_s")


@dataclass(frozen=True)
class EventTime(_Section):
    """What an event's time and key may be (the operators' input checks), and idle ticks."""

    max_future_ms: int = _d("max_future_ms")
    future_policy: str = _d("future_policy")
    max_late_ms: Any = _d("max_late_ms")
    late_policy: str = _d("late_policy")
    max_key_bytes: int = _d("max_key_bytes")
    allow_empty_keys: bool = _d("allow_empty_keys")
    idle_tick_s: float = _d("idle_tick_s")


@dataclass(frozen=True)
class Checkpointing(_Section):
    """Snapshots, restores and exactly-once: cadence, replay budget, chunks, transactions, the state directory."""

    checkpoint_interval_s: float = _d("checkpoint_interval_s")
    snapshot_replay_budget_s: float = _d("snapshot_replay_budget_s")
    snapshot_max_age_s: float = _d("snapshot_max_age_s")
    restore_fallback: str = _d("restore_fallback")
    reset_state: bool = _d("reset_state")
    snapshot_chunk_bytes: int = _d("snapshot_chunk_bytes")
    snapshot_chunk_delay_s: float = _d("snapshot_chunk_delay_s")
    exactly_once: bool = _d("exactly_once")
    transaction_timeout_s: float = _d("transaction_timeout_s")
    open_transaction_wait_s: Any = _d("open_transaction_wait_s")
    state_dir: Any = _d("state_dir")


@dataclass(frozen=True)
class Serving(_Section):
    """The HTTP pages and live score queries: bind address, access rules, TLS, budgets, signing keys."""

    web_enabled: bool = _d("web_enabled")
    web_host: str = _d("web_host")
    web_port: int = _d("web_port")
    key_partitioner: str = _d("key_partitioner")
    advertised_url: Any = _d("advertised_url")
    query_token_file: Any = _d("query_token_file")
    insecure_open_queries: bool = _d("insecure_open_queries")
    web_tls_cert_file: Any = _d("web_tls_cert_file")
    web_tls_key_file: Any = _d("web_tls_key_file")
    web_tls_ca_file: Any = _d("web_tls_ca_file")
    query_rate_per_s: float = _d("query_rate_per_s")
    query_burst: Any = _d("query_burst")
    query_priority_share: float = _d("query_priority_share")
    signing_keys_file: Any = _d("signing_keys_file")
    query_debug_detail: bool = _d("query_debug_detail")


@dataclass(frozen=True)
class Identity(_Section):
    """The secret hashing seed and the shape of the topics a worker creates."""

    seed: Any = _d("seed")
    seed_file: Any = _d("seed_file")
    insecure_public_seed: bool = _d("insecure_public_seed")
    partitions: Any = _d("partitions")
    replication_factor: Any = _d("replication_factor")


SECTIONS = (KafkaClient, Group, EventTime, Checkpointing, Serving, Identity)


@dataclass(frozen=True)
class Sections:
    """All six sections of one ``Settings`` (``sections(settings)``)."""

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


def sections(settings: Settings) -> Sections:
    """The common settings of ``settings`` (bound or not) as frozen sections, read once."""
    return Sections(KafkaClient.of(settings), Group.of(settings), EventTime.of(settings),
                    Checkpointing.of(settings), Serving.of(settings), Identity.of(settings))


def as_section(cls: type[T], given: Any) -> T:
    """``given`` if it is a ``cls`` section, else that section of ``given`` (a ``Settings``):
    what the parts that still take a whole ``Settings`` from their callers do with it."""
    return given if isinstance(given, cls) else cls.of(given)


SECTION_ARGUMENTS: dict[str, type[_Section]] = {"kafka": KafkaClient, "group": Group, "event_time": EventTime,
                     "checkpointing": Checkpointing, "serving": Serving, "identity": Identity}


def overrides(given: Mapping[str, Any], where: str = "argument") -> dict[str, Any]:
    """The ``Settings`` overrides of sections (``kafka=KafkaClient(...)``, by the names of
    ``SECTION_ARGUMENTS``) and of common settings given one by one (``broker_wait_s=30``),
    the latter over the former. A section's fields at their declared default are left to
    the environment (``GRUDGE_<NAME>``), as a setting not given is. An unknown name or a
    section of the wrong kind is a ``TypeError``; a bad value the one-line ``ConfigError``
    of its declaration."""
    out: dict[str, Any] = {}
    singles = {}
    for name, value in given.items():
        if name in SECTION_ARGUMENTS:
            cls = SECTION_ARGUMENTS[name]
            if value is None:
                continue
            if not isinstance(value, cls):
                raise TypeError(f"{name} must be a grudge_stream.sections.{cls.__name__}, not {type(value).__name__}")
            out.update(value.given())
        elif name in _SPECS:
            singles[name] = _SPECS[name].parse(value, f"{where} {name}")
        else:
            match = difflib.get_close_matches(name, [*SECTION_ARGUMENTS, *_SPECS], n=1, cutoff=0.6)
            hint = f"; did you mean {match[0]!r}?" if match else ""
            raise TypeError(f"unexpected keyword argument {name!r}: neither a section nor a common setting{hint}")
    out.update(singles)
    return out
