"""A Quix Streams application of your own with grudge-stream state beside Quix's own state.

One ``StreamingDataFrame`` reads the ``logins`` topic (JSON ``{"outcome": "bad"}`` or
``"good"``, keyed by the user) and has two steps:

- ``judge.update``: a decaying abuse score per user in a ``ScoreState`` (fixed memory per
  partition, whatever the number of users), with alerts for free: a user is raised on
  ``<app>-abuse-alerts`` when the score reaches 0.5 and cleared at 0.25;
- ``count``: logins per user in Quix's own state (RocksDB and its changelog), each new
  count written to ``<app>-login-counts``.

The state's scores are read over HTTP from any instance (``grudge.serve``: Quix has no
web server, so the binding starts a small one beside the app):
``GET /grudge/<app>-abuse/v1/score?key=K`` with ``Authorization: Bearer <token>``,
answered by the instance that holds the key's partition.

Run it like any Quix app (``pip install 'grudge-stream[quix]'``)::

    export GRUDGE_SEED=$(python -c 'import secrets; print(secrets.token_hex(16))')
    echo "reader:$(python -c 'import secrets; print(secrets.token_urlsafe(32))')" > tokens
    export GRUDGE_QUERY_TOKEN_FILE=$PWD/tokens
    python examples/quix_app.py --web-port 6066

Environment: ``KAFKA_BOOTSTRAP_SERVERS`` (default 127.0.0.1:9092), ``GRUDGE_SEED`` (the
secret hash key, required), ``EXAMPLE_APP_ID`` (default ``shop-guard``, also the consumer
group), ``EXAMPLE_SOURCE`` (default ``logins``), ``EXAMPLE_PARTITIONS`` (default 4, the
source topic's partition count), ``EXAMPLE_DATADIR`` (Quix's state directory, default a
temporary one), ``EXAMPLE_GUARANTEE`` (``at-least-once``, the default, or
``exactly-once``), ``GRUDGE_QUERY_TOKEN_FILE`` (the readers' bearer tokens, ``name:token``
lines; required unless ``--web-host`` is a loopback address, the default). Arguments:
``--web-host`` (default 127.0.0.1), ``--web-port`` (default 6066) of the live reads.
``tests/integration/test_embedded_quix.py`` runs it, kills it with SIGKILL, and checks its
state and outputs against an uninterrupted replay; ``test_embedded_quix_reads.py`` reads
scores from two instances.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile

from quixstreams import Application
from quixstreams.models import TopicConfig

from grudge_stream import quix as grudge
from grudge_stream.exceptions import GrudgeError
from grudge_stream.hashkey import HashKey
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

APP_ID = os.environ.get("EXAMPLE_APP_ID", "shop-guard")
SOURCE = os.environ.get("EXAMPLE_SOURCE", "logins")
PARTITIONS = int(os.environ.get("EXAMPLE_PARTITIONS", "4"))
BROKER = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
DELTAS = {"bad": 0.04, "good": -0.001}

app = Application(
    broker_address=BROKER,
    consumer_group=APP_ID,
    auto_offset_reset="earliest",
    commit_interval=2.0,
    state_dir=os.environ.get("EXAMPLE_DATADIR") or tempfile.mkdtemp(prefix=f"{APP_ID}-"),
    processing_guarantee=os.environ.get("EXAMPLE_GUARANTEE", "at-least-once"),  # type: ignore[arg-type]
    loglevel="INFO",
)
logins = app.topic(SOURCE, key_deserializer="bytes", value_deserializer="bytes")
login_counts = app.topic(f"{APP_ID}-login-counts", key_serializer="bytes", value_serializer="json",
                         config=TopicConfig(num_partitions=PARTITIONS, replication_factor=1))

# The grudge-stream state: one 4 x 20,000-cell split-sign score sketch per partition of
# ``logins``, hashed under the secret key (docs/security.md).
judge = grudge.scores(
    app, f"{APP_ID}-abuse", source=logins, bootstrap_servers=BROKER,
    hash_key=HashKey.parse(os.environ["GRUDGE_SEED"]),
    sketch=ScoreSketchConfig(levels=4, cells_per_level=20_000, decay=Exponential(0.01), lo=0.0, hi=1.0,
                             aggregator="min", hasher="siphash"),
    raise_at=0.5, clear_at=0.25,
)
abuse = judge.state  # the ScoreState: reads (score, raised), its topics


def outcome_of(value: bytes | None) -> str | None:
    """The event's outcome, or None for a payload this app does not understand."""
    try:
        outcome = json.loads(value or b"").get("outcome")
    except (ValueError, AttributeError):
        return None
    return outcome if outcome in DELTAS else None


def count(value: bytes, state) -> int:
    """Logins per user, in Quix's own state."""
    n = state.get("logins", 0) + 1
    state.set("logins", n)
    return n


sdf = app.dataframe(logins)
# Key, event time, partition and offset come from the record being processed; a payload
# without a known outcome (None) leaves the score alone.
sdf = judge.update(sdf, lambda value: DELTAS.get(outcome_of(value)), key_of=lambda value, key: key or None)
sdf = sdf.apply(count, stateful=True)
sdf.to_topic(login_counts)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="grudge-stream state in a Quix Streams app")
    parser.add_argument("--web-host", default="127.0.0.1", help="address of the live reads (default 127.0.0.1)")
    parser.add_argument("--web-port", type=int, default=6066, help="port of the live reads (default 6066)")
    args = parser.parse_args()
    # Quix sets up its own logger; grudge-stream's (restores, snapshots) go to the root one.
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(levelname)s] [%(name)s] : %(message)s")
    # Live reads of the state, routed to the instance that holds the key's partition:
    # GET /grudge/<APP_ID>-abuse/v1/score?key=K, for the tokens of GRUDGE_QUERY_TOKEN_FILE
    # (the same access rules as a worker's /v1/score).
    try:
        grudge.serve(app, host=args.web_host, port=args.web_port)
    except GrudgeError as exc:  # no token file for an address others reach, say: one line, status 2
        logging.getLogger("quix_app").error("live reads cannot be served: %s", exc)
        raise SystemExit(2) from None
    app.run()
