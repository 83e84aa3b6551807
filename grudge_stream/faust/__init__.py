"""Sketch state in your own Faust app: the shape of ``app.Table``, in fixed memory.

::

    import os

    import faust
    from grudge_stream import faust as grudge
    from grudge_stream.hashkey import HashKey
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

    app = faust.App("shop-guard", broker=f"kafka://{os.environ['BROKER']}", store="memory://",
                    topic_partitions=4)  # the source topic's partition count
    logins = app.topic("logins", key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")
    abuse = grudge.scores(app, "shop-guard-abuse", source=logins,
                          hash_key=HashKey.parse(os.environ["GRUDGE_SEED"]),
                          sketch=ScoreSketchConfig(levels=4, cells_per_level=100_000,
                                                   decay=Exponential(0.01), hasher="siphash"),
                          raise_at=0.5, clear_at=0.25)
    logins_per_user = app.Table("logins-per-user", default=int, key_type=bytes, value_type=int,
                                partitions=4)

    @app.agent(logins)
    async def judge(stream):
        async for event in stream.events():
            abuse.update(event.key, 0.04 if event.value == b"bad" else -0.001)
            logins_per_user[event.key] += 1

    if __name__ == "__main__":
        app.main()

The state uses the app's broker and ``broker_credentials`` unless it is given
``bootstrap_servers`` / ``client_config``. The source topic must exist first
(``grudge-stream create-topic logins --partitions 4``), and the app's Tables must have
its partition count. Each state is bound to one source topic and split like it: one sketch per partition,
restored from its snapshot topic when the partition is assigned (before any of its
records reach an agent), snapshotted every ``checkpoint_interval_s``, on revocation
and at shutdown. The app's commits of that topic never pass a state's newest durable
snapshot; every other topic, agent, Table and timer of the app works as Faust has it.
A per-event call takes the partition, offset and timestamp of the event being
processed. ``grudge.serve(app)`` serves the states' score reads on the app's web server
(``/grudge/<state>/v1/score?key=K``, answered by the instance that holds the key's
partition, behind the bearer tokens of ``GRUDGE_QUERY_TOKEN_FILE``).
docs/embedding.md says what is guaranteed, and what is not.
"""
from __future__ import annotations

from typing import Any

import faust

from grudge_stream.runtime.faust.states import FaustStates, attach, serve
from grudge_stream.runtime.faust.web import StatesWeb
from grudge_stream.state import (
    ForgettingSetState,
    HeavyHitterState,
    RateLimitState,
    ScoreState,
    SketchState,
    StateNotReady,
)

__all__ = ["attach", "serve", "StatesWeb", "scores", "rate_limiter", "heavy_hitters", "forgetting_set", "FaustStates",
           "SketchState", "ScoreState", "RateLimitState", "HeavyHitterState", "ForgettingSetState",
           "StateNotReady"]


def _topic_name(source: Any) -> str:
    if isinstance(source, str):
        return source
    names = getattr(source, "topics", None)
    if names and len(names) == 1:
        return str(names[0])
    raise TypeError("source must be a topic name or a Faust topic of exactly one topic, "
                    f"not {source!r}")


def scores(app: faust.App, name: str, *, source: Any, **kw: Any) -> ScoreState:
    """A ``ScoreState`` (decaying scores with alerts) of ``source``, attached to ``app``."""
    return attach(app, ScoreState(name, source_topic=_topic_name(source), **kw))


def rate_limiter(app: faust.App, name: str, *, source: Any, **kw: Any) -> RateLimitState:
    """A ``RateLimitState`` (token buckets) of ``source``, attached to ``app``."""
    return attach(app, RateLimitState(name, source_topic=_topic_name(source), **kw))


def heavy_hitters(app: faust.App, name: str, *, source: Any, **kw: Any) -> HeavyHitterState:
    """A ``HeavyHitterState`` (decayed counts, top-k, alerts) of ``source``, attached to ``app``."""
    return attach(app, HeavyHitterState(name, source_topic=_topic_name(source), **kw))


def forgetting_set(app: faust.App, name: str, *, source: Any, **kw: Any) -> ForgettingSetState:
    """A ``ForgettingSetState`` (a set that forgets) of ``source``, attached to ``app``."""
    return attach(app, ForgettingSetState(name, source_topic=_topic_name(source), **kw))
