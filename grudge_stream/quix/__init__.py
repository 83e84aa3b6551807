"""Sketch state in your own Quix Streams application: steps of a ``StreamingDataFrame``.

::

    from quixstreams import Application
    from grudge_stream import quix as grudge
    from grudge_stream.hashkey import HashKey
    from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig

    app = Application(broker_address="localhost:9092", consumer_group="shop-guard",
                      auto_offset_reset="earliest")
    logins = app.topic("logins", key_deserializer="bytes", value_deserializer="json")
    abuse = grudge.scores(app, "shop-guard-abuse", source=logins, hash_key=HashKey.parse(SEED),
                          sketch=ScoreSketchConfig(levels=4, cells_per_level=100_000,
                                                   decay=Exponential(0.01), hasher="siphash"),
                          raise_at=0.5, clear_at=0.25)

    sdf = app.dataframe(logins)
    sdf = abuse.update(sdf, lambda login: 0.04 if login["outcome"] == "bad" else -0.001)
    sdf = sdf.apply(count_logins, stateful=True)       # your own steps, Quix's own state
    app.run()

``scores``, ``rate_limiter``, ``heavy_hitters`` and ``forgetting_set`` build a state
(``grudge_stream.state``) and bind it to the app; ``bind(app, state)`` binds one you
built. The binding (``QuixState``) adds steps to a dataframe of the state's source
topic, in the shape of the dataframe's own:

- ``update(sdf, value_of)``: apply each record to the state; the record goes on unchanged;
- ``apply(sdf, value_of)``: the record's value becomes what the state computed for it
  (the new score, ``(allowed, retry_after_ms)``, the estimate, "new?");
- ``filter(sdf, value_of, keep=None)``: only records the state lets through go on (rate
  limiter: allowed; forgetting set: seen for the first time; scores and heavy hitters:
  the key is raised).

Each takes the record's key, its timestamp (Quix's, the topic's timestamp extractor
included) and its partition and offset (``message_context()``); ``value_of(value)`` is
what the record adds (a delta, a cost, a count: None leaves the state untouched).

What binding does to the app, and nothing else (docs/embedding.md, "In a Quix Streams
application"):

- assigned partitions of the source topic are restored from their newest snapshots in
  Quix's assignment callback, before any of their records is processed (or, failing
  that, on first use); revoked ones get a last snapshot and are let go;
- the state is snapshotted at every Quix checkpoint, before Quix commits: the steps
  register a sink (Quix's ``BaseSink``) whose ``flush`` (called by every checkpoint
  before its commit) delivers the state's outputs, then writes the snapshots, so the
  commit never passes a durable snapshot and no snapshot covers an undelivered output;
- records below a restored snapshot's offset are skipped by the state alone; your other
  steps see them (at-least-once, as Quix gives).

``serve(app, port=..., token_file=...)`` serves the states' score reads over HTTP, on a
small server of its own while ``app.run()`` runs (Quix has none):
``/grudge/<state>/v1/score?key=K`` on any instance, answered by the instance that holds the
key's partition, behind the bearer tokens of ``token_file`` (``StatesServer``).

The modules: ``grudge_stream.quix.binding`` (the states bound to an app and their steps),
``grudge_stream.quix.server`` (live reads over HTTP), ``grudge_stream.quix.rebalance``
(the hook into Quix's rebalances).

Assignment and revocation come from Quix's rebalance callbacks, which Quix does not
expose (``Application._on_assign``, ``_on_revoke``, ``_on_lost``): ``_hook_rebalance``
(``grudge_stream.quix.rebalance``) wraps them, for the Quix versions in
``QUIX_SUPPORTED`` (the ``quix`` extra pins them; tests/unit/test_quix_binding.py fails
when those attributes change).
"""
from __future__ import annotations

from grudge_stream.quix.binding import (
    QuixState,
    QuixStates,
    bind,
    forgetting_set,
    heavy_hitters,
    rate_limiter,
    scores,
    serve,
)
from grudge_stream.quix.rebalance import QUIX_SUPPORTED
from grudge_stream.quix.server import StatesServer
from grudge_stream.state import StateNotReady

__all__ = ["bind", "scores", "rate_limiter", "heavy_hitters", "forgetting_set", "serve", "QuixState", "QuixStates",
           "StatesServer", "QUIX_SUPPORTED", "StateNotReady"]
