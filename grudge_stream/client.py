"""The subscriber library: a topology's current raised set, live, in your process.

    from grudge_stream.client import AlertView

    with AlertView.for_topology("abuse_scores", bootstrap_servers="kafka:9092") as view:
        if view.is_raised(client_id):      # O(1), no I/O
            return refuse()

``AlertView.for_state(state)`` (or ``for_state("shop-guard-abuse", bootstrap_servers=...)``)
is the same view of a sketch state embedded in your own app (docs/embedding.md).

``AlertView`` reads two compacted topics from the beginning and keeps following
them in a background thread:

- the topology's **alert state** topic (output role ``alert_state``,
  ``<alerts topic>-state``): for every raised key, the alert that raised it;
  a tombstone once the key is cleared (or dropped by a latch overflow). Each key
  is judged by the one partition that owns it, so the topic is correct across
  partitions, and workers restarting re-emit the same records (alert ids are
  deterministic), so it stays correct across crashes;
- the topology's **overrides** topic (``grudge_stream.overrides``): allow and
  deny entries, applied here on wall-clock time the moment they are read (a
  worker applies them at the key's next event).

A key is raised when a deny entry is in force, or when the alert state says so
and no allow entry is in force. ``on_raise(key, state)`` / ``on_clear(key,
state)`` run on every change of that, after the bootstrap (the set as it
stood at start is ``raised()``); on the follower thread, or with ``loop=`` on
that asyncio loop (``call_soon_threadsafe``). ``is_raised``, ``get`` and
``raised`` are safe from any thread.

Consistency: a view lags the workers by the output delivery and its poll
(tens of milliseconds on a healthy cluster); under exactly-once workers it
reads committed records only, so it sees a raise once its checkpoint
transaction commits.
"""

import asyncio
import heapq
import json
import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from grudge_stream.follow import TopicFollower
from grudge_stream.overrides import Override, OverrideTable

if TYPE_CHECKING:
    from grudge_stream.topology import Settings

log = logging.getLogger("grudge_stream.client")

__all__ = ["AlertState", "AlertView", "Override", "topology_topics"]


class AlertState(NamedTuple):
    """A key's effective state in a view."""

    key: bytes
    raised: bool
    alert: dict[str, Any] | None  # the raise alert from the alert state topic (score, alert_id, event time...)
    override: Override | None  # the allow / deny entry in force, if any

    @property
    def score(self) -> float | None:
        score = None if self.alert is None else self.alert.get("score")
        return None if score is None else float(score)

    @property
    def reason(self) -> str:
        if self.override is not None:
            return f"override:{self.override.action}"
        return "score" if self.raised else "none"


def _key_bytes(key: bytes | str) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else bytes(key)


def topology_topics(name: str, settings: "Settings | None" = None) -> dict[str, str | None]:
    """``{"alert_state": ..., "overrides": ..., "alerts": ..., "app_id": ...}`` of a
    topology, from its settings (``--set`` / ``GRUDGE_*``), as its workers name them. The topology's secret
    hash key is not needed: a throw-away one stands in (the sketches are never used)."""
    from grudge_stream.sections import Identity
    from grudge_stream.topology import Settings, load_topology

    settings = settings or Settings()
    identity = Identity.of(settings)
    if identity.seed is None and identity.seed_file is None and not identity.insecure_public_seed:
        settings.overrides["seed"] = secrets.token_hex(16)
    topology = load_topology(name, settings)
    return {"alert_state": topology.outputs.get("alert_state"), "overrides": topology.overrides_topic,
            "alerts": topology.outputs.get("alerts"), "bootstrap_servers": settings.bootstrap_servers,
            "app_id": topology.app_id}


class AlertView:
    """The current raised set of one topology (see the module docstring)."""

    def __init__(self, bootstrap_servers: str, state_topic: str, overrides_topic: str | None = None, *,
                 client_config: dict[str, Any] | None = None,
                 on_raise: Callable[[bytes, AlertState], None] | None = None,
                 on_clear: Callable[[bytes, AlertState], None] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, signing: Any = None) -> None:
        """``signing`` (``grudge_stream.signing.SigningKeys``): apply only signed override
        entries (``overrides_rejected`` counts the others), as the workers do."""
        self.state_topic = state_topic
        self.overrides_topic = overrides_topic or None
        self.on_raise = on_raise
        self.on_clear = on_clear
        self.loop = loop
        self._alerts: dict[bytes, dict[str, Any]] = {}
        self._overrides = OverrideTable(signing)
        self._raised: set[bytes] = set()
        self._expiries: list[tuple[int, bytes]] = []  # (ms, key): overrides starting or ending
        self._lock = threading.RLock()  # callbacks run under it and may read the view
        self._bootstrapped = False
        topics = [state_topic] + ([self.overrides_topic] if self.overrides_topic else [])
        self._follower = TopicFollower(bootstrap_servers, topics, self._handle, client_config=client_config,
                                       tick=self._tick, name="grudge-alert-view")
        self.ready = threading.Event()
        self.app_id: str | None = None  # the deployment's, when built by for_topology

    @classmethod
    def for_topology(cls, topology: str, settings: "Settings | None" = None, *,
                     bootstrap_servers: str | None = None, **kwargs: Any) -> "AlertView":
        """A view of a shipped (or dotted, or ``.py``) topology, topics named as its workers name them."""
        from grudge_stream.kafkaconf import client_config
        from grudge_stream.topology import Settings

        settings = settings or Settings({"bootstrap_servers": bootstrap_servers} if bootstrap_servers else None)
        topics = topology_topics(topology, settings)
        if not topics["alert_state"]:
            from grudge_stream.exceptions import ConfigError

            raise ConfigError(f"topology {topology!r} publishes no alerts")
        kwargs.setdefault("client_config", client_config(settings))
        if "signing" not in kwargs:
            from grudge_stream.signing import SigningKeys

            kwargs["signing"] = SigningKeys.from_settings(settings)
        view = cls(settings.bootstrap_servers, topics["alert_state"], topics["overrides"], **kwargs)
        view.app_id = topics["app_id"]
        return view

    @classmethod
    def for_state(cls, state: Any, *, bootstrap_servers: str | None = None,
                  client_config: dict[str, Any] | None = None, alerts_topic: str | None = None,
                  **kwargs: Any) -> "AlertView":
        """A view of the ban list of sketch state embedded in an app (``grudge_stream.state``,
        docs/embedding.md): ``state`` is the state itself (its topics and cluster are its
        own, a Faust app's if it is attached to one), or its name (topics ``<name>-alerts-state``
        and ``<name>-alerts-overrides``; ``alerts_topic`` if the state was given one). The
        overrides topic is read whether the state follows it (``overrides=True``) or not."""
        from grudge_stream.topology import Settings

        if isinstance(state, str):
            if not state:
                raise ValueError("state: a state's name, not ''")
            alerts = alerts_topic or f"{state}-alerts"
            bootstrap = bootstrap_servers or Settings().bootstrap_servers
        else:
            alerts = state.outputs.get("alerts")
            if not alerts:
                from grudge_stream.exceptions import ConfigError

                raise ConfigError(f"state {state.name!r} publishes no alerts")
            own_bootstrap, own_config = state.connection()
            bootstrap = bootstrap_servers or own_bootstrap
            if client_config is None:
                from grudge_stream.kafkaconf import client_config as settings_client_config

                client_config = {**settings_client_config(state.settings, bootstrap), **own_config}
        if client_config is None:
            from grudge_stream.kafkaconf import client_config as settings_client_config

            client_config = settings_client_config(Settings(), bootstrap)
        return cls(bootstrap, f"{alerts}-state", f"{alerts}-overrides", client_config=client_config, **kwargs)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> "AlertView":
        """Start following; return once the topics are read up to their ends at start
        (``TimeoutError`` if that takes longer than ``timeout_s``)."""
        self._follower.start()
        if not self._follower.wait_caught_up(timeout_s):
            self.stop()
            raise TimeoutError(f"alert view: {self.state_topic} not read to its end within {timeout_s:g} s "
                               f"({self._follower.error or 'no answer'})")
        with self._lock:
            self._bootstrapped = True
            self._recompute_all(notify=False)
        self.ready.set()
        return self

    async def start_async(self, timeout_s: float = 60.0) -> "AlertView":
        """``start`` from asyncio code (callbacks then run on the running loop)."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        await asyncio.get_running_loop().run_in_executor(None, self.start, timeout_s)
        return self

    def stop(self) -> None:
        self._follower.stop()

    def __enter__(self) -> "AlertView":
        return self.start() if not self.ready.is_set() else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "AlertView":
        return await self.start_async() if not self.ready.is_set() else self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.stop)

    # -- reads (any thread) ------------------------------------------------------------------

    def is_raised(self, key: bytes | str) -> bool:
        return _key_bytes(key) in self._raised

    def get(self, key: bytes | str) -> AlertState:
        k = _key_bytes(key)
        with self._lock:
            return self._state(k, int(time.time() * 1000))

    def raised(self) -> dict[bytes, AlertState]:
        """Every raised key, with its state (a snapshot)."""
        now = int(time.time() * 1000)
        with self._lock:
            return {k: self._state(k, now) for k in self._raised}

    def __len__(self) -> int:
        return len(self._raised)

    def __contains__(self, key: bytes | str) -> bool:
        return self.is_raised(key)

    @property
    def overrides_rejected(self) -> int:
        """Override entries ignored because they do not verify (with ``signing``)."""
        return self._overrides.rejected

    @property
    def records(self) -> int:
        return self._follower.records

    # -- the follower thread -----------------------------------------------------------------

    def _state(self, key: bytes, now_ms: int) -> AlertState:
        o = self._overrides.get(key)
        active = o if o is not None and o.active(now_ms) else None
        alert = self._alerts.get(key)
        raised = (active.action == "deny") if active is not None else alert is not None
        return AlertState(key, raised, alert, active)

    def _handle(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        with self._lock:
            if topic == self.state_topic:
                if value is None:
                    self._alerts.pop(key, None)
                else:
                    try:
                        self._alerts[key] = json.loads(value)
                    except ValueError:
                        log.warning("alert view: a record of %s is not JSON; ignored", topic)
                        return
            else:
                changed = self._overrides.apply(key, value)
                if changed is None:
                    return
                new = changed[1]
                if new is not None:
                    for t in (new.created_ms, new.expires_ms):
                        if t is not None:
                            heapq.heappush(self._expiries, (t, key))
            if self._bootstrapped:
                self._recompute(key, int(time.time() * 1000), notify=True)

    def _tick(self) -> None:
        if not self._expiries:
            return
        now = int(time.time() * 1000)
        with self._lock:
            while self._expiries and self._expiries[0][0] <= now:
                _, key = heapq.heappop(self._expiries)
                if self._bootstrapped:
                    self._recompute(key, now, notify=True)

    def _recompute_all(self, notify: bool) -> None:
        now = int(time.time() * 1000)
        for key in set(self._alerts) | {k for k, _ in self._overrides.items()} | set(self._raised):
            self._recompute(key, now, notify)

    def _recompute(self, key: bytes, now_ms: int, notify: bool) -> None:
        state = self._state(key, now_ms)
        was = key in self._raised
        if state.raised == was:
            return
        if state.raised:
            self._raised.add(key)
        else:
            self._raised.discard(key)
        cb = self.on_raise if state.raised else self.on_clear
        if notify and cb is not None:
            if self.loop is not None:
                self.loop.call_soon_threadsafe(cb, key, state)
            else:
                try:
                    cb(key, state)
                except Exception:  # noqa: BLE001 - a user callback must not stop the view
                    log.exception("alert view: %s callback failed", "on_raise" if state.raised else "on_clear")
