"""A topology's or an embedded state's judgements: ``grudge-stream alerts`` (the raised keys,
and with ``--follow`` every change) and ``grudge-stream override`` (allow or deny a key
whatever its score, or clear that).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from grudge_stream.cli.common import CLIENT_WAIT_S, add_topology_arguments, connect, existing_topics, settings_from
from grudge_stream.exceptions import ConfigError
from grudge_stream.topology import Settings


def _judged_topics(args: argparse.Namespace, settings: Settings) -> dict[str, str | None]:
    """The alert state and overrides topics (and a name for messages) of what ``alerts`` and
    ``override`` are pointed at: a topology, or an embedded state by its name (``--state``,
    whose alerts topic is ``<name>-alerts``) or by its alerts topic (``--alerts-topic``)."""
    from grudge_stream.client import topology_topics

    given = [w for w in ("topology", "state", "alerts_topic") if getattr(args, w, None)]
    if len(given) != 1:
        raise ConfigError("name one of: a topology, --state NAME (an embedded state) or --alerts-topic TOPIC")
    if args.topology:
        topics = topology_topics(args.topology, settings)
        return {**topics, "what": f"topology {args.topology!r}"}
    alerts = args.alerts_topic or f"{args.state}-alerts"
    what = f"state {args.state!r}" if args.state else f"alerts topic {alerts!r}"
    return {"alert_state": f"{alerts}-state", "overrides": f"{alerts}-overrides", "alerts": alerts,
            "app_id": None, "what": what}


def _alert_partition(state) -> int | None:
    source = (state.alert or {}).get("source")
    p = source.get("partition") if isinstance(source, dict) else None
    return p if isinstance(p, int) and not isinstance(p, bool) else None


def _watermark_age_s(marks: dict, partition: int | None) -> float | None:
    """Seconds since the event time the partition's worker last reported (a quiet partition's
    watermark, and so its bans, stand still); None when no worker reported one."""
    w = marks.get(partition, (None, 0))[0] if partition is not None else None
    return None if w is None else time.time() - w / 1000


def _alert_line(state, change: str | None = None, marks: dict | None = None) -> str:
    key = state.key.decode("utf-8", "backslashreplace")
    a = state.alert or {}
    parts = [change or "raised", key]
    if a.get("score") is not None:
        parts.append(f"score={a['score']:.4g}")
    if a.get("event_time_ms") is not None:
        parts.append("since=" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(a["event_time_ms"] / 1000)))
    partition = _alert_partition(state)
    if partition is not None:
        parts.append(f"partition={partition}")
        if marks is not None:
            age = _watermark_age_s(marks, partition)
            parts.append("watermark_age=" + ("?" if age is None else f"{age:.0f}s"))
    if state.override is not None:
        exp = state.override.expires_ms
        parts.append(f"override={state.override.action}" + (
            "" if exp is None else " until=" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp / 1000))))
    return "  ".join(parts)


def _alert_json(state, change: str | None = None, marks: dict | None = None) -> str:
    from grudge_stream.operators.records import key_fields

    body = {**key_fields(state.key), "raised": state.raised, "reason": state.reason, "alert": state.alert,
            "override": None if state.override is None else state.override._asdict()}
    if marks is not None:
        partition = _alert_partition(state)
        body["watermark_ms"] = marks.get(partition, (None, 0))[0] if partition is not None else None
    if change is not None:
        body["change"] = change
    return json.dumps(body, separators=(",", ":"))


def cmd_alerts(args: argparse.Namespace) -> int:
    """The topology's current raised set (from its alert state and overrides topics)."""
    from grudge_stream.client import AlertView

    settings = settings_from(args)
    topics = _judged_topics(args, settings)
    if not topics["alert_state"]:
        raise ConfigError(f"{topics['what']} publishes no alerts")
    conf = connect(settings, wait_s=min(args.timeout, CLIENT_WAIT_S))
    if not existing_topics(conf, [topics["alert_state"]]):
        raise ConfigError(f"no topic {topics['alert_state']!r} on {settings.bootstrap_servers}: nothing of "
                          f"{topics['what']} has run against this cluster yet (check --bootstrap-servers and the "
                          "name; the topic is made when a worker or the state starts)")
    fmt = _alert_json if args.json else _alert_line
    lock = threading.Lock()

    def show(change):
        def cb(_key, state):
            with lock:
                print(fmt(state, change), flush=True)
        return cb

    if args.topology:
        view = AlertView.for_topology(args.topology, settings, client_config=conf,
                                      on_raise=show("raised"), on_clear=show("cleared"))
    else:
        from grudge_stream.signing import SigningKeys

        view = AlertView(settings.bootstrap_servers, topics["alert_state"], topics["overrides"], client_config=conf,
                         on_raise=show("raised"), on_clear=show("cleared"), signing=SigningKeys.from_settings(settings))
    view.start(timeout_s=args.timeout)
    try:
        # The workers' watermarks (their members records): a ban on a quiet partition is lifted
        # only when a later event moves that partition's event time (docs/runtime.md).
        from grudge_stream.serving import read_watermarks
        from grudge_stream.signing import SigningKeys

        app_id = view.app_id or ""
        marks = read_watermarks(settings.bootstrap_servers, app_id, client_config=conf,
                                signing=SigningKeys.from_settings(settings),
                                timeout_s=min(args.timeout, 10.0)) if app_id else {}
        with lock:
            current = sorted(view.raised().values(), key=lambda s: s.key)
            for state in current:
                print(fmt(state, None, marks if app_id else None), flush=True)
            if not args.json:
                print(f"# {len(current)} raised ({view.state_topic}"
                      + (f", overrides {view.overrides_topic}" if view.overrides_topic else "") + ")",
                      file=sys.stderr, flush=True)
                ages = {p: _watermark_age_s(marks, p) for p in sorted(marks)}
                if app_id:  # an embedded state's app publishes no members records
                    print("# watermark age by partition: " + (" ".join(
                        f"{p}={'?' if a is None else f'{a:.0f}s'}" for p, a in ages.items())
                        or f"unknown (no worker record on {app_id}-members)"), file=sys.stderr, flush=True)
        if args.follow:
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            stop.wait()
    finally:
        view.stop()
    return 0


def cmd_override(args: argparse.Namespace) -> int:
    """Publish an allow / deny entry (or clear one) on the topology's overrides topic."""
    from confluent_kafka import Producer

    from grudge_stream.overrides import OVERRIDES_TOPIC_CONFIG, encode_override, parse_duration
    from grudge_stream.topics import create_topics

    settings = settings_from(args)
    topics = _judged_topics(args, settings)
    topic = topics["overrides"]
    if not topic:
        raise ConfigError(f"{topics['what']} takes no overrides")
    if args.action == "clear" and args.for_ is not None:
        raise ConfigError("--for goes with allow or deny")
    for_ms = parse_duration(args.for_) if args.for_ is not None else None
    from grudge_stream.signing import SigningKeys

    signing = SigningKeys.from_settings(settings)
    if signing is not None:
        if args.by is not None:
            raise ConfigError("--by goes without signing_keys_file: a signed entry's by is its signer's key name")
        value = encode_override(args.action, for_ms=for_ms, reason=args.reason or "", key=args.key.encode("utf-8"),
                                signing=signing)  # a clear too: verifying readers ignore unsigned tombstones
    else:
        value = None if args.action == "clear" else encode_override(
            args.action, for_ms=for_ms, reason=args.reason or "", by=args.by or os.environ.get("USER", ""))
    conf = connect(settings)
    create_topics(settings.bootstrap_servers, {topic: (1, dict(OVERRIDES_TOPIC_CONFIG))}, client_config=conf)
    errors: list = []
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "enable.idempotence": True,
                         "acks": "all", **conf})
    producer.produce(topic, key=args.key.encode("utf-8"), value=value,
                     on_delivery=lambda err, _m: errors.append(err) if err else None)
    if producer.flush(30) or errors:
        print(f"grudge-stream override: not delivered to {topic}: {errors[0] if errors else 'timeout'}",
              file=sys.stderr)
        return 1
    if args.state or args.alerts_topic:
        print("# a state applies it only with overrides=True, at the key's next event; AlertView and "
              "grudge-stream alerts at once", file=sys.stderr)
    until = f" for {args.for_}" if args.for_ else " until cleared"
    what = "cleared" if args.action == "clear" else args.action + until
    if signing is not None:
        what += f", signed by {signing.signer}"
    print(f"{args.key}: {what} ({topic})")
    return 0


def add_alerts_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream alerts``."""
    al = sub.add_parser("alerts", help="a topology's or an embedded state's currently raised keys (--follow: "
                        "and every change)")
    add_topology_arguments(al, embedded=True)
    al.add_argument("--follow", "-f", action="store_true", help="keep printing raises and clears")
    al.add_argument("--json", action="store_true", help="one JSON object per line")
    al.add_argument("--timeout", type=float, default=60.0, help="longest wait for the bootstrap (s)")
    al.set_defaults(func=cmd_alerts)


def add_override_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream override``."""
    ov = sub.add_parser("override", help="allow or deny a key whatever its score, or clear that (a topology "
                        "or an embedded state)")
    add_topology_arguments(ov, embedded=True)
    ov.add_argument("action", choices=["allow", "deny", "clear"])
    ov.add_argument("key", help="the key (UTF-8 text)")
    ov.add_argument("--for", dest="for_", default=None, metavar="DURATION",
                    help="expire after this long: 90s, 15m, 1h, 7d (default: until cleared)")
    ov.add_argument("--reason", default=None, help="why (kept with the entry)")
    ov.add_argument("--by", default=None, help="who (default $USER; with signing_keys_file the signer's key name)")
    ov.set_defaults(func=cmd_override)
