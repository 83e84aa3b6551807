"""The ``grudge-stream`` command: run a topology's worker, create its topics, run the demo."""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys

from grudge_stream.exceptions import ConfigError
from grudge_stream.topology import Settings, load_topology


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grudge-stream")
    except PackageNotFoundError:
        return "unknown (not installed)"


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


def _connect(settings: Settings) -> dict:
    """Check the Kafka connection once (a wrong password or TLS setup is one line, exit 2,
    instead of clients retrying for ever) and return the clients' configuration."""
    from grudge_stream.kafkaconf import check_connection, client_config

    conf = client_config(settings)
    check_connection(settings)
    return conf


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", help="topology name (topologies/<name>.py), dotted module, or .py path")
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
    from grudge_stream.topics import check_group_runtime, ensure_topology_topics

    settings = _settings(args)
    topology = load_topology(args.topology, settings)
    runtime = args.runtime or settings.get("runtime", "faust")
    if runtime == "faust":
        from grudge_stream.kafkaconf import faust_options

        faust_options(settings)  # refuses, before connecting, security aiokafka cannot apply
        from grudge_stream.statedir import app_state_dir

        app_state_dir(settings, topology.app_id)  # Faust's data directory: writable, or one line
    conf = _connect(settings)
    if not args.no_create_topics:
        ensure_topology_topics(topology, settings.bootstrap_servers, partitions=args.partitions,
                               create_source=args.create_source, timestamp_bounds=True, client_config=conf)
    check_group_runtime(settings.bootstrap_servers, topology.app_id, runtime, client_config=conf)
    if runtime == "batch":
        from grudge_stream.replay.live import run_batch_worker

        logging.getLogger().setLevel(args.loglevel.upper())
        _freeze_heap()
        _tune_gc()
        return run_batch_worker(topology, settings)
    if runtime != "faust":
        raise SystemExit(f"--runtime must be faust or batch, not {runtime!r}")
    import faust

    from grudge_stream.faust.app import build_app

    from grudge_stream import logsetup

    class Worker(faust.Worker):
        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            super().on_setup_root_logger(logger, level)
            logsetup.install(logger, json_lines=args.log_format == "json")

    app = build_app(topology, settings)
    worker = Worker(app, loglevel=args.loglevel, quiet=True, override_logging=True)
    _tune_gc()
    worker.execute_from_commandline()
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    from grudge_stream.topics import ensure_topology_topics

    settings = _settings(args)
    topology = load_topology(args.topology, settings)
    n = ensure_topology_topics(topology, settings.bootstrap_servers, partitions=args.partitions,
                               create_source=True, timestamp_bounds=True, client_config=_connect(settings))
    if args.partitions is not None and n != args.partitions:
        raise ConfigError(
            f"source topic {topology.source_topic!r} exists with {n} partitions, not {args.partitions}: "
            "grudge-stream does not change a topic's partition count (keys would move between sketches; "
            "docs/checkpoints.md)")
    print(f"{topology.source_topic}: {n} partitions; outputs {sorted(topology.outputs.values())}; "
          f"snapshots {topology.snapshot_topic}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from grudge_stream.topology import bind_settings, load_topology_module

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
    print(f"settings of {args.topology} (flag --set NAME=VALUE, env GRUDGE_{args.topology.upper()}__NAME "
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
        overrides = {}
        if args.output_topic and args.output != "topology":
            raise ConfigError("--output-topic goes with --output topology")
        for item in args.output_topic or []:
            role, _, topic = item.partition("=")
            if not topic or role not in topology.outputs:
                raise ConfigError(f"--output-topic takes ROLE=TOPIC with ROLE in {sorted(topology.outputs)}")
            overrides[role] = topic
        start, end = parse_position(args.from_), parse_position(args.to)
        # Everything that needs no broker is checked before connecting: a mistake is one line at once.
        if args.output != "topology":
            sink = make_sink(topology, settings.bootstrap_servers, args.output, overrides)
        conf = _connect(settings)
        if args.output == "topology":
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
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from grudge_stream.demo import run_demo

    return run_demo(seconds=args.seconds, partitions=args.partitions, rate=args.rate)


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
                   help="send one output role to another topic (e.g. alerts=backfill-alerts)")
    r.add_argument("--write-snapshots", action="store_true",
                   help="write snapshots at the end offsets for a live worker to adopt")
    r.add_argument("--from-snapshot", action="store_true",
                   help="start each partition from its newest snapshot instead of a fresh state")
    r.add_argument("--quiet", action="store_true", help="no progress display")
    r.set_defaults(func=cmd_replay)

    d = sub.add_parser("demo", help="local broker + abuse-score worker + traffic; prints alerts")
    d.add_argument("--seconds", type=float, default=45.0)
    d.add_argument("--partitions", type=int, default=4)
    d.add_argument("--rate", type=float, default=2000.0, help="events per second of traffic")
    d.set_defaults(func=cmd_demo)

    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from grudge_stream import logsetup

    logsetup.install(json_lines=getattr(args, "log_format", "text") == "json")
    from grudge_stream.exceptions import GrudgeError

    try:
        return int(args.func(args) or 0)
    except GrudgeError as exc:  # a user error: one line, exit 2 (tracebacks are for bugs)
        print(f"grudge-stream {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `grudge-stream describe ... | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
