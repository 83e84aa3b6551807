"""The ``grudge-stream`` command: run a topology's worker, create its topics, run the demo."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from confluent_kafka import KafkaException

from grudge_stream.cli import alerts, replay, score, topics, worker


def _version() -> str:
    from grudge_stream import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="grudge-stream", description=__doc__)
    ap.add_argument("--version", action="version", version=f"grudge-stream {_version()}")
    sub = ap.add_subparsers(dest="command", required=True)
    worker.add_worker_parser(sub)
    topics.add_topics_parser(sub)
    topics.add_describe_parser(sub)
    replay.add_replay_parser(sub)
    replay.add_backfill_parser(sub)
    alerts.add_alerts_parser(sub)
    alerts.add_override_parser(sub)
    score.add_score_parser(sub)
    topics.add_create_topic_parser(sub)
    worker.add_demo_parser(sub)

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
