"""Declared, typed settings: every name a topology and the runtimes read, with its type,
default, unit, meaning and validation.

Values come from, in order: the ``--set name=value`` flags, the environment variable
``GRUDGE_<TOPOLOGY>__<NAME>`` (scoped to one topology, e.g.
``GRUDGE_ABUSE_SCORES__RAISE_AT``), the environment variable ``GRUDGE_<NAME>``, the
declared default. An unknown name — a flag, a scoped variable, or an unscoped
``GRUDGE_*`` variable that is no setting of the topology — is refused with the
closest valid name, so a typo never passes silently. ``grudge-stream describe
<topology>`` prints the table.

Settings that **shape the state** (sketch geometry, hashing, decay, what the key
is) make a snapshot foreign when they change; **policy** settings (thresholds,
emit modes, intervals, bounds) can change between runs and the state is kept
(docs/runtime.md, "Changing settings").
"""
from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from grudge_stream.exceptions import ConfigError

# GRUDGE_* variables of the tools around the settings (build, dev broker, tests, CLI).
TOOL_VARIABLES = {"GRUDGE_LOGLEVEL", "GRUDGE_LOG_FORMAT", "GRUDGE_KAFKA_CACHE", "GRUDGE_DEBUG",
                  "GRUDGE_KAFKA_BACKEND", "GRUDGE_KAFKA_VERSION", "GRUDGE_KAFKA_HEAP", "GRUDGE_KAFKA_IMAGE",
                  "GRUDGE_MVN"}
_MISSING = object()


@dataclass(frozen=True)
class Setting:
    """One declared setting.

    ``kind``: ``int``, ``float``, ``bool``, ``str``, ``choice`` (one of ``choices``),
    ``bound`` (``auto``, ``none`` or a non-negative integer), ``secret`` (a string never
    shown). ``state``: true when the setting shapes the state.
    """

    name: str
    kind: str
    default: Any
    help: str
    unit: str = ""
    choices: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    min_inclusive: bool = True
    state: bool = False

    def parse(self, raw: Any, source: str) -> Any:
        where = f"setting {self.name!r} ({source})"
        if raw is None:
            return None
        text = raw.strip() if isinstance(raw, str) else raw
        if self.kind in ("str", "secret"):
            return str(raw)
        if self.kind == "choice":
            if text not in self.choices:
                raise ConfigError(f"{where} must be one of {', '.join(self.choices)}, got {raw!r}")
            return text
        if self.kind == "bool":
            low = str(text).lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{where} must be true or false, got {raw!r}")
        if self.kind == "bound":
            low = str(text).lower()
            if low == "auto":
                return "auto"
            if low in ("none", "off"):
                return None
            value = self._number(text, int, where, "'auto', 'none' or ")
            if value < 0:
                raise ConfigError(f"{where} must be >= 0, got {value}")
        elif self.kind == "int":
            value = self._number(text, int, where)
        elif self.kind == "float":
            value = self._number(text, float, where)
        else:  # pragma: no cover - a declaration bug
            raise AssertionError(f"unknown setting kind {self.kind!r}")
        self._check_range(value, where)
        return value

    def _number(self, text: Any, typ: type, where: str, also: str = "") -> Any:
        try:
            value = typ(text)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be {also}{'an integer' if typ is int else 'a number'}"
                              f"{' (' + self.unit + ')' if self.unit else ''}, got {text!r}") from None
        if typ is float and not math.isfinite(value):
            raise ConfigError(f"{where} must be finite, got {text!r}")
        return value

    def _check_range(self, value: Any, where: str) -> None:
        if self.min is not None and (value < self.min or (value == self.min and not self.min_inclusive)):
            op = ">=" if self.min_inclusive else ">"
            raise ConfigError(f"{where} must be {op} {self.min:g}, got {value!r}")
        if self.max is not None and value > self.max:
            raise ConfigError(f"{where} must be <= {self.max:g}, got {value!r}")


def _env_name(name: str) -> str:
    return "GRUDGE_" + name.upper().replace(".", "_")


def scoped_env_name(topology: str, name: str) -> str:
    return f"GRUDGE_{topology.upper()}__{name.upper().replace('.', '_')}"


def _closest(name: str, names: Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


class Settings:
    """Configuration from flags over environment variables over declared defaults.

    Before ``bind`` (a topology loader declares what it reads), ``get(name, default)``
    converts to the default's type as given; after it, every name is checked, parsed and
    validated once, and ``get`` returns the parsed value.
    """

    def __init__(self, overrides: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self.environ = os.environ if environ is None else environ
        self.topology: str | None = None
        self.declared: dict[str, Setting] = {}
        self.values: Mapping[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.prefixes: tuple[str, ...] = ()

    @property
    def bootstrap_servers(self) -> str:
        if self.declared:
            return str(self.values["bootstrap_servers"])
        return str(self.get("bootstrap_servers", self.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")))

    # -- declared ---------------------------------------------------------------------------------

    def bind(self, topology: str, declared: Iterable[Setting], prefixes: Iterable[str] = (),
             validate: Callable[[Mapping[str, Any]], None] | None = None) -> "Settings":
        """Check and parse every setting of ``topology``; raise ConfigError on the first
        unknown name or bad value. ``prefixes``: names starting with them pass through
        (client properties such as ``kafka.socket.keepalive.enable``)."""
        self.topology = topology
        self.declared = {s.name: s for s in declared}
        self.prefixes = tuple(prefixes)
        names = list(self.declared)
        for name in self.overrides:
            if name not in self.declared and not name.startswith(self.prefixes):
                raise ConfigError(f"unknown setting {name!r} for {topology}{_closest(name, names)} "
                                  f"(grudge-stream describe {topology} lists them)")
        scoped_prefix = f"GRUDGE_{topology.upper()}__"
        env_names = {_env_name(n): n for n in names}
        scoped_names = {scoped_env_name(topology, n): n for n in names}
        for var in self.environ:
            if not var.startswith("GRUDGE_") or var in TOOL_VARIABLES:
                continue
            if var.startswith(scoped_prefix):
                if var not in scoped_names and not self._prefixed_env(var[len(scoped_prefix):]):
                    raise ConfigError(f"environment variable {var} names no setting of {topology}"
                                      f"{_closest(var, scoped_names)}")
            elif "__" in var:
                continue  # scoped to another topology
            elif var not in env_names and not self._prefixed_env(var[len("GRUDGE_"):]):
                raise ConfigError(
                    f"environment variable {var} is not a setting of {topology}{_closest(var, env_names)}; "
                    f"scope another topology's settings as GRUDGE_<TOPOLOGY>__<NAME> "
                    f"(grudge-stream describe {topology} lists them)")
        values: dict[str, Any] = {}
        for name, spec in self.declared.items():
            raw, source = self._raw(name)
            if raw is _MISSING:
                value = spec.default() if callable(spec.default) else spec.default
                values[name], self.sources[name] = value, "default"
            else:
                values[name], self.sources[name] = spec.parse(raw, source), source
        # Parsed and checked once; read-only from here on (a TypeError for any writer).
        self.values = MappingProxyType(values)
        if validate is not None:
            validate(self.values)
        return self

    def _prefixed_env(self, rest: str) -> bool:
        return any(rest.upper().startswith(p.upper().replace(".", "_")) for p in self.prefixes)

    def _raw(self, name: str) -> tuple[Any, str]:
        if name in self.overrides:
            return self.overrides[name], f"--set {name}"
        if self.topology is not None:
            var = scoped_env_name(self.topology, name)
            if var in self.environ:
                return self.environ[var], var
        var = _env_name(name)
        if var in self.environ:
            return self.environ[var], var
        return _MISSING, ""

    def __getitem__(self, name: str) -> Any:
        """The value of a declared setting, parsed, its declared default if unset (what a
        topology's ``build`` reads: the default is written once, in its declaration)."""
        try:
            return self.values[name]
        except KeyError:
            where = f"topology {self.topology}" if self.topology else "these settings (not bound to a topology)"
            raise KeyError(f"setting {name!r} is not declared by {where}") from None

    def get(self, name: str, default: Any = None) -> Any:
        if name in self.values:
            return self.values[name]
        raw, source = self._raw(name)
        if raw is _MISSING:
            return default
        if default is None or isinstance(default, str):
            return raw
        kind = "bool" if isinstance(default, bool) else "int" if isinstance(default, int) else "float"
        return Setting(name, kind, default, "").parse(raw, source)

    def describe(self) -> list[dict[str, Any]]:
        """One row per declared setting: name, kind, default, current value and its source."""
        rows = []
        for name, spec in self.declared.items():
            value = self.values.get(name)
            if spec.kind == "secret" and value is not None:
                value = "(set)"
            rows.append({"name": name, "kind": spec.kind if spec.kind != "choice" else "|".join(spec.choices),
                         "default": spec.default if not callable(spec.default) else "(derived)",
                         "value": value, "source": self.sources.get(name, "default"), "unit": spec.unit,
                         "shapes": "state" if spec.state else "policy", "help": spec.help})
        return rows


def require_order(values: Mapping[str, Any], low: str, high: str, lo_bound: float | None = None,
                  hi_bound: float | None = None) -> None:
    """``lo_bound <= values[low] < values[high] <= hi_bound``, as one clear error."""
    lo, hi = values[low], values[high]
    if not lo < hi:
        raise ConfigError(f"{low} ({lo}) must be below {high} ({hi})")
    if lo_bound is not None and lo < lo_bound:
        raise ConfigError(f"{low} ({lo}) is below the score's lower clamp {lo_bound}: it can never clear")
    if hi_bound is not None and hi > hi_bound:
        raise ConfigError(f"{high} ({hi}) is above the score's upper clamp {hi_bound}: it can never raise")


def _bootstrap_default() -> str:
    return os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")


S = Setting
# Settings every topology takes: connection, identity, runtimes, checkpoints, input bounds.
COMMON: list[Setting] = [
    S("bootstrap_servers", "str", _bootstrap_default, "Kafka bootstrap servers (also --bootstrap-servers, "
      "$KAFKA_BOOTSTRAP_SERVERS)"),
    S("app_id", "str", None, "consumer group and Faust app id; default grudge-<operator_id>-<source_topic>"),
    S("app_name", "str", None, "a name for the worker (default: the topology's)"),
    S("runtime", "choice", "faust", "the worker's runtime", choices=("faust", "batch")),
    S("seed", "secret", None, "the secret 128-bit SipHash key: 32 hex digits or base64 (docs/security.md)",
      state=True),
    S("seed_file", "str", None, "a file holding the key (a mounted secret)", state=True),
    S("insecure_public_seed", "bool", False, "run with the PUBLIC all-zero key (throwaway use only)", state=True),
    S("max_future_ms", "bound", "auto", "how far ahead of processing time an event time is trusted", "ms"),
    S("future_policy", "choice", "clamp", "events beyond max_future_ms: applied at the watermark, or refused",
      choices=("clamp", "dead_letter")),
    S("max_late_ms", "bound", "auto", "how far behind the watermark an event is still applied", "ms"),
    S("late_policy", "choice", "dead_letter", "events beyond max_late_ms", choices=("dead_letter", "count")),
    S("max_key_bytes", "int", 1024, "longer keys are dead-lettered (0: no limit)", "bytes", min=0),
    S("allow_empty_keys", "bool", False, "apply events with an empty key instead of dead-lettering them"),
    S("checkpoint_interval_s", "float", 5.0, "how often snapshots are considered (embedded states: the snapshot "
      "cadence)", "s", min=0, min_inclusive=False),
    S("snapshot_replay_budget_s", "float", 5.0, "workers: snapshots are due once a restore of the worker's "
      "partitions would replay more than this much work (records since their snapshots at the measured rate); "
      "0: every changed partition at every checkpoint_interval_s", "s", min=0),
    S("snapshot_max_age_s", "float", 3600.0, "workers: a changed partition is snapshotted at least this "
      "often, whatever the budget (keep it well below the source topic's retention)", "s", min=0,
      min_inclusive=False),
    S("idle_tick_s", "float", 0.0, "workers: a partition holding raised keys that gets no record for this long "
      "is sent a tick record, which moves its watermark to the wall clock so its bans can clear (needs WRITE "
      "on the source topic; docs/runtime.md, \"Quiet partitions\"); 0: off", "s", min=0),
    S("restore_fallback", "choice", "replay", "when no snapshot is usable (corrupt, missing chunks)",
      choices=("replay", "fail")),
    S("reset_state", "bool", False, "adopt changed state-shaping settings: drop snapshots taken under other "
      "ones and rebuild the state by replaying the retained history"),
    S("snapshot_chunk_bytes", "int", 512 * 1024, "chunk size on the snapshot topic", "bytes",
      min=1024, max=1024 * 1024),
    S("snapshot_chunk_delay_s", "float", 0.0, "pause between snapshot chunks (throttling, tests)", "s", min=0),
    S("drain", "choice", "batch", "Faust runtime: whole fetches (batch) or Faust's per-event agent",
      choices=("batch", "agent")),
    S("batch_size", "int", 2000, "records per batch", "records", min=1),
    S("batch_within_s", "float", 0.05, "Faust drain=agent: batching window", "s", min=0, min_inclusive=False),
    S("ingest", "choice", "auto", "batch runtime, replay, backfill and the repartition stage: how records are "
      "read: native (librdkafka's C API through confluent-kafka's consumer, no Message object per record), python "
      "(confluent-kafka messages), auto (native where it loads, else python with one info line); docs/runtime.md",
      choices=("auto", "native", "python")),
    S("batch_max_wait_ms", "int", 10, "batch runtime: longest wait for a batch to fill", "ms", min=1),
    S("batch_backlog_factor", "int", 4, "batch runtime, native ingest: after a full batch (a backlog) the next one "
      "takes up to this many times batch_size of the records already fetched, without waiting; 1: off",
      min=1, max=64),
    S("fetch_max_wait_ms", "int", 100, "Faust runtime: aiokafka fetch wait", "ms", min=1),
    S("commit_interval_s", "float", 0.5, "how often source offsets are committed (batch runtime: once the "
      "outputs before them are delivered; exactly_once: the transaction, so the output latency; Faust: its "
      "commit timer, never past a snapshot)", "s", min=0, min_inclusive=False),
    S("session_timeout_s", "float", 30.0, "consumer group session timeout", "s", min=0, min_inclusive=False),
    S("heartbeat_interval_s", "float", 3.0, "consumer group heartbeat", "s", min=0, min_inclusive=False),
    S("group_instance_id", "str", "", "static membership id (and the transactional id with exactly_once)"),
    S("exactly_once", "bool", False, "batch runtime: outputs, snapshots and offsets in one transaction"),
    S("transaction_timeout_s", "float", 60.0, "exactly-once transaction timeout", "s", min=1),
    S("open_transaction_wait_s", "float", None, "longest wait of a restore for another producer's open "
      "transaction (default transaction_timeout_s + 30)", "s", min=0),
    S("web_host", "str", "127.0.0.1", "address of /ready, /live and /metrics"),
    S("web_port", "int", 6066, "port of /ready, /live and /metrics", min=0, max=65535),
    S("key_partitioner", "choice", "murmur2", "how producers partition the source topic by key, for live "
      "score queries to find a key's partition: murmur2 (Kafka's default: Java, Kafka Streams, Faust, "
      "confluent-kafka with partitioner=murmur2_random) or crc32 (librdkafka's default consistent_random)",
      choices=("murmur2", "crc32")),
    S("advertised_url", "str", None, "the URL other workers forward score queries to (default "
      "http(s)://<web_host>:<web_port>)"),
    S("query_token_file", "str", None, "a file of bearer tokens for /v1/* (name:token per line; re-read when "
      "it changes; the first is the workers' own, sent when they forward; docs/security.md)"),
    S("insecure_open_queries", "bool", False, "let /v1/* answer without a token on a non-loopback web_host "
      "(a WARNING on every start)"),
    S("web_tls_cert_file", "str", None, "PEM certificate (chain): the web port speaks HTTPS only"),
    S("web_tls_key_file", "str", None, "PEM private key of web_tls_cert_file"),
    S("web_tls_ca_file", "str", None, "PEM CA(s) forwards (and grudge-stream score) verify HTTPS workers "
      "against (default the system's)"),
    S("query_rate_per_s", "float", 1000.0, "per-client query budget: keys a second (0: no budget)", "keys/s",
      min=0),
    S("query_burst", "float", 5000.0, "per-client query budget: keys at once", "keys", min=1),
    S("query_priority_share", "float", 0.2, "batch runtime: while live queries are in flight the consume loop "
      "waits for them between partitions, for at most this share of its time (0: never)", min=0, max=1),
    S("signing_keys_file", "str", None, "a file of name:secret keys: members records and override entries are "
      "signed, and entries that do not verify are ignored and counted (docs/security.md)"),
    S("query_debug_detail", "bool", False, "score answers also carry per-level reads, cell indexes and the "
      "partition's offsets: they reveal which cells a key occupies, what a framing search needs "
      "(debugging only, docs/serving.md)"),
    S("web_enabled", "bool", True, "Faust runtime: serve the web pages"),
    S("partitions", "int", 8, "Faust runtime: partitions of topics it creates", min=1),
    S("replication_factor", "int", -1, "replication factor of topics the worker creates; -1: the broker's "
      "default.replication.factor (as Kafka Streams); more than the cluster's brokers is refused", min=-1),
    S("broker_wait_s", "float", 120.0, "how long a starting worker waits for an unreachable cluster before "
      "it exits (one line, exit 2)", "s", min=0),
    S("state_dir", "str", None, "where the worker keeps local files (default $GRUDGE_STATE_DIR, else a "
      "per-user state directory; never the working directory)"),
    S("liveness_timeout_s", "float", 60.0, "/live fails when the processing loop made no progress for this long",
      "s", min=1),
    # Connecting to a secured cluster (docs/security.md).
    S("security_protocol", "choice", "PLAINTEXT", "Kafka security protocol",
      choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
    S("sasl_mechanism", "choice", "PLAIN", "SASL mechanism",
      choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")),
    S("sasl_username", "str", None, "SASL user name"),
    S("sasl_password", "secret", None, "SASL password"),
    S("sasl_password_file", "str", None, "a file holding the SASL password"),
    S("ssl_ca_location", "str", None, "CA certificate(s) (PEM) the broker's certificate is checked against"),
    S("ssl_certificate_location", "str", None, "client certificate (PEM), for mutual TLS"),
    S("ssl_key_location", "str", None, "client private key (PEM), for mutual TLS"),
    S("ssl_key_password", "secret", None, "password of the client private key"),
    S("ssl_endpoint_identification", "choice", "https", "check the broker's host name against its certificate",
      choices=("https", "none")),
    S("kafka_properties_file", "str", None, "a client properties file (key=value, librdkafka names)"),
]

_COMMON_SPECS = {s.name: s for s in COMMON if not callable(s.default)}


def setting(settings: Settings, name: str) -> Any:
    """A setting of ``COMMON`` (those every topology and both runtimes take), parsed and
    checked by its declaration, with its declared default: the one place the runtimes read
    those settings from, bound ``Settings`` or not (an unbound ``Settings``, as in tests
    and tools, gets the same defaults and the same checks)."""
    if name in settings.values:
        return settings.values[name]
    spec = _COMMON_SPECS[name]
    raw, source = settings._raw(name)
    return spec.default if raw is _MISSING else spec.parse(raw, source)


# Names that pass through to the Kafka clients by prefix (see docs/security.md).
PASSTHROUGH_PREFIXES = ("kafka.",)


def identity(*, source: str, snapshots: str, operator_id: str, dead_letters: str) -> list[Setting]:
    """The settings that name a topology's state and its source (state-shaping) and its
    dead-letter topic, with the topology's defaults."""
    return [
        Setting("source_topic", "str", source, "the source topic", state=True),
        Setting("snapshot_topic", "str", snapshots, "the compacted snapshot topic", state=True),
        Setting("operator_id", "str", operator_id, "names the state on the snapshot topic", state=True),
        Setting("dead_letter_topic", "str", dead_letters, "records that could not be applied"),
    ]


INDEX_SCHEME = "index_scheme"


def index_scheme_setting() -> Setting:
    """``index_scheme``: how a key's sketch cells derive from its hash (docs/hashing.md). A
    worker left at the default adopts the scheme of the snapshots it restores (a deployment
    keeps its scheme until it resets its state); one that sets it refuses snapshots of the
    other scheme, as it refuses another seed."""
    return Setting(INDEX_SCHEME, "choice", "independent",
                   "how a key's cells derive from its hash: independent (each level from its own hash "
                   "bits) or km (Kirsch-Mitzenmacher, the only scheme of 0.2). Left unset, a worker keeps "
                   "the scheme of the snapshots it restores (docs/hashing.md)",
                   choices=("independent", "km"), state=True)
