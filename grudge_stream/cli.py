"""The ``grudge-stream`` command: run a topology's worker, create its topics, run the demo."""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import json
import logging
import os
import re
import signal
import sys
import threading
import time

from confluent_kafka import KafkaException

from grudge_stream.exceptions import ConfigError
from grudge_stream.settings import setting
from grudge_stream.topology import Settings, load_topology


def _version() -> str:
    from grudge_stream import __version__

    return __version__


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, str] = {}
    for item in args.set or []:
        if "=" not in item:
            raise SystemExit(f"--set takes name=value, got {item!r}")
        k, v = item.split("=", 1)
        overrides[k.strip()] = v
    if getattr(args, "bootstrap_servers", None):
        overrides["bootstrap_servers"] = args.bootstrap_servers
    if getattr(args, "web_port", None):
        overrides["web_port"] = str(args.web_port)
    settings = Settings(overrides)
    from grudge_stream.kafkaconf import use_properties_file_bootstrap

    use_properties_file_bootstrap(settings)  # kafka_properties_file's bootstrap.servers, if nothing else
    return settings


# How long a client command (alerts, override, create-topic, replay) waits for a cluster that
# does not answer before it says so and exits 2; a worker waits broker_wait_s.
CLIENT_WAIT_S = 10.0


def _connect(settings: Settings, wait_s: float = CLIENT_WAIT_S) -> dict:
    """Check the Kafka connection once (a wrong password or TLS setup, or no answer within
    ``wait_s``, is one line, exit 2, instead of clients retrying for ever) and return the
    clients' configuration."""
    from grudge_stream.kafkaconf import check_connection, client_config

    conf = client_config(settings)
    check_connection(settings, wait_s=wait_s, warn=False)
    return conf


def _existing_topics(conf: dict, names: list[str]) -> dict[str, int]:
    """Partition count of each of ``names`` that exists on the cluster."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"log_level": 3, **conf}).list_topics(timeout=CLIENT_WAIT_S)
    return {n: len(md.topics[n].partitions) for n in names if n in md.topics and md.topics[n].error is None}


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


def _common(p: argparse.ArgumentParser, embedded: bool = False) -> None:
    if embedded:
        p.add_argument("topology", nargs="?", default=None,
                       help="shipped topology name (grudge_stream.topologies.<name>), dotted module, or .py path; "
                            "or, for sketch state in your own app, --state / --alerts-topic")
        p.add_argument("--state", default=None, metavar="NAME",
                       help="an embedded state (grudge_stream.state, docs/embedding.md) by its name: its topics "
                            "<NAME>-alerts-state and <NAME>-alerts-overrides")
        p.add_argument("--alerts-topic", default=None, metavar="TOPIC",
                       help="an embedded state whose alerts_topic was given: TOPIC-state and TOPIC-overrides")
    else:
        p.add_argument("topology", help="shipped topology name (grudge_stream.topologies.<name>), dotted module, "
                                        "or .py path")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="topology setting (overrides the GRUDGE_<NAME> environment variable)")
    p.add_argument("--bootstrap-servers", default=None,
                   help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS or 127.0.0.1:9092)")


def _freeze_heap() -> None:
    """Take everything loaded at start-up (modules, the topology) out of the cyclic collector's
    reach. The batch runtime's consume loop allocates thousands of short-lived records per batch,
    which triggers collections; without this, each full collection walks the whole start-up heap
    again (several per cent of a worker's CPU). Not for the Faust runtime: its consumer keeps
    many fetched records alive, and with the start-up heap frozen, CPython's rule that full
    collections wait until a quarter of the old objects are new stops holding them back
    (measured: a third of the worker's time in the collector)."""
    gc.collect()
    gc.freeze()


# Collector thresholds for both runtimes' workers. Records are allocated by the thousand
# per batch, and with the default (700, 10, 10) a young collection runs every 700 of them,
# rescanning the ones still alive (aiokafka keeps many fetched records alive): measured, a
# fifth to a third of a Faust worker's samples in the collector, and about 15% less CPU per
# event with these. Cyclic garbage is rare on these paths, so collecting it later costs little.
WORKER_GC_THRESHOLDS = (50_000, 20, 100)


def _tune_gc() -> None:
    gc.set_threshold(*WORKER_GC_THRESHOLDS)


def cmd_worker(args: argparse.Namespace) -> int:
    # ``kill -USR1 <pid>``: every thread's stack on stderr, for a worker that seems stuck.
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no stderr file (embedded, tests)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    settings = _settings(args)
    topology = load_topology(args.topology, settings)
    runtime = args.runtime or setting(settings, "runtime")
    # The start-up rules (refusals, topics, the overrides follower) run inside the runtime's own
    # entry point (grudge_stream.runtime.start), so a worker started as a library keeps them.
    start = dict(create_topics=not args.no_create_topics, partitions=args.partitions,
                 create_source=args.create_source)
    if runtime == "batch":
        from grudge_stream.runtime.batch import run_batch_worker

        logging.getLogger().setLevel(args.loglevel.upper())
        _freeze_heap()
        _tune_gc()
        return run_batch_worker(topology, settings, **start)
    import faust

    from grudge_stream.exceptions import exit_code
    from grudge_stream.runtime.faust.worker import build_app

    from grudge_stream import logsetup

    class Worker(faust.Worker):
        def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*a, **kw)
            if not self.stdout.isatty():  # its cursor codes would land in a log file
                self.spinner = None

        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            super().on_setup_root_logger(logger, level)
            logsetup.install(logger, json_lines=args.log_format == "json")

    from grudge_stream.repartition import start_stage

    app = build_app(topology, settings, **start)
    worker = Worker(app, loglevel=args.loglevel, quiet=True, override_logging=True)
    _tune_gc()
    runtime = app.grudge_runtime  # type: ignore[attr-defined]
    # A topology keyed by a field: its repartition stage (a thread with its own clients).
    stage = start_stage(topology, settings, metrics=runtime.metrics, liveness=runtime.liveness,
                        client_config=runtime.client_config)
    try:
        worker.execute_from_commandline()
    except SystemExit:
        if runtime.fatal is None:
            raise
    finally:
        if stage is not None:
            stage.stop()
    return exit_code(runtime.fatal) if runtime.fatal is not None else 0


def cmd_topics(args: argparse.Namespace) -> int:
    from grudge_stream.topics import ensure_topology_topics, source_topic_config, topic_replication, wait_for_cluster

    settings = _settings(args)
    topology = load_topology(args.topology, settings)
    conf = _connect(settings)
    from grudge_stream.deployments import check_own_topics

    check_own_topics(topology, settings.bootstrap_servers, conf, settings)  # before creating anything
    names = _topology_topic_names(topology)
    before = topic_replication(settings.bootstrap_servers, names, conf)
    n = wait_for_cluster("creating the topology's topics", lambda: ensure_topology_topics(
        topology, settings.bootstrap_servers, partitions=args.partitions, create_source=True,
        timestamp_bounds=True, client_config=conf, replication_factor=setting(settings, "replication_factor")),
        setting(settings, "broker_wait_s"), settings.bootstrap_servers)
    if args.partitions is not None and n != args.partitions:
        raise ConfigError(
            f"source topic {topology.source_topic!r} exists with {n} partitions, not {args.partitions}: "
            "grudge-stream does not change a topic's partition count (keys would move between sketches; "
            "docs/checkpoints.md)")
    rp = topology.repartition
    source = (topology.source_topic if rp is None
              else f"{rp.source_topic} (re-keyed by {rp.key_field!r} into {rp.topic})")
    print(f"{source}: {n} partitions; outputs {sorted(topology.outputs.values())}; "
          f"snapshots {topology.snapshot_topic}")
    for name, (parts, replicas) in sorted(topic_replication(settings.bootstrap_servers, names, conf,
                                                            expect=set(names) - set(before)).items()):
        print(f"  {name}: {parts} partitions, replication {replicas} ({'exists' if name in before else 'created'})")
    created_source = rp.source_topic if rp is not None else topology.source_topic
    if created_source not in before:
        bounds = source_topic_config(topology)
        if bounds:
            print(_time_bounds_line(created_source, bounds))
    return 0


def _time_bounds_line(topic: str, bounds: dict[str, str]) -> str:
    """What the source topic's broker-side timestamp bounds mean to its producers."""
    def span(ms: str) -> str:
        s = int(ms) / 1000
        return f"{s / 3600:.3g} h" if s >= 3600 else f"{s / 60:.3g} min" if s >= 60 else f"{s:.3g} s"

    window = []
    if "message.timestamp.before.max.ms" in bounds:
        window.append(f"up to {span(bounds['message.timestamp.before.max.ms'])} old")
    if "message.timestamp.after.max.ms" in bounds:
        window.append(f"up to {span(bounds['message.timestamp.after.max.ms'])} ahead")
    return (f"  {topic} takes event times {' and '.join(window)} of the broker's clock "
            "(message.timestamp.before/after.max.ms, from max_late_ms / max_future_ms); a producer "
            "sending a record outside them gets INVALID_TIMESTAMP ('Broker: Invalid timestamp'), and so "
            "do the other records of its batch. "
            "Older history goes to a topic without these bounds (docs/runtime.md, 'Event time under attack')")


def _topology_topic_names(topology) -> list[str]:
    rp = topology.repartition
    names = {topology.source_topic, topology.snapshot_topic, *topology.outputs.values()}
    if rp is not None:
        names |= {rp.source_topic, rp.topic}
    if topology.overrides_topic:
        names.add(topology.overrides_topic)
    return sorted(names)



def cmd_describe(args: argparse.Namespace) -> int:
    from grudge_stream.settings import scoped_env_name
    from grudge_stream.topology import bind_settings, load_topology_module, topology_short_name

    settings = _settings(args)
    module = load_topology_module(args.topology)
    if getattr(module, "SETTINGS", None) is None:
        raise ConfigError(f"topology {args.topology!r} declares no SETTINGS")
    rows = bind_settings(module, args.topology, settings).describe()
    doc = (module.__doc__ or "").strip().splitlines()
    if args.json:
        print(json.dumps({"topology": args.topology, "summary": doc[0] if doc else "", "settings": rows},
                         default=str, indent=2))
        return 0
    if doc:
        print(doc[0] + "\n")
    scoped = scoped_env_name(topology_short_name(args.topology), "NAME")
    print(f"settings of {args.topology} (flag --set NAME=VALUE, env {scoped} "
          "or GRUDGE_NAME); 'state' ones make a snapshot foreign when changed:\n")
    for r in rows:
        unit = f" {r['unit']}" if r["unit"] else ""
        current = "" if r["source"] == "default" else f"  = {r['value']!r} ({r['source']})"
        print(f"  {r['name']:<28} {r['kind']:<12} {r['shapes']:<6} default {r['default']!r}{unit}{current}")
        print(f"      {r['help']}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from grudge_stream.exceptions import GrudgeError
    from grudge_stream.replay.ranges import parse_position
    from grudge_stream.replay.runner import make_sink, replay

    settings = _settings(args)
    try:
        topology = load_topology(args.topology, settings)
        overrides = _replay_targets(topology, args)
        start, end = parse_position(args.from_), parse_position(args.to)
        # Everything that needs no broker is checked before connecting: a mistake is one line at once.
        if args.output != "topology":
            sink = make_sink(topology, settings.bootstrap_servers, args.output, overrides)
        conf = _connect(settings)
        from grudge_stream.overrides import start_override_follower
        from grudge_stream.signing import SigningKeys

        start_override_follower(topology, settings.bootstrap_servers, conf,  # as the live workers judge
                                signing=SigningKeys.from_settings(settings))
        if args.output == "topology":
            _check_targets_exist({**topology.outputs, **overrides}, conf)
            sink = make_sink(topology, settings.bootstrap_servers, args.output, overrides, client_config=conf)
        report = replay(topology, settings.bootstrap_servers, start=start,
                        end=end, sink=sink, write_snapshots=args.write_snapshots,
                        from_snapshot=args.from_snapshot, progress=not args.quiet, client_config=conf)
    except GrudgeError as exc:
        print(f"grudge-stream replay: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"records": report.records, "seconds": round(report.seconds, 3),
                      "rate": round(report.rate), "outputs": report.outputs,
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

    settings = _settings(args)
    topics = _judged_topics(args, settings)
    if not topics["alert_state"]:
        raise ConfigError(f"{topics['what']} publishes no alerts")
    conf = _connect(settings, wait_s=min(args.timeout, CLIENT_WAIT_S))
    if not _existing_topics(conf, [topics["alert_state"]]):
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

    settings = _settings(args)
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
    conf = _connect(settings)
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


def cmd_create_topic(args: argparse.Namespace) -> int:
    """Create a plain topic (the source of a state in your own app) unless it exists with as
    many partitions; a topic of another partition count is refused (one line, exit 2)."""
    from grudge_stream.topics import create_topics

    if args.partitions < 1:
        raise ConfigError(f"--partitions must be >= 1, not {args.partitions}")
    settings = _settings(args)
    conf = _connect(settings)
    have = _existing_topics(conf, [args.name]).get(args.name)
    if have is not None and have != args.partitions:
        raise ConfigError(f"topic {args.name!r} exists with {have} partitions, not {args.partitions}: keys would "
                          "land on other partitions than a state split by it expects; use another name")
    if have is None:
        create_topics(settings.bootstrap_servers, {args.name: (args.partitions, {})}, client_config=conf,
                      replication_factor=args.replication_factor)
    print(f"{args.name}: {args.partitions} partitions ({'created' if have is None else 'exists'}) "
          f"on {settings.bootstrap_servers}")
    return 0


def _score_line(ans: dict) -> str:
    key = ans.get("key") if ans.get("key") is not None else "b64:" + str(ans.get("key_b64"))
    if ans.get("error"):
        return f"{key}  error={ans['error']}  partition={ans.get('partition')}  {ans.get('message', '')}"
    parts = [key, f"score={ans['score']:.6g}" if isinstance(ans.get("score"), float) else f"score={ans.get('score')}"]
    for name in ("raised", "seen", "tokens_available", "partition", "watermark_ms", "next_offset"):
        if name in ans:
            parts.append(f"{name}={ans[name]}")
    if isinstance(ans.get("watermark_ms"), int):
        # Scores live in event time: a quiet partition's watermark stands still, and so do its bans.
        parts.append(f"watermark_age={time.time() - ans['watermark_ms'] / 1000:.0f}s")
    parts.append(f"served_by={ans.get('served_by')}")
    return "  ".join(parts)


def cmd_score(args: argparse.Namespace) -> int:
    """Ask a worker for keys' current scores (``/v1/scores``; any worker forwards to the owner)."""
    import urllib.error
    import urllib.request

    url = args.url
    settings = _settings(args)
    token_file = args.token_file or setting(settings, "query_token_file")
    headers = {"Content-Type": "application/json"}
    if token_file:
        from grudge_stream.webauth import TokenFile

        headers["Authorization"] = "Bearer " + TokenFile(token_file).own_token().decode()
    if not url:
        if (settings.get("seed", None) is None and settings.get("seed_file", None) is None
                and not settings.get("insecure_public_seed", False)):
            settings.overrides["seed"] = "0" * 32  # only the web settings are read: no sketch is built
        load_topology(args.topology, settings)
        host = setting(settings, "web_host")
        scheme = "https" if setting(settings, "web_tls_cert_file") else "http"
        url = f"{scheme}://{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{setting(settings, 'web_port')}"
    body = json.dumps({"keys": args.keys}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/v1/scores", data=body, method="POST", headers=headers)
    try:
        try:
            from grudge_stream.webauth import client_tls

            context = client_tls(settings) if url.startswith("https:") else None
            with urllib.request.urlopen(req, timeout=args.timeout, context=context) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            doc = json.loads(exc.read() or b"{}")
    except (OSError, ValueError) as exc:  # nothing listens there: the address is wrong, as for a broker
        print(f"grudge-stream score: no answer from {url}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    results = doc.get("results")
    if not isinstance(results, list):
        print(f"grudge-stream score: {doc.get('error')}: {doc.get('message')}", file=sys.stderr)
        return 1
    for ans in results:
        print(json.dumps(ans, separators=(",", ":")) if args.json else _score_line(ans), flush=True)
    return 0 if all(not a.get("error") for a in results) else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from grudge_stream.demo import run_demo

    return run_demo(seconds=args.seconds, partitions=args.partitions, rate=args.rate, keep=args.keep)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="grudge-stream", description=__doc__)
    ap.add_argument("--version", action="version", version=f"grudge-stream {_version()}")
    sub = ap.add_subparsers(dest="command", required=True)

    w = sub.add_parser("worker", help="run a topology as a Faust worker")
    _common(w)
    w.add_argument("--web-port", type=int, default=None,
                   help="port of /ready, /live and /metrics (default 6066)")
    w.add_argument("--loglevel", "-l", default=os.environ.get("GRUDGE_LOGLEVEL", "info"))
    w.add_argument("--log-format", choices=["text", "json"], default=os.environ.get("GRUDGE_LOG_FORMAT", "text"),
                   help="text, or one JSON object per line (env GRUDGE_LOG_FORMAT); repeated lines are "
                        "collapsed either way")
    w.add_argument("--partitions", type=int, default=None, help="partitions when creating the source topic")
    w.add_argument("--create-source", action="store_true", help="create the source topic if missing")
    w.add_argument("--no-create-topics", action="store_true", help="do not create output/snapshot topics")
    w.add_argument("--runtime", choices=["faust", "batch"], default=None,
                   help="faust (a Faust worker, default) or batch (the confluent-kafka batch runtime)")
    w.set_defaults(func=cmd_worker)

    t = sub.add_parser("topics", help="create a topology's topics")
    _common(t)
    t.add_argument("--partitions", type=int, default=None,
                   help="partitions of a source topic it creates (default 8); an existing topic must match")

    ds = sub.add_parser("describe", help="list a topology's settings: type, default, current value, meaning")
    _common(ds)
    ds.add_argument("--json", action="store_true", help="as JSON")
    ds.set_defaults(func=cmd_describe)
    t.set_defaults(func=cmd_topics)

    r = sub.add_parser("replay", help="run a topology over a range of its source topic (backfill)")
    _common(r)
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

    al = sub.add_parser("alerts", help="a topology's or an embedded state's currently raised keys (--follow: "
                        "and every change)")
    _common(al, embedded=True)
    al.add_argument("--follow", "-f", action="store_true", help="keep printing raises and clears")
    al.add_argument("--json", action="store_true", help="one JSON object per line")
    al.add_argument("--timeout", type=float, default=60.0, help="longest wait for the bootstrap (s)")
    al.set_defaults(func=cmd_alerts)

    ov = sub.add_parser("override", help="allow or deny a key whatever its score, or clear that (a topology "
                        "or an embedded state)")
    _common(ov, embedded=True)
    ov.add_argument("action", choices=["allow", "deny", "clear"])
    ov.add_argument("key", help="the key (UTF-8 text)")
    ov.add_argument("--for", dest="for_", default=None, metavar="DURATION",
                    help="expire after this long: 90s, 15m, 1h, 7d (default: until cleared)")
    ov.add_argument("--reason", default=None, help="why (kept with the entry)")
    ov.add_argument("--by", default=None, help="who (default $USER; with signing_keys_file the signer's key name)")
    ov.set_defaults(func=cmd_override)

    sc = sub.add_parser("score", help="keys' current scores from a running worker (any worker: it "
                        "forwards to the owner); exit 1 if a key could not be answered")
    _common(sc)
    sc.add_argument("keys", nargs="+", metavar="KEY", help="the keys (UTF-8 text)")
    sc.add_argument("--url", default=None, help="a worker's URL (default http://<web_host>:<web_port> "
                    "of the topology's settings)")
    sc.add_argument("--token-file", default=None, help="a file holding the bearer token to present (its "
                    "first; default the query_token_file setting)")
    sc.add_argument("--json", action="store_true", help="one JSON answer per line")
    sc.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer")
    sc.set_defaults(func=cmd_score)

    ct = sub.add_parser("create-topic", help="create a plain topic (the source topic of a state in your own app) "
                        "if missing; an existing one must have as many partitions")
    ct.add_argument("name")
    ct.add_argument("--partitions", type=int, required=True)
    ct.add_argument("--replication-factor", type=int, default=-1, help="default: the broker's")
    ct.add_argument("--set", action="append", metavar="NAME=VALUE", help="a client setting (security, kafka.*)")
    ct.add_argument("--bootstrap-servers", default=None,
                    help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS or 127.0.0.1:9092)")
    ct.set_defaults(func=cmd_create_topic)

    d = sub.add_parser("demo", help="local broker + abuse-score worker + traffic; prints alerts")
    d.add_argument("--seconds", type=float, default=45.0)
    d.add_argument("--partitions", type=int, default=4)
    d.add_argument("--rate", type=float, default=2000.0, help="events per second of traffic")
    d.add_argument("--keep", action="store_true",
                   help="keep the broker (the one of make broker-start), the topics under the topology's own "
                        "names and the hash key, for grudge-stream alerts / replay / worker / score next")
    d.set_defaults(func=cmd_demo)

    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from grudge_stream import logsetup

    logsetup.install(json_lines=getattr(args, "log_format", "text") == "json")
    from grudge_stream.exceptions import EXIT_FAULT, EXIT_USER_ERROR, GrudgeError, WorkerFault

    try:
        return int(args.func(args) or 0)
    except GrudgeError as exc:  # one line, exit 2 for a user error, 3 for a fault (tracebacks are for bugs)
        print(f"grudge-stream {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAULT if isinstance(exc, WorkerFault) else EXIT_USER_ERROR
    except KafkaException as exc:  # what the cluster answered, not a bug here: one line too
        err = exc.args[0] if exc.args else exc
        text = " ".join(str(err.str() if hasattr(err, "str") else err).split())
        print(f"grudge-stream {args.command}: Kafka: {text}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `grudge-stream describe ... | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
