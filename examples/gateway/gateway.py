"""A login endpoint that feeds grudge-stream and refuses the clients it raised.

    python examples/gateway/gateway.py --port 8080 [--set NAME=VALUE ...]

``POST /login`` with ``{"user": ..., "password": ...}``:

- a user the ``abuse_scores`` topology has raised gets **403** at once, without
  checking anything: ``AlertView.is_raised`` is an O(1) read of the raised set the
  view keeps in memory (bootstrapped from the topology's compacted alert state
  topic, then followed live);
- otherwise the password is checked (this example accepts ``"correct"``) and the
  outcome goes to the topology's source topic as a feedback event, keyed by the
  user: ``{"outcome": "bad"}`` for a failed login, ``{"outcome": "good"}`` for a
  successful one. The worker turns those into decaying scores, raises a user at
  0.5 and clears them at 0.25, and the view here follows.

``GET /blocked`` lists the raised users (with their scores and any override).
Settings are the topology's (``--set source_topic=...`` and ``GRUDGE_*``), so
the gateway names the topics exactly as the workers do; it needs no hash key.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from aiohttp import web
from confluent_kafka import Producer

from grudge_stream.client import AlertView, topology_topics
from grudge_stream.kafkaconf import client_config
from grudge_stream.topology import Settings


def make_app(settings: Settings) -> web.Application:
    topics = topology_topics("abuse_scores", settings)
    source = settings.get("source_topic", "abuse-events")
    conf = {"bootstrap.servers": settings.bootstrap_servers, **client_config(settings)}
    app = web.Application()
    state: dict = {}

    async def start(app: web.Application) -> None:
        state["view"] = await AlertView(settings.bootstrap_servers, topics["alert_state"], topics["overrides"],
                                        client_config=client_config(settings)).start_async()
        # Kafka's default partitioner (murmur2): `grudge-stream score` finds the key's partition.
        state["producer"] = Producer({**conf, "linger.ms": 2, "enable.idempotence": True,
                                      "partitioner": "murmur2_random"})

    async def stop(app: web.Application) -> None:
        state["producer"].flush(10)
        state["view"].stop()

    async def login(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            user = str(body["user"])
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "send {\"user\": ..., \"password\": ...}"}, status=400)
        view: AlertView = state["view"]
        if view.is_raised(user):
            s = view.get(user)
            return web.json_response({"user": user, "result": "blocked", "reason": s.reason,
                                      "score": s.score}, status=403)
        ok = body.get("password") == "correct"
        producer: Producer = state["producer"]
        producer.produce(source, key=user.encode(), value=json.dumps({"outcome": "good" if ok else "bad"}).encode())
        producer.poll(0)
        return web.json_response({"user": user, "result": "ok" if ok else "wrong password"},
                                 status=200 if ok else 401)

    async def blocked(request: web.Request) -> web.Response:
        view: AlertView = state["view"]
        return web.json_response([{"user": k.decode("utf-8", "replace"), "reason": s.reason, "score": s.score}
                                  for k, s in sorted(view.raised().items())])

    app.router.add_post("/login", login)
    app.router.add_get("/blocked", blocked)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a topology setting")
    args = ap.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") and "bootstrap_servers" not in overrides:
        overrides["bootstrap_servers"] = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    web.run_app(make_app(Settings(overrides)), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
