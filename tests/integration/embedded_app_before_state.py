"""examples/faust_app/app.py as it was before the grudge-stream state was added: the same
app id, source topic, Table and counting agent, no state (tests/integration/test_embedded_backfill.py
runs it on a topic's history, then adds the state with a backfill). Environment as the example's."""
from __future__ import annotations

import os
import tempfile

import faust

APP_ID = os.environ.get("EXAMPLE_APP_ID", "shop-guard")
SOURCE = os.environ.get("EXAMPLE_SOURCE", "logins")
PARTITIONS = int(os.environ.get("EXAMPLE_PARTITIONS", "4"))
BROKER = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")

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
logins_per_user = app.Table("logins-per-user", default=int, key_type=bytes, value_type=int,
                            partitions=PARTITIONS)


@app.agent(logins)
async def count(stream):
    async for event in stream.events():
        logins_per_user[event.key] += 1


if __name__ == "__main__":
    app.main()
