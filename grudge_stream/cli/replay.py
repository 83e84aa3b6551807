"""``grudge-stream replay`` (a topology over a range of its source topic) and
``grudge-stream backfill`` (an embedded state filled from its source topic's history), and
where their outputs go (``--output``, ``--output-topic``, ``--topic-prefix``).
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from grudge_stream.cli.common import CLIENT_WAIT_S, add_topology_arguments, connect, settings_from
from grudge_stream.exceptions import ConfigError
from grudge_stream.topology import load_topology


def cmd_replay(args: argparse.Namespace) -> int:
    from grudge_stream.exceptions import GrudgeError
    from grudge_stream.replay.ranges import parse_position
    from grudge_stream.replay.runner import make_sink, replay

    settings = settings_from(args)
    try:
        topology = load_topology(args.topology, settings)
        overrides = _replay_targets(topology, args)
        start, end = parse_position(args.from_), parse_position(args.to)
        # Everything that needs no broker is checked before connecting: a mistake is one line at once.
        if args.output != "topology":
            sink = make_sink(topology, settings.bootstrap_servers, args.output, overrides)
        conf = connect(settings)
        from grudge_stream.overrides import start_override_follower
        from grudge_stream.signing import SigningKeys

        start_override_follower(topology, settings.bootstrap_servers, conf,  # as the live workers judge
                                signing=SigningKeys.from_settings(settings))
        if args.output == "topology":
            _check_targets_exist({**topology.outputs, **overrides}, conf)
            sink = make_sink(topology, settings.bootstrap_servers, args.output, overrides, client_config=conf)
        from grudge_stream.sections import Group

        report = replay(topology, settings.bootstrap_servers, start=start,
                        end=end, sink=sink, write_snapshots=args.write_snapshots,
                        from_snapshot=args.from_snapshot, progress=not args.quiet, client_config=conf,
                        ingest=Group.of(settings).ingest)  # the worker's setting, read as the worker reads it
    except GrudgeError as exc:
        print(f"grudge-stream replay: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"records": report.records, "seconds": round(report.seconds, 3),
                      "rate": round(report.rate), "ingest": report.ingest, "outputs": report.outputs,
                      "snapshots": report.snapshots, "start": report.start, "end": report.end}),
          file=sys.stderr if args.output in ("-", "stdout") else sys.stdout)
    undelivered = getattr(sink, "dead_lettered", None)
    if undelivered:
        print(f"grudge-stream replay: outputs not delivered where asked (dead-lettered, by role): {undelivered}",
              file=sys.stderr)
        return 1
    return 0


def _replay_targets(topology, args: argparse.Namespace, output_flag: str = "--output topology") -> dict[str, str]:
    """The topics ``--output topology`` writes to, role by role, where they are not the live
    ones: ``--topic-prefix`` moves every role, ``--output-topic ROLE=TOPIC`` one role (the
    alerts take their alert state along). Writing to a live topic needs ``--to-live``."""
    redirects = args.output_topic or []
    if (redirects or args.topic_prefix or args.to_live) and args.output != "topology":
        raise ConfigError(f"--output-topic, --topic-prefix and --to-live go with {output_flag}")
    if args.topic_prefix is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", args.topic_prefix):
        raise ConfigError(f"--topic-prefix {args.topic_prefix!r}: letters, digits, '.', '_' and '-' only")
    live = dict(topology.outputs)
    targets = {role: (args.topic_prefix or "") + topic for role, topic in live.items()}
    given: dict[str, str] = {}
    for item in redirects:
        role, _, topic = item.partition("=")
        if not topic or role not in live or not re.fullmatch(r"[A-Za-z0-9._-]+", topic):
            raise ConfigError(f"--output-topic takes ROLE=TOPIC with ROLE in {sorted(live)} and a valid "
                              f"topic name, not {item!r}")
        given[role] = topic
    targets.update(given)
    if "alerts" in given and "alert_state" in live and "alert_state" not in given:
        targets["alert_state"] = given["alerts"] + "-state"  # the state goes where its alerts go
    if args.output == "topology" and not args.to_live:
        still = {role: t for role, t in targets.items() if t in set(live.values())}
        if still:
            roles = ", ".join(f"{r} -> {t}" for r, t in sorted(still.items()))
            raise ConfigError(f"{output_flag} would write to the live deployment's topics ({roles}): "
                              "redirect them (--topic-prefix whatif-, or --output-topic ROLE=TOPIC) or say "
                              "--to-live")
    return {role: t for role, t in targets.items() if t != live[role]}


def _load_state(app: str, name: str, value_of: str):
    """The state named ``name`` of the app module ``app`` (a .py path or a dotted module,
    imported as its worker would import it; nothing is started) and the function
    ``value_of`` (a name in that module, or ``module:function``)."""
    import importlib
    import importlib.util
    from pathlib import Path

    from grudge_stream.state import SketchState

    def load(where: str):
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise ConfigError(f"{where}: no such file")
            sys.path.insert(0, str(path.resolve().parent))
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
            return module
        if "" not in sys.path:
            sys.path.insert(0, "")
        return importlib.import_module(where)

    try:
        module = load(app)
    except ConfigError:
        raise
    except BaseException as exc:  # noqa: BLE001 - the user's module: one line, not a traceback
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ConfigError(f"cannot import {app}: {type(exc).__name__}: {exc}") from None
    states = [v for v in vars(module).values() if isinstance(v, SketchState)]
    states += [v.state for v in vars(module).values() if isinstance(getattr(v, "state", None), SketchState)]
    found = [s for s in states if s.name == name]
    if not found:
        names = sorted({s.name for s in states})
        raise ConfigError(f"{app} holds no state named {name!r} at module level (its states: {names or 'none'})")
    mod_name, _, func = value_of.rpartition(":")
    try:
        source = load(mod_name) if mod_name else module
    except BaseException as exc:  # noqa: BLE001 - as above
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ConfigError(f"--value-of: cannot import {mod_name}: {type(exc).__name__}: {exc}") from None
    fn = getattr(source, func, None)
    if not callable(fn):
        raise ConfigError(f"--value-of: {value_of!r} is not a function of {mod_name or app}")
    return found[0], fn


def cmd_backfill(args: argparse.Namespace) -> int:
    """Fill an embedded state from its source topic's history up to its app's committed offsets."""
    from grudge_stream.backfill import backfill
    from grudge_stream.replay.runner import make_sink

    if args.output not in ("none", "state", "-", "stdout") and not args.output.startswith("jsonl:"):
        raise ConfigError(f"--output must be none, state, stdout or jsonl:PATH, not {args.output!r}")
    state, value_of = _load_state(args.app, args.state, args.value_of)
    if args.bootstrap_servers:
        state._bootstrap = args.bootstrap_servers
    ns = argparse.Namespace(**{**vars(args), "output": "topology" if args.output == "state" else args.output})
    redirects = _replay_targets(state.topology, ns, output_flag="--output state")
    sink = None
    if args.output != "state":
        sink = make_sink(state.topology, "", ns.output, redirects)
    else:
        from grudge_stream.kafkaconf import client_config

        bootstrap, props = state.connection()
        conf = {**client_config(state.settings, bootstrap), **props}
        from grudge_stream.runtime.embedded import ensure_topics

        _connect_to(state, conf)
        ensure_topics(state.topology, state.settings, bootstrap, props)  # the state's own, as the app would
        _check_targets_exist({**state.topology.outputs, **redirects}, conf)
        sink = make_sink(state.topology, bootstrap, "topology", redirects, client_config=conf)
    report = backfill(state, value_of, group=args.group, sink=sink, while_live=args.while_live,
                      uncommitted=args.uncommitted, progress=not args.quiet, wait_s=CLIENT_WAIT_S)
    print(json.dumps(report.as_dict()), file=sys.stderr if args.output in ("-", "stdout") else sys.stdout)
    if not report.complete:
        print(f"grudge-stream backfill: a first pass, up to the offsets group {report.group!r} had committed "
              "while it ran: stop every instance of the app and run it again before the app starts the state",
              file=sys.stderr)
    undelivered = getattr(sink, "dead_lettered", None)
    if undelivered:
        print(f"grudge-stream backfill: outputs not delivered where asked (dead-lettered, by role): {undelivered}",
              file=sys.stderr)
        return 1
    return 0


def _connect_to(state, conf: dict) -> None:
    from grudge_stream.kafkaconf import check_connection

    check_connection(state.settings, wait_s=CLIENT_WAIT_S, bootstrap_servers=conf["bootstrap.servers"],
                     properties=conf, warn=False)


def _check_targets_exist(targets: dict[str, str], client_config: dict) -> None:
    """Every topic a replay writes to exists, before the first record (one line if not)."""
    from confluent_kafka.admin import AdminClient

    try:
        known = set(AdminClient(client_config).list_topics(timeout=30).topics)
    except Exception as exc:  # noqa: BLE001 - the cluster did not answer
        raise ConfigError(f"cannot list the cluster's topics ({exc})") from None
    missing = {role: t for role, t in targets.items() if t not in known}
    if missing:
        names = ", ".join(f"{r} -> {t}" for r, t in sorted(missing.items()))
        raise ConfigError(f"--output topology: missing topics ({names}); create them first "
                          "(kafka-topics.sh, or grudge-stream topics with the same --set)")


def add_replay_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream replay``."""
    r = sub.add_parser("replay", help="run a topology over a range of its source topic (backfill)")
    add_topology_arguments(r)
    r.add_argument("--from", dest="from_", default="earliest",
                   help="start: earliest, now, an offset, @<epoch ms> or an ISO-8601 time (default earliest)")
    r.add_argument("--to", default="now", help="end (exclusive), same forms (default now)")
    r.add_argument("--output", default="none",
                   help="none (default: a dry run that only counts), stdout, jsonl:PATH, or topology "
                        "(the topology's LIVE output topics, or those given with --output-topic)")
    r.add_argument("--output-topic", action="append", metavar="ROLE=TOPIC",
                   help="send one output role to another topic (e.g. alerts=backfill-alerts; the alert "
                        "state follows the alerts to <TOPIC>-state unless given too)")
    r.add_argument("--topic-prefix", default=None, metavar="PREFIX",
                   help="send every output role to PREFIX<its topic> (e.g. whatif-)")
    r.add_argument("--to-live", action="store_true",
                   help="allow --output topology to write to the live deployment's topics")
    r.add_argument("--write-snapshots", action="store_true",
                   help="write snapshots at the end offsets for a live worker to adopt")
    r.add_argument("--from-snapshot", action="store_true",
                   help="start each partition from its newest snapshot instead of a fresh state")
    r.add_argument("--quiet", action="store_true", help="no progress display")
    r.set_defaults(func=cmd_replay)


def add_backfill_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream backfill``."""
    bf = sub.add_parser("backfill", help="fill an embedded state (docs/embedding.md) from its source topic's "
                        "history up to its app's committed offsets, for the app to start it from there")
    bf.add_argument("app", help="the app's module: a .py path or a dotted module (imported, not run)")
    bf.add_argument("--state", required=True, metavar="NAME", help="the state's name")
    bf.add_argument("--value-of", required=True, metavar="FUNCTION",
                    help="what the app's code gives the state for a record: FUNCTION(key, value) -> a delta, "
                         "cost or count, or None; a name in the app's module or module:function")
    bf.add_argument("--group", default=None,
                    help="the consumer group whose committed offsets the state is filled up to (default: the "
                         "Faust app's id)")
    bf.add_argument("--while-live", action="store_true",
                    help="run although the group has active members: a first pass, to be followed by one "
                         "with the app stopped")
    bf.add_argument("--uncommitted", choices=["error", "earliest", "latest"], default="error",
                    help="a partition the group never committed: refuse (default), or where the app will "
                         "start there (its auto.offset.reset)")
    bf.add_argument("--output", default="none",
                    help="none (default: nothing published), stdout, jsonl:PATH, or state (the state's LIVE "
                         "output topics, or those given with --output-topic / --topic-prefix)")
    bf.add_argument("--output-topic", action="append", metavar="ROLE=TOPIC",
                    help="send one output role to another topic (alerts=backfill-alerts: the alert state "
                         "follows to <TOPIC>-state unless given too)")
    bf.add_argument("--topic-prefix", default=None, metavar="PREFIX",
                    help="send every output role to PREFIX<its topic>")
    bf.add_argument("--to-live", action="store_true", help="allow --output state to write to the state's live topics")
    bf.add_argument("--quiet", action="store_true", help="no progress display")
    bf.add_argument("--bootstrap-servers", default=None,
                    help="Kafka bootstrap servers (default: the state's: its app's broker)")
    bf.set_defaults(func=cmd_backfill)
