"""A Faust app of your own with grudge-stream state beside a plain Faust Table.

Two agents read the ``logins`` topic (JSON ``{"outcome": "bad"}`` or ``"good"``,
keyed by the user):

- ``judge`` keeps a decaying abuse score per user in a ``ScoreState`` (fixed memory
  per partition, whatever the number of users) and gets alerts for free: a user is
  raised on ``<app>-abuse-alerts`` when the score reaches 0.5 and cleared at 0.25;
- ``count`` counts logins per user in an ordinary Faust Table.

The state's scores are read on the app's own web server, from any instance:
``GET /grudge/<app>-abuse/v1/score?key=K`` with ``Authorization: Bearer <token>``
(``grudge.serve``: answered by the instance that holds the key's partition).

Run it like any Faust app::

    export GRUDGE_SEED=$(python -c 'import secrets; print(secrets.token_hex(16))')
    echo "reader:$(python -c 'import secrets; print(secrets.token_urlsafe(32))')" > tokens
    export GRUDGE_QUERY_TOKEN_FILE=$PWD/tokens
    python examples/faust_app/app.py worker -l info

Environment: ``KAFKA_BOOTSTRAP_SERVERS`` (default 127.0.0.1:9092), ``GRUDGE_SEED`` (the
secret hash key, required), ``GRUDGE_QUERY_TOKEN_FILE`` (the readers' bearer tokens,
``name:token`` lines; required unless the web server binds a loopback address), ``EXAMPLE_APP_ID`` (default ``shop-guard``),
``EXAMPLE_SOURCE`` (default ``logins``), ``EXAMPLE_PARTITIONS`` (default 4, the source
topic's partition count), ``EXAMPLE_DATADIR`` (Faust's local data, default a
temporary directory). ``tests/integration/test_embedded_faust.py`` runs it, kills it
with SIGKILL, and checks its state and outputs against an uninterrupted replay;
``tests/integration/test_embedded_backfill.py`` adds the state to the app after the
topic holds history, and fills it with ``grudge-stream backfill`` first.
"""
from __future__ import annotations

import json
import os
import tempfile

import faust

from grudge_stream import faust as grudge
from grudge_stream.hashkey import HashKey
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

APP_ID = os.environ.get("EXAMPLE_APP_ID", "shop-guard")
SOURCE = os.environ.get("EXAMPLE_SOURCE", "logins")
PARTITIONS = int(os.environ.get("EXAMPLE_PARTITIONS", "4"))
BROKER = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
DELTAS = {"bad": 0.04, "good": -0.001}

app = faust.App(
    APP_ID,
    broker=f"kafka://{BROKER}",
    store="memory://",
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    table_standby_replicas=0,
    consumer_auto_offset_reset="earliest",
    datadir=os.environ.get("EXAMPLE_DATADIR") or tempfile.mkdtemp(prefix=f"{APP_ID}-"),
)
logins = app.topic(SOURCE, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

# The grudge-stream state: one 4 x 20,000-cell split-sign score sketch per partition of
# ``logins``, hashed under the secret key (docs/security.md).
abuse = grudge.scores(
    app, f"{APP_ID}-abuse", source=logins,
    hash_key=HashKey.parse(os.environ["GRUDGE_SEED"]),
    sketch=ScoreSketchConfig(levels=4, cells_per_level=20_000, decay=Exponential(0.01), lo=0.0, hi=1.0,
                             aggregator="min", hasher="siphash"),
    raise_at=0.5, clear_at=0.25, checkpoint_interval_s=2.0,
)

# Live reads of the state on this app's web server, routed to the instance that holds the
# key's partition: GET /grudge/<APP_ID>-abuse/v1/score?key=K, for the tokens of
# GRUDGE_QUERY_TOKEN_FILE (the same access rules as a worker's /v1/score).
grudge.serve(app)

# A plain Faust Table beside it.
logins_per_user = app.Table("logins-per-user", default=int, key_type=bytes, value_type=int,
                            partitions=PARTITIONS)


def outcome_of(value: bytes | None) -> str | None:
    """The event's outcome, or None for a payload this app does not understand."""
    try:
        outcome = json.loads(value or b"").get("outcome")
    except (ValueError, AttributeError):
        return None
    return outcome if outcome in DELTAS else None


def delta_of(key: bytes | None, value: bytes | None) -> float | None:
    """What a record adds to its user's score; None for a record the state is left alone on.
    The agent below and a backfill (``grudge-stream backfill ... --value-of delta_of``) share it."""
    outcome = outcome_of(value)
    return DELTAS[outcome] if outcome is not None and key else None


@app.agent(logins)
async def judge(stream):
    async for event in stream.events():
        delta = delta_of(event.key, event.value)
        if delta is not None:
            # Partition, offset and event time come from the event being processed.
            abuse.update(event.key, delta)


@app.agent(logins)
async def count(stream):
    async for event in stream.events():
        logins_per_user[event.key] += 1


if __name__ == "__main__":
    app.main()
