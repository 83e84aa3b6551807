"""Manual overrides: allow and deny entries that workers apply before their own judgement.

An operator adds them with ``grudge-stream override <topology> allow|deny|clear KEY
[--for 1h]``; they live on a compacted topic (``Topology.overrides_topic``, one
partition), keyed by the key, one JSON value per key::

    {"action": "deny", "created_ms": 1764566400000, "expires_ms": 1764570000000,
     "reason": "ticket 4711", "by": "alice"}

``clear`` writes a tombstone. ``allow`` means "never raised": a raised key is
cleared, and a key is not raised whatever its score. ``deny`` means "always
raised". An entry is in force from ``created_ms`` until ``expires_ms`` (none:
until cleared).

Who applies them:

- **Workers** (``OverrideTable`` fed by a ``TopicFollower``, attached to every
  operator by ``attach_overrides``) judge each event against the table *at the
  event's time*: an entry applies to events stamped in ``[created_ms,
  expires_ms)``. Replaying history therefore applies an entry only to events
  after it was made, as the live worker did. A worker learns of an entry
  within a poll (about 100 ms) and acts on it at the key's next event (or the
  next sweep, for an allowed key already raised); the alert and the alert
  state topic then say ``"override": "allow"|"deny"``.
- **The subscriber library** (``grudge_stream.client.AlertView``) applies the
  entries itself, on wall-clock time, the moment it reads them: a denied key
  is raised in every subscriber at once, even if the worker never sees
  another event for it.

With ``signing_keys_file`` (``grudge_stream.signing``) entries are signed, ``by`` is the
signer's key name, a clear is a signed entry, and readers ignore and count every entry
that does not verify.
"""
from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple

from grudge_stream.exceptions import ConfigError
from grudge_stream.follow import TopicFollower

if TYPE_CHECKING:
    from grudge_stream.signing import SigningKeys
    from grudge_stream.topology import Topology

log = logging.getLogger("grudge_stream.overrides")

ACTIONS = ("allow", "deny")
SIGNED_KIND = "override"  # the entry kind a signed override's MAC covers (grudge_stream.signing)
# One partition: the table is small, read whole by every worker and subscriber, and in order.
OVERRIDES_TOPIC_CONFIG = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1",
                          "segment.ms": str(6 * 3600 * 1000)}
# The current raised set (``alert_state`` output role): compacted, keyed by the alert key.
ALERT_STATE_TOPIC_CONFIG = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1",
                            "segment.ms": str(6 * 3600 * 1000)}


class Override(NamedTuple):
    action: str  # "allow" or "deny"
    created_ms: int
    expires_ms: int | None
    reason: str = ""
    by: str = ""

    def active(self, at_ms: int) -> bool:
        return self.created_ms <= at_ms and (self.expires_ms is None or at_ms < self.expires_ms)

    def to_json(self, key: bytes) -> dict[str, Any]:
        from grudge_stream.operators.records import key_fields

        return {**key_fields(key), "action": self.action, "created_ms": self.created_ms,
                "expires_ms": self.expires_ms, "reason": self.reason, "by": self.by}


def parse_duration(text: str) -> int:
    """``90s``, ``15m``, ``1h``, ``7d`` or plain seconds → milliseconds (> 0)."""
    t = text.strip().lower()
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    for suffix in ("ms", "s", "m", "h", "d"):
        if t.endswith(suffix):
            num, scale = t[: -len(suffix)], units[suffix]
            break
    else:
        num, scale = t, 1000
    try:
        v = float(num)
    except ValueError:
        raise ConfigError(f"cannot read duration {text!r} (use e.g. 90s, 15m, 1h, 7d)") from None
    if not v > 0 or v != v or v == float("inf"):
        raise ConfigError(f"duration {text!r} must be positive")
    return int(v * scale)


def encode_override(action: str, *, now_ms: int | None = None, for_ms: int | None = None,
                    reason: str = "", by: str = "", key: bytes | None = None,
                    signing: SigningKeys | None = None) -> bytes:
    """An entry's value. With ``signing`` (``grudge_stream.signing.SigningKeys``; ``key``
    needed) the entry is signed, ``by`` is the signer's name, and ``action`` may also be
    ``clear`` (a signed clear: an unsigned tombstone is ignored by verifying readers)."""
    if action not in ACTIONS and not (signing is not None and action == "clear"):
        raise ConfigError(f"override action must be one of {ACTIONS}, not {action!r}")
    created = int(time.time() * 1000) if now_ms is None else int(now_ms)
    body = {"action": action, "created_ms": created,
            "expires_ms": None if for_ms is None else created + int(for_ms), "reason": reason, "by": by}
    if signing is not None:
        if key is None:
            raise ValueError("a signed override needs its key")
        body["by"] = signing.signer
        return signing.sign(SIGNED_KIND, key, body)
    return json.dumps(body, separators=(",", ":")).encode()


def decode_override(value: bytes | dict[str, Any]) -> Override:
    """An entry's value; ValueError when it is not one (such entries are logged and ignored)."""
    body = json.loads(value) if not isinstance(value, dict) else value
    if not isinstance(body, dict) or body.get("action") not in ACTIONS:
        raise ValueError("not an override entry (needs action allow|deny)")
    created = body.get("created_ms", 0)
    expires = body.get("expires_ms")
    if not isinstance(created, int) or (expires is not None and not isinstance(expires, int)):
        raise ValueError("created_ms and expires_ms must be integer milliseconds")
    return Override(body["action"], created, expires, str(body.get("reason", ""))[:500],
                    str(body.get("by", ""))[:200])


class OverrideTable:
    """The current overrides, by key. Written by one follower thread, read by operators:
    single dict operations, so readers never see a half-applied entry.

    ``signing`` (``grudge_stream.signing.SigningKeys``): only entries signed by one of its
    keys apply; others (unsigned tombstones included) are ignored and counted in
    ``rejected`` (and passed to ``on_reject``). A signed entry older than the one in force
    for its key is ignored too (``stale``)."""

    def __init__(self, signing: SigningKeys | None = None, on_reject: Callable[[], None] | None = None) -> None:
        self._entries: dict[bytes, Override] = {}
        self._denies: dict[bytes, Override] = {}
        self.version = 0
        self.ignored = 0
        self.signing = signing
        self.on_reject = on_reject
        self.rejected = 0
        self.stale = 0
        self._newest: dict[bytes, int] = {}  # created_ms of the newest signed entry (clears too)

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:  # an empty table must not look "absent" to `if table`
        return True

    def apply(self, key: bytes | None, value: bytes | None) -> tuple[Override | None, Override | None] | None:
        """Apply one topic record; ``(old, new)`` when the table changed, None otherwise."""
        if key is None:
            self.ignored += 1
            return None
        if self.signing is not None:
            return self._apply_signed(key, value)
        try:
            new = None if value is None else decode_override(value)
        except ValueError as exc:
            self.ignored += 1
            log.warning("ignoring an override entry that is not one (%s)", exc)
            return None
        return self._put(key, new)

    def _put(self, key: bytes, new: Override | None) -> tuple[Override | None, Override | None] | None:
        """``key``'s entry becomes ``new`` (None: removed); ``(old, new)``, or None when
        nothing changed."""
        old = self._entries.get(key)
        if new is None:
            if old is None:
                return None
            del self._entries[key]
            self._denies.pop(key, None)
        else:
            self._entries[key] = new
            if new.action == "deny":
                self._denies[key] = new
            else:
                self._denies.pop(key, None)
        self.version += 1
        return old, new

    def _apply_signed(self, key: bytes, value: bytes | None) -> tuple[Override | None, Override | None] | None:
        assert self.signing is not None  # apply() sends only a verifying table's entries here
        try:
            body, signer = self.signing.verify(SIGNED_KIND, key, value)
            created = body.get("created_ms")
            if not isinstance(created, int):
                raise ValueError("created_ms must be integer milliseconds")
            new = None if body.get("action") == "clear" else decode_override({**body, "by": signer})
        except ValueError as exc:
            self.rejected += 1
            if self.on_reject is not None:
                self.on_reject()
            log.warning("ignoring an override entry that does not verify (%s)", exc)
            return None
        if created < self._newest.get(key, -1):
            self.stale += 1
            log.warning("ignoring a signed override entry older than the one in force (a replayed record?)")
            return None
        self._newest[key] = created
        return self._put(key, new)

    def get(self, key: bytes) -> Override | None:
        return self._entries.get(key)

    def action(self, key: bytes, at_ms: int) -> str | None:
        """``"allow"``, ``"deny"`` or None for ``key`` at time ``at_ms``."""
        o = self._entries.get(key)
        return o.action if o is not None and o.active(at_ms) else None

    def denied(self, at_ms: int) -> list[bytes]:
        """Keys denied at ``at_ms``."""
        return [k for k, o in list(self._denies.items()) if o.active(at_ms)]

    def has_denies(self) -> bool:
        return bool(self._denies)

    def items(self) -> Iterator[tuple[bytes, Override]]:
        return iter(list(self._entries.items()))


def start_override_follower(topology: Topology, bootstrap_servers: str,
                            client_config: dict[str, Any] | None = None,
                            wait_s: float = 30.0, signing: SigningKeys | None = None,
                            on_reject: Callable[[], None] | None = None) -> tuple[OverrideTable, TopicFollower] | None:
    """Follow ``topology.overrides_topic`` into a table, waiting (up to ``wait_s``) for the
    entries written so far, and attach it to every operator the topology makes. ``signing``:
    only signed entries apply (``OverrideTable``)."""
    topic = getattr(topology, "overrides_topic", "")
    if not topic:
        return None
    table = OverrideTable(signing, on_reject)
    def apply(_topic: str, key: bytes | None, value: bytes | None) -> None:
        table.apply(key, value)

    follower = TopicFollower(bootstrap_servers, [topic], apply,
                             client_config=client_config, name="grudge-overrides").start()
    if not follower.wait_caught_up(wait_s):
        log.warning("overrides topic %s not read to its end after %.0f s; starting anyway (entries apply "
                    "as they arrive)", topic, wait_s)
    attach_overrides(topology, table)
    return table, follower


def attach_overrides(topology: Topology, table: OverrideTable) -> None:
    """Every operator ``topology.operator`` builds from now on judges with ``table`` (its
    ``OperatorContext``); attaching again replaces the table."""
    topology.attached["overrides"] = table
