"""Backfill for embedded state: a state added to an app, filled from its source topic's history.

A state attached to an app that already runs starts at the group's committed position:
the records before it were handed to the app's other agents, and a Faust app (or a
loop of one's own) cannot hand them again to one agent only. ``backfill`` runs the
state's operators over ``[earliest retained, the group's committed offset)`` of each
partition of the source topic, outside the app (``grudge-stream replay``'s reader and
column pipeline, on event time), and writes the state's snapshots at exactly those
offsets. The app, started with the state, restores each partition from its snapshot and
consumes from the committed offset on, as before: its other agents get no record
twice, and the state is byte for byte that of a run from the start.

The records reach the state through ``value_of(key, value)``: what the app's own code
computes for a record (a score's delta, a rate limiter's cost, a heavy-hitter count; for
a forgetting set anything but None), None for a record the app leaves the state alone
on. Write it once and call it from the agent too, so both agree.

What is safe (docs/embedding.md, "Backfill"):

- the group must have no active member (every instance of the app stopped): while the
  app runs, its committed offsets move on, and the records between the backfill's end
  and where the app resumes would never reach the state. ``while_live=True`` runs a
  first pass anyway (the long one, up to the offsets committed now); a second run with
  the app stopped continues from its snapshots to the final offsets (the short one);
- a state with snapshots of some partitions but not of others is refused, and so is a
  snapshot past the group's committed offset (the state ran live after the group's
  position, or the group was reset);
- nothing is published unless asked (the what-if rules of docs/runtime.md): the
  outputs (alerts, alert state) go to ``sink``, None by default.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from grudge_stream.exceptions import ConfigError
from grudge_stream.operators.codec import BadRecord
from grudge_stream.operators.records import OutputRecord

log = logging.getLogger("grudge_stream.backfill")

# How long a backfill waits for a cluster (or a group coordinator) that does not answer.
WAIT_S = 30.0


@dataclass
class BackfillReport:
    group: str
    records: int = 0              # records of the source topic read
    applied: int = 0              # of which value_of gave a value (handed to the state)
    seconds: float = 0.0
    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)   # the group's committed offsets (clamped)
    continued: bool = False       # from the state's snapshots (a second pass) instead of fresh
    live_members: int = 0         # the group's members while it ran (while_live)
    outputs: dict[str, int] = field(default_factory=dict)
    snapshots: dict[int, int] = field(default_factory=dict)  # partition -> generation
    ingest: str = "python"        # how the records were read: native or python

    @property
    def complete(self) -> bool:
        """True when the app may start with the state: no member moved the group meanwhile."""
        return self.live_members == 0

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "records": self.records, "applied": self.applied,
                "seconds": round(self.seconds, 3), "start": self.start, "end": self.end,
                "continued": self.continued, "complete": self.complete, "live_members": self.live_members,
                "outputs": self.outputs, "snapshots": self.snapshots, "ingest": self.ingest}


def group_of(state: Any, group: str | None) -> str:
    """The consumer group whose committed position the state is filled up to: ``group``,
    else that of the Faust app the state is attached to (its ``id``)."""
    if group is not None:
        if not isinstance(group, str) or not group:
            raise ConfigError(f"group must be a non-empty string, not {group!r}")
        return group
    found = getattr(state, "app_group", None)
    if not found:
        raise ConfigError(f"state {state.name!r} is not attached to a Faust app: give the consumer group of "
                          "the loop that feeds it (group=..., --group GROUP)")
    return str(found)


def committed_offsets(bootstrap: str, conf: dict, group: str, topic: str, partitions: list[int],
                      wait_s: float = WAIT_S) -> dict[int, int | None]:
    """The group's committed offset of each partition of ``topic`` (None: no commit)."""
    from grudge_stream.kafka import offsets
    from grudge_stream.topics import wait_for_cluster

    def ask() -> dict[int, int | None]:
        got = offsets.committed_offsets(conf, group, topic, partitions)
        return {p: (o if o >= 0 else None) for p, o in got.items()}

    return wait_for_cluster(f"reading the committed offsets of group {group!r}", ask, wait_s, bootstrap)


def live_members(bootstrap: str, conf: dict, group: str, wait_s: float = WAIT_S) -> int:
    """How many members the group has now (0: empty or unknown)."""
    from grudge_stream.topics import group_runtime, wait_for_cluster

    found = wait_for_cluster(f"describing consumer group {group!r}",
                             lambda: group_runtime(bootstrap, group, conf), wait_s, bootstrap)
    return 0 if found is None else found[1]


def record_applier(state: Any, value_of: Callable[[Any, Any], Any], counts: dict[str, int]
                   ) -> Callable[[Any, list, list, list, list], list[OutputRecord]]:
    """``apply(operator, offsets, timestamps, keys, payloads)`` for ``replay``: each record
    through ``value_of`` (None: not the state's), checked as the state's per-event calls
    check it, then the state's column pipeline (``process_values``, as ``update_many``
    runs it; a kind without one: ``apply_event`` per event, as its per-event call)."""
    import numpy as np

    coerce = state.backfill_value

    def apply(op: Any, offsets: list, timestamps: list, keys: list, payloads: list) -> list[OutputRecord]:
        counts["records"] += len(offsets)
        o: list[int] = []
        t: list[int] = []
        k: list[bytes] = []
        v: list[Any] = []
        raw: list[Any] = []
        codec = op.codec
        for off, ts, key, payload in zip(offsets, timestamps, keys, payloads):
            try:
                value = value_of(key, payload)
            except Exception as exc:  # noqa: BLE001 - the user's code: say which record
                raise ConfigError(f"value_of raised on {state.source_topic}[{op.partition}] offset {off}: "
                                  f"{type(exc).__name__}: {exc}") from None
            if value is None:
                continue
            where = f"{state.source_topic}[{op.partition}] offset {off}"
            if not isinstance(key, bytes):
                raise ConfigError(f"value_of gave {value!r} for a record without a key ({where}): return None "
                                  "for the records the app leaves the state alone on")
            try:
                value = coerce(value)
                checked = codec.check_event(key, value, ts)  # what the per-event call applies
            except (TypeError, ValueError, BadRecord) as exc:
                raise ConfigError(f"value_of gave {value!r} for {where}: {exc}") from None
            o.append(off)
            t.append(ts)
            k.append(key)
            v.append(checked)
            raw.append(value)
        counts["applied"] += len(o)
        if not o:
            return []
        if state.backfill_columns:
            out = op.process_values(o, t, np.asarray(t, dtype=np.int64), k, np.asarray(v, dtype=np.float64))
            if out is not None:
                return list(out)
        out_all: list[OutputRecord] = []
        for j in range(len(o)):
            out_all.extend(op.apply_event(k[j], raw[j], offset=o[j], timestamp_ms=t[j]) or ())
        return out_all

    return apply


def backfill(state: Any, value_of: Callable[[Any, Any], Any], *, group: str | None = None, sink: Any = None,
             output: Any = None, while_live: bool = False, uncommitted: str = "error", progress: bool = False,
             batch_size: int = 2000, wait_s: float = WAIT_S, ingest: str | None = None) -> BackfillReport:
    """Fill ``state`` from the retained history of its source topic up to ``group``'s
    committed offsets and write its snapshots there (see the module docstring).

    ``output``: where the backfill's outputs go: None (nowhere, the default), ``"live"`` (the
    state's own topics: its alerts and raised set as the live state would have published
    them) or a mapping of output role to topic (``{"alerts": "backfill-alerts"}``; the alert
    state follows to ``<topic>-state``; the roles not given are not published; the topics
    must exist); or ``sink``, a sink of ``grudge_stream.replay.runner.make_sink``.
    ``uncommitted``: for a partition the group never committed that holds records, where
    the app will start (its ``auto.offset.reset``): ``earliest`` (nothing to fill) or
    ``latest`` (the whole partition); ``error`` (default) refuses. ``while_live``: run
    although the group has members (a first pass; ``BackfillReport.complete`` is false).
    ``ingest``: how records are read (auto, native, python; docs/runtime.md "Ingest paths");
    default: the state's ``ingest`` setting, as a worker reads it."""
    from confluent_kafka import Consumer, TopicPartition

    from grudge_stream.checkpoint import CheckpointStore, watermarks
    from grudge_stream.kafkaconf import check_connection, client_config
    from grudge_stream.replay.ranges import Position, topic_partitions
    from grudge_stream.replay.runner import replay
    from grudge_stream.runtime.embedded import ensure_topics

    if not callable(value_of):
        raise ConfigError(f"value_of must be callable (key, value) -> the state's value or None, "
                          f"not {type(value_of).__name__}")
    if uncommitted not in ("error", "earliest", "latest"):
        raise ConfigError(f"uncommitted must be error, earliest or latest, not {uncommitted!r}")
    _check_output(state, output)
    if output is not None and sink is not None:
        raise ConfigError("give output or sink, not both")
    if state.core is not None:
        raise ConfigError(f"state {state.name!r} is started in this process: a backfill fills a state its app "
                          "does not run (stop the app; backfill before it starts the state)")
    group = group_of(state, group)
    settings = state.settings
    if ingest is None:
        from grudge_stream.sections import Group

        ingest = Group.of(settings).ingest
    bootstrap, props = state.connection()
    conf = {**client_config(settings, bootstrap), **props}
    check_connection(settings, wait_s=wait_s, bootstrap_servers=bootstrap, properties=conf, warn=False)
    topic, topology = state.source_topic, state.topology

    members = live_members(bootstrap, conf, group, wait_s)
    if members and not while_live:
        raise ConfigError(f"group {group!r} has {members} active member(s): stop every instance of the app "
                          "first (while it runs its committed offsets move past the backfill's end), or run "
                          "a first pass with --while-live and a second one with the app stopped")
    probe = Consumer({"log_level": 3, **conf, "group.id": f"grudge-backfill-{state.name}",
                      "enable.auto.commit": False})
    try:
        partitions = topic_partitions(probe, topic)
        committed = committed_offsets(bootstrap, conf, group, topic, partitions, wait_s)
        # A partition the group never committed that holds no record has nothing to fill,
        # wherever the app will start there: its snapshot is at the partition's end.
        for p in partitions:
            if committed.get(p) is None:
                lo, hi = watermarks(probe, TopicPartition(topic, p), wait_s)
                if lo == hi:
                    committed[p] = hi
    finally:
        probe.close()
    ends: dict[int, int] = {}
    missing = sorted(p for p in partitions if committed.get(p) is None)
    if missing and uncommitted == "error":
        raise ConfigError(f"group {group!r} has no committed offset of {topic!r} partitions {missing}, which "
                          "hold records: say where the app will start there (--uncommitted earliest|latest, "
                          "its auto.offset.reset; Faust's default: earliest)")
    for p in partitions:
        c = committed.get(p)
        ends[p] = c if c is not None else (0 if uncommitted == "earliest" else 2 ** 62)

    ensure_topics(topology, settings, bootstrap, props)
    if output is not None:
        sink = sink_for(state, output)
    store = CheckpointStore(bootstrap, topology.snapshot_topic, client_config=conf)
    try:
        manifests = {p: store.read_manifest(topology.operator_id, p) for p in partitions}
    finally:
        store.close()
    have = sorted(p for p, m in manifests.items() if m is not None)
    if have and len(have) != len(partitions):
        raise ConfigError(f"state {state.name!r} has snapshots of partitions {have} of {topic!r} but not of the "
                          "others: it ran live, or a backfill was cut short; give the state a new name (or "
                          "delete its snapshot topic) and backfill again")
    continued = bool(have)
    if continued:
        past = {p: (m.current.next_offset, ends[p]) for p, m in manifests.items()
                if m is not None and m.current.next_offset is not None and m.current.next_offset > ends[p]}
        if past:
            raise ConfigError(f"state {state.name!r} has snapshots past group {group!r}'s committed offsets "
                              f"(partition: (snapshot, committed)) {past}: it ran live past the group's position, "
                              "or the group was reset; a backfill only moves a state forward")

    if continued:
        probe = Consumer({"log_level": 3, **conf, "group.id": f"grudge-backfill-{state.name}",
                          "enable.auto.commit": False})
        try:
            gone = {}
            for p, m in manifests.items():
                nxt = m.current.next_offset if m is not None else None
                if nxt is not None and nxt < ends[p]:
                    lo, _ = watermarks(probe, TopicPartition(topic, p), wait_s)
                    if nxt < lo:
                        gone[p] = (nxt, lo)
        finally:
            probe.close()
        if gone:
            raise ConfigError(f"state {state.name!r}'s snapshots stop before the history {topic!r} retains now "
                              f"(partition: (snapshot, first retained)) {gone}: the records between were deleted "
                              "(retention); backfill a state of a new name from what is retained")
    follower = None
    if topology.overrides_topic:  # overrides=True: judge with the entries, as the live state does
        from grudge_stream.overrides import start_override_follower
        from grudge_stream.signing import SigningKeys

        followed = start_override_follower(topology, bootstrap, conf, signing=SigningKeys.from_settings(settings))
        follower = followed[1] if followed else None
    counts = {"records": 0, "applied": 0}
    try:
        # auto.offset.reset=error: records deleted by retention under the reader (a position
        # below the log's new start) stop the backfill in one line; the default would jump
        # over them, leaving a hole in the state, or wait for ever for offsets that are gone.
        rep = replay(topology, bootstrap, start=Position("earliest"), end=Position("now"), ends=ends, sink=sink,
                     write_snapshots=True, from_snapshot=continued, batch_size=batch_size, progress=progress,
                     client_config=conf, consumer_config={"auto.offset.reset": "error"},
                     apply=record_applier(state, value_of, counts), ingest=ingest)
    finally:
        if follower is not None:
            follower.stop()
    report = BackfillReport(group=group, records=counts["records"], applied=counts["applied"],
                            seconds=rep.seconds, start=rep.start, end=rep.end, continued=continued,
                            outputs=rep.outputs, snapshots=rep.snapshots, ingest=rep.ingest)
    # Members now or then: the positions may have moved while it ran.
    report.live_members = max(members, live_members(bootstrap, conf, group, wait_s))
    if not report.complete:
        log.warning("state %s: backfilled up to group %s's offsets of a moment while the app ran; run the "
                    "backfill again with the app stopped before the app starts the state", state.name, group)
    return report


def _check_output(state: Any, output: Any) -> None:
    """``output``'s form, checked before anything connects."""
    if output is None or output == "live":
        return
    if isinstance(output, dict) and output and all(isinstance(t, str) and t for t in output.values()):
        unknown = set(output) - set(state.topology.outputs)
        if unknown:
            raise ConfigError(f"output: roles {sorted(unknown)} are not the state's "
                              f"({sorted(state.topology.outputs)})")
        return
    raise ConfigError(f"output must be None, 'live' or a mapping of role to topic, not {output!r}")


def sink_for(state: Any, output: Any) -> Any:
    """The sink of ``SketchState.backfill``'s ``output``: None (nothing published), ``"live"``
    (the state's own topics) or a mapping of output role to topic (those roles only)."""
    from grudge_stream.outputs import OutputPublisher

    _check_output(state, output)
    if output is None:
        return None
    bootstrap, props = state.connection()
    from grudge_stream.kafkaconf import client_config

    conf = {**client_config(state.settings, bootstrap), **props}
    if output == "live":
        return OutputPublisher(bootstrap, dict(state.topology.outputs), client_config=conf)
    topics = dict(output)
    if "alerts" in topics and "alert_state" in state.topology.outputs and "alert_state" not in topics:
        topics["alert_state"] = topics["alerts"] + "-state"  # the raised set goes where its alerts go
    from confluent_kafka.admin import AdminClient

    known = set(AdminClient({"log_level": 3, **conf}).list_topics(timeout=WAIT_S).topics)
    missing = sorted(t for t in topics.values() if t not in known)
    if missing:
        raise ConfigError(f"output: missing topics {missing}; create them first (grudge-stream create-topic)")
    return OutputPublisher(bootstrap, topics, client_config=conf)  # the roles given only

__all__ = ["backfill", "BackfillReport", "sink_for", "record_applier"]
