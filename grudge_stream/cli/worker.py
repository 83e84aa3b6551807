"""``grudge-stream worker`` (a topology's worker, on either runtime, with the collector
tuned for it) and ``grudge-stream demo``.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import logging
import os
import signal

from grudge_stream.cli.common import add_topology_arguments, settings_from
from grudge_stream.sections import Group
from grudge_stream.topology import load_topology


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
    # ``kill -USR1 <pid>``: every thread's stack on stderr, for a worker that seems stuck; and a
    # crash inside a C library (a segmentation fault, an abort) says so on stderr with the stacks
    # instead of ending the process without a line.
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no stderr file (embedded, tests)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        faulthandler.enable(all_threads=True)
    settings = settings_from(args)
    topology = load_topology(args.topology, settings)
    runtime = args.runtime or Group.of(settings).runtime
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
    stage = start_stage(topology, settings, metrics=runtime.core.metrics, liveness=runtime.core.liveness,
                        client_config=runtime.core.client_config)
    try:
        worker.execute_from_commandline()
    except SystemExit:
        if runtime.fatal is None:
            raise
    finally:
        if stage is not None:
            stage.stop()
    return exit_code(runtime.fatal) if runtime.fatal is not None else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from grudge_stream.demo import run_demo

    return run_demo(seconds=args.seconds, partitions=args.partitions, rate=args.rate, keep=args.keep)


def add_worker_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream worker``."""
    w = sub.add_parser("worker", help="run a topology as a Faust worker")
    add_topology_arguments(w)
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


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream demo``."""
    d = sub.add_parser("demo", help="local broker + abuse-score worker + traffic; prints alerts")
    d.add_argument("--seconds", type=float, default=45.0)
    d.add_argument("--partitions", type=int, default=4)
    d.add_argument("--rate", type=float, default=2000.0, help="events per second of traffic")
    d.add_argument("--keep", action="store_true",
                   help="keep the broker (the one of make broker-start), the topics under the topology's own "
                        "names and the hash key, for grudge-stream alerts / replay / worker / score next")
    d.set_defaults(func=cmd_demo)
