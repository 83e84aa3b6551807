"""A topology: which topic feeds which operator, and where its outputs and snapshots go.

Topology modules (the shipped ones are ``grudge_stream.topologies.*``) define
``build(settings) -> Topology``;
the runtimes (Faust worker, batch runner, replay) take it from there.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from grudge_stream.exceptions import ConfigError
from grudge_stream.hashkey import hash_key_from_settings
from grudge_stream.operators.base import Operator, OperatorContext
from grudge_stream.operators.codec import EventCodec
from grudge_stream.operators.deadletters import DEFAULT_DEAD_LETTER_LIMIT
from grudge_stream.sections import Checkpointing, EventTime, Group
from grudge_stream.settings import COMMON, INDEX_SCHEME, PASSTHROUGH_PREFIXES, Setting, Settings

log = logging.getLogger("grudge_stream.runtime")

__all__ = ["Settings", "Topology", "RepartitionPlan", "load_topology", "topology_names", "operator_settings", "codec_settings"]

RESTORE_FALLBACKS = ("replay", "fail")

# -- the repartition plan: a topology keyed by a field re-keys its source through a topic ---------

REPARTITION_MODES = ("auto", "on", "off")
REPARTITION_SETTING = Setting("repartition", "choice", "auto",
                  "key_field set: re-key the source by the field through the worker-managed topic "
                  "<app_id>-repartition (auto: whenever key_field is set; off: the source is already "
                  "partitioned by the field)", choices=REPARTITION_MODES, state=True)


@dataclass(frozen=True)
class RepartitionPlan:
    """Where the stage reads and writes; ``Topology.repartition`` of a re-keyed topology."""

    source_topic: str  # the topic producers write (keyed by anything)
    topic: str  # <app_id>-repartition: keyed by the field, read by the operators
    group: str  # the stage's consumer group
    app_id: str
    operator_id: str
    key_field: str
    dead_letter_topic: str
    max_key_bytes: int = 1024
    allow_empty_keys: bool = False

    def codec(self) -> EventCodec:
        return EventCodec(key_field=self.key_field, value_field=None, max_key_bytes=self.max_key_bytes,
                          allow_empty_keys=self.allow_empty_keys)


def repartition_plan(settings: Any, *, source: str, operator_id: str, key_field: str | None,
         dead_letter_topic: str) -> RepartitionPlan | None:
    """The topology's repartition plan, or None when the operators read ``source`` directly.

    The app id is fixed here (``app_id`` or ``grudge-<operator_id>-<source>``, the default of
    an un-repartitioned topology) so the topic name does not depend on itself."""
    mode = settings.get("repartition", "auto")
    if mode not in REPARTITION_MODES:
        raise ConfigError(f"setting 'repartition' must be one of {', '.join(REPARTITION_MODES)}, got {mode!r}")
    if key_field is None:
        if mode == "on":
            raise ConfigError("repartition=on needs key_field: without it the record key is the key, "
                              "and the source is partitioned by it already")
        return None
    if mode == "off":
        return None
    app_id = Group.of(settings).app_id or f"grudge-{operator_id}-{source}"
    event_time = EventTime.of(settings)
    return RepartitionPlan(source_topic=source, topic=f"{app_id}-repartition", group=f"{app_id}-repartition",
                           app_id=app_id, operator_id=operator_id, key_field=key_field,
                           dead_letter_topic=dead_letter_topic, max_key_bytes=event_time.max_key_bytes,
                           allow_empty_keys=event_time.allow_empty_keys)


def operator_settings(settings: Settings, topology: str, hashed: bool = True) -> dict[str, Any]:
    """The settings every operator takes (docs/runtime.md): event-time bounds and their
    policies, and the secret hash key (required; see grudge_stream.hashkey). ``hashed=False``:
    an operator that hashes no public key into a sketch (``heavy_global``) takes none. (The
    ``EventTime`` section of ``settings``, with the key.)"""
    event_time = EventTime.of(settings)
    return {
        "max_future_ms": event_time.max_future_ms,
        "future_policy": event_time.future_policy,
        "max_late_ms": event_time.max_late_ms,
        "late_policy": event_time.late_policy,
        "hash_key": hash_key_from_settings(settings, topology) if hashed else None,
    }


def codec_settings(settings: Settings) -> dict[str, Any]:
    """Key checks every codec applies: ``max_key_bytes`` (1024: longer keys are
    dead-lettered) and ``allow_empty_keys`` (false: empty keys are dead-lettered)."""
    event_time = EventTime.of(settings)
    return {"max_key_bytes": event_time.max_key_bytes, "allow_empty_keys": event_time.allow_empty_keys}


@dataclass(frozen=True)
class Topology:
    """Topics in, one operator per source partition, topics out.

    Plain frozen data, built once from the settings by a topology module's ``build``:
    reading any field (an id, a topic name) builds no operator. A changed copy is
    ``dataclasses.replace(topology, name=...)``. What a runtime attaches to a running
    deployment (the overrides table) lives in ``attached``, not in the spec."""

    name: str
    source_topic: str
    make_operator: Callable[[int], Operator]
    outputs: dict[str, str]
    snapshot_topic: str
    checkpoint_interval_s: float = 5.0
    restore_fallback: str = "replay"
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # A topology keyed by a field: the stage that re-keys the source into the topic the
    # operators read (grudge_stream.repartition); None = the operators read the source.
    repartition: RepartitionPlan | None = None
    app_id: str = ""  # consumer group / Faust app id; "" = grudge-<operator_id>-<source_topic>
    reset_state: bool = False  # adopt changed state-shaping settings by replaying (docs/runtime.md)
    # Manual allow / deny entries (grudge_stream.overrides); "" = derived from the alerts (or
    # decisions) topic: "<alerts>-overrides". None = the topology takes no overrides.
    overrides_topic: str | None = ""
    # The operators' id (snapshot keys, output ids); "" = asked of an operator, once.
    operator_id: str = ""
    # Whether the operators read record headers (``Operator.needs_headers``: the runtimes
    # then hand them SourceRecords, not columns); None = asked of an operator, once.
    needs_headers: bool | None = None
    # What runtimes attached to the running deployment: ``"overrides"``, the allow / deny
    # table (``grudge_stream.overrides.attach_overrides``); not part of the spec.
    attached: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # The same topology under another index scheme, when its ``index_scheme`` setting was
    # left at the default (None: set explicitly, or not a setting of this topology): a
    # restore then adopts the scheme of the partition's snapshots (docs/hashing.md).
    with_index_scheme: Callable[[str], "Topology"] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.restore_fallback not in RESTORE_FALLBACKS:
            raise ConfigError(f"restore_fallback must be one of {RESTORE_FALLBACKS}")
        if self.checkpoint_interval_s <= 0:
            raise ConfigError("checkpoint_interval_s must be > 0")
        if "dead_letters" not in self.outputs:
            raise ConfigError("a topology needs a dead_letters output topic")
        derive = object.__setattr__  # the fields a topology left to be derived, once, here
        if not self.operator_id or self.needs_headers is None:
            op = self.make_operator(0)  # a topology that did not say: built once, here
            derive(self, "operator_id", self.operator_id or op.operator_id)
            if self.needs_headers is None:
                derive(self, "needs_headers", bool(op.needs_headers))
        if not self.app_id:
            derive(self, "app_id", f"grudge-{self.operator_id}-{self.source_topic}")
        judged = self.outputs.get("alerts") or self.outputs.get("decisions")
        if "alerts" in self.outputs and "alert_state" not in self.outputs:
            # The current raised set, compacted and keyed by the key (docs/serving.md).
            self.outputs["alert_state"] = self.outputs["alerts"] + "-state"
        if self.overrides_topic == "":
            derive(self, "overrides_topic", f"{judged}-overrides" if judged else None)

    def output_topic(self, role: str) -> str | None:
        return self.outputs.get(role)

    @property
    def overrides(self) -> Any:
        """The deployment's allow / deny table once a runtime attached it, else None; every
        operator built by ``operator`` from then on gets it in its context."""
        return self.attached.get("overrides")

    def operator(self, partition: int, partition_count: int | None = None,
                 dead_letter_limit: int = DEFAULT_DEAD_LETTER_LIMIT) -> Operator:
        """A new operator for ``partition`` (``make_operator``), handed the runtime's context
        (``OperatorContext``): what runtimes, replay and restores build operators with."""
        op = self.make_operator(partition)
        op.init(OperatorContext(partition, partition_count, self.overrides, dead_letter_limit))
        return op


SHIPPED_PACKAGE = "grudge_stream.topologies"


def topology_names() -> list[str]:
    """The shipped topologies (the modules of ``grudge_stream.topologies``)."""
    import pkgutil

    shipped = importlib.import_module(SHIPPED_PACKAGE)
    return sorted(m.name for m in pkgutil.iter_modules(shipped.__path__) if not m.name.startswith("_"))


def _import_from_cwd(modname: str) -> ModuleType | None:
    """Import ``modname``, looking in the working directory as well when it is not
    importable (as ``python -m`` would), so ``worker mytopos.fraud`` works from the
    directory holding ``mytopos/``. Returns None when the module itself is missing."""
    for attempt in range(2):
        try:
            return importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if not (modname == missing or modname.startswith(missing + ".")):
                raise  # the module exists but imports something missing: show that
        cwd = os.getcwd()
        if attempt or cwd in sys.path or modname.startswith(SHIPPED_PACKAGE + "."):
            return None
        sys.path.append(cwd)
    return None


def load_topology_module(name: str) -> ModuleType:
    """A shipped topology's name (``rate_limit``), a dotted module path
    (``mytopos.fraud``), or a ``.py`` file."""
    if name.endswith(".py") or os.sep in name:
        spec = importlib.util.spec_from_file_location(f"grudge_topology_{abs(hash(name))}", name)
        if spec is None or spec.loader is None or not os.path.isfile(name):
            raise ConfigError(f"cannot load topology file {name!r}")
        from_file = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(from_file)
        return from_file
    modname = name if "." in name else f"{SHIPPED_PACKAGE}.{name}"
    module = _import_from_cwd(modname)
    if module is None and name.startswith("topologies."):
        # 0.1 installed the shipped topologies as a top-level ``topologies`` package.
        module = _import_from_cwd(f"{SHIPPED_PACKAGE}.{name.split('.', 1)[1]}")
        if module is not None:
            log.warning("topology %r: the shipped topologies moved to %s; name it %r or %r",
                        name, SHIPPED_PACKAGE, name.split(".", 1)[1], module.__name__)
    if module is None:
        raise ConfigError(
            f"unknown topology {name!r}; the topologies are: {', '.join(topology_names())} "
            "(or pass a dotted module or a .py file)"
        )
    return module


def topology_short_name(name: str) -> str:
    base = os.path.basename(name)
    return (base[:-3] if base.endswith(".py") else base).rsplit(".", 1)[-1]


def bind_settings(module: ModuleType, name: str, settings: Settings) -> Settings:
    """Declare the module's settings (``SETTINGS`` and ``validate``, plus ``COMMON``) on
    ``settings``, checking every given name and value."""
    declared = getattr(module, "SETTINGS", None)
    if declared is not None:
        settings.bind(topology_short_name(name), [*declared, *COMMON], PASSTHROUGH_PREFIXES,
                      getattr(module, "validate", None))
    return settings


def load_topology(name: str, settings: Settings | None = None) -> Topology:
    """Load a shipped topology by name, a dotted module path, or a ``.py`` file, and build it.

    A module that declares ``SETTINGS`` gets every setting checked first: an unknown name
    or a bad value is a ConfigError naming it (docs/runtime.md, "Settings")."""
    settings = settings or Settings()
    module = load_topology_module(name)
    build = getattr(module, "build", None)
    if build is None:
        raise ConfigError(f"topology module {module.__name__!r} has no build(settings) function")
    bind_settings(module, name, settings)
    topology = build(settings)
    if not isinstance(topology, Topology):
        raise ConfigError(f"topology module {module.__name__!r}: build(settings) returned "
                          f"{type(topology).__name__}, not a Topology")
    reset_state = bool(Checkpointing.of(settings).reset_state)
    rescheme = None
    if INDEX_SCHEME in settings.declared and settings.sources.get(INDEX_SCHEME) == "default" and not reset_state:
        given = settings

        def rescheme(scheme: str) -> Topology:
            return load_topology(name, Settings({**given.overrides, INDEX_SCHEME: scheme}, environ=given.environ))
    return dataclasses.replace(topology, app_id=Group.of(settings).app_id or topology.app_id,
                               reset_state=reset_state, with_index_scheme=rescheme)
