"""A user's Faust app with grudge state and static membership, run as a subprocess by
test_fenced_member.py (not collected): two of them under one group_instance_id fence each
other. Arguments: BOOTSTRAP SOURCE APP_ID INSTANCE_ID SEED DATADIR, then Faust's own
(``worker -l info``)."""
from __future__ import annotations

import sys

import faust

from grudge_stream import faust as grudge
from grudge_stream.hashkey import HashKey
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

bootstrap, source, app_id, instance_id, seed, datadir = sys.argv[1:7]
del sys.argv[1:7]

app = faust.App(app_id, broker=f"kafka://{bootstrap}", consumer_group_instance_id=instance_id,
                store="memory://", web_enabled=False, autodiscover=False, datadir=datadir,
                topic_partitions=2, topic_replication_factor=1, consumer_auto_offset_reset="earliest")
logins = app.topic(source, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
abuse = grudge.scores(app, f"{app_id}-abuse", source=logins, hash_key=HashKey.parse(seed),
                      sketch=ScoreSketchConfig(levels=4, cells_per_level=5000, decay=Exponential(0.01),
                                               hasher="siphash"),
                      raise_at=0.5, clear_at=0.25, bootstrap_servers=bootstrap)


@app.agent(logins)
async def judge(stream):
    async for event in stream.events():
        abuse.update(event.key, 0.04 if b"bad" in event.value else -0.001)


if __name__ == "__main__":
    app.main()
