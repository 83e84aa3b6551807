"""Live reads of the states embedded in a Faust app, on the app's own web server (``StatesWeb``).

What ``grudge_stream.faust.serve`` mounts: per state, the score query pages of a worker
(``grudge_stream.serving``) under ``<prefix>/<state name>``.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

import faust
from faust.web import View

from grudge_stream.exceptions import ConfigError
from grudge_stream.serving.http import WorkerHTTP, mount_core
from grudge_stream.sections import Serving
from grudge_stream.topology import Settings

log = logging.getLogger("grudge_stream.faust")

# The events an agent hands a state whose reads are served (``update(key, delta)`` in an
# agent) have their record's key checked against the partitioner: those at offsets below
# ``SAMPLE_FIRST`` of each partition, then one offset in 64 (a bit test per event).
SAMPLE_FIRST = 256
SAMPLE_MASK = 63


class StatesWeb:
    """Live reads of a Faust app's states on the app's own web server (``serve``).

    Per state, ``<prefix>/<name>/v1/score`` and ``<prefix>/<name>/v1/scores``: the score
    query API of a worker (``grudge_stream.serving``), whose parsing, access rules,
    routing, forwards and answers are used as they are; this class only mounts them on
    Faust's web server. The key's partition is computed with the state's
    ``key_partitioner`` (Kafka's murmur2 by default, as Faust's own producer places keys);
    a partition this instance does not hold is asked of its owner, found in the members
    directory ``grudge-embedded-<name>-members`` where every instance publishes the
    partitions it holds restored and the URL it answers at (``<canonical_url><prefix>/<name>``),
    and each answer says which instance read it (``served_by``). The keys of the events the
    agents hand a state are sampled to check that partitioner; until a sampled key
    confirmed it, answers carry ``partitioner_check``.
    """

    def __init__(self, states: Any, *, token_file: str | None = None,
                 key_partitioner: str | None = None, insecure_open: bool = False,
                 prefix: str = "/grudge") -> None:
        from grudge_stream.serving import PARTITIONERS

        if key_partitioner is not None and key_partitioner not in PARTITIONERS:
            raise ConfigError(f"key_partitioner must be one of {PARTITIONERS}, not {key_partitioner!r}")
        if not isinstance(prefix, str) or not prefix.startswith("/") or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a URL path starting with '/', not {prefix!r}")
        self.states = states
        self.app = states.app
        self.token_file = token_file
        self.key_partitioner = key_partitioner
        self.insecure_open = bool(insecure_open)
        self.prefix = prefix.rstrip("/")
        self.access: Any = None
        self.base_url = ""
        self.apis: dict[str, WorkerHTTP] = {}

    def path(self, state: Any) -> str:
        """The state's path on the app's web server (``/v1/score`` and ``/v1/scores`` below it)."""
        from urllib.parse import quote

        return f"{self.prefix}/{quote(state.name, safe='-._~')}"

    def mount(self, state: Any) -> None:
        """The state's two pages on the app's web server (before the app starts, as any page)."""
        base, web = self.path(state), self

        def view(rel: str) -> type:
            async def answer(self: View, request: Any) -> Any:
                return await web.respond(self, state, request, rel)

            return type(f"GrudgeState{rel.rsplit('/', 1)[1].title()}View", (View,), {"get": answer, "post": answer})

        for rel in ("/v1/score", "/v1/scores"):
            self.app.page(base + rel, name=f"grudge-{state.name}-{rel.rsplit('/', 1)[1]}")(view(rel))
        # The keys the agents hand the state are sampled for the partitioner check.
        sample = self.sample
        state.bind_context(dataclasses.replace(state.context,
                                               current_position=lambda: current_position(state, sample)))

    def start(self) -> None:
        """The access rules against the app's web settings as the worker runs them (after
        ``faust worker --web-bind/--web-host/--web-port``): without a token file the pages
        answer only on a loopback bind address (``ConfigError`` otherwise)."""
        from grudge_stream.webauth import QueryAccess, is_loopback

        conf = self.app.conf
        first = next(iter(self.states.states.values()), None)
        serving = first.sections.serving if first is not None else Serving.of(Settings())
        token_file = self.token_file or serving.query_token_file
        bind = str(conf.web_bind or "0.0.0.0")
        if not token_file and not is_loopback(bind) and not self.insecure_open:
            raise ConfigError(
                f"the app's web server binds {bind} (web_bind): the states' score reads would answer anyone "
                f"who reaches port {conf.web_port} without a token. Give serve(app, token_file=...) (or "
                "GRUDGE_QUERY_TOKEN_FILE: a file of bearer tokens, docs/security.md), bind the web server to a "
                "loopback address (faust worker --web-bind 127.0.0.1), or serve(app, insecure_open=True)")
        self.access = QueryAccess.from_settings(dataclasses.replace(
            serving, web_host=bind, web_port=conf.web_port, query_token_file=token_file,
            insecure_open_queries=serving.insecure_open_queries or self.insecure_open))
        self.base_url = str(conf.canonical_url).rstrip("/")
        if not conf.web_enabled:
            log.warning("the app's web server is disabled (web_enabled=False): the states' live reads "
                        "are not served, and no other instance can forward to this one")

    def start_state(self, state: Any) -> None:
        """A started state's queries under these access rules, answering at its URL, and its
        members directory (blocking: run it in an executor). Once per state."""
        if state.name in self.apis or state.core is None:
            return
        core = state.core
        url = self.base_url + self.path(state)
        self.apis[state.name] = mount_core(core, url, self.access, self.key_partitioner)
        log.info("state %s: live reads at %s/v1/score (key_partitioner=%s)", state.name, url,
                 core.queries.partitioner)

    async def respond(self, view: View, state: Any, request: Any, rel: str) -> Any:
        """One request to a state's page: refused without the token before its body is read,
        then answered as a worker answers ``rel`` (local reads on the loop, forwards from an
        executor thread)."""
        from grudge_stream.serving.http import Answer, _json

        t0 = time.perf_counter()
        api = self.apis.get(state.name)
        if api is None or self.access is None:
            answer: Answer = _json(503, {"error": "not_ready", "message": f"state {state.name!r} has not started "
                                         "yet (the app has not joined its group)", "retry_after_s": 1},
                                   {"Retry-After": "1"})
        else:
            peer = getattr(request, "remote", None) or ""
            client, refusal = api.admit(request.headers, peer)
            if client is None:
                answer = refusal
            else:
                body = await request.read() if request.method == "POST" else b""
                answer = await api.score_on_loop(request.method, rel, request.query_string, body,
                                                 request.headers, peer, client)
            api.answered(answer, t0)
        return view.bytes(answer.body, content_type=answer.content_type, status=answer.status,
                          headers=dict(answer.headers) or None)

    def sample(self, state: Any, message: Any) -> None:
        """The record of an event an agent hands ``state``: now and then its key (as
        produced, before Faust's key serializer) checked against the state's partitioner
        (``PartitionerCheck``: its status is in every answer until a key confirmed it)."""
        core, key = state.core, message.key
        if core is not None and core.partition_count and isinstance(key, bytes):
            core.partitioner_check.check(message.partition, core.partition_count, [key])

    def close(self) -> None:
        """Every state's members directory closed (a clean stop: its record withdrawn)."""
        for state in self.states.states.values():
            core = state.core
            if core is not None and core.membership.directory is not None:
                core.membership.directory.close()
                core.membership.directory = None


def current_position(state, sample: Callable[[Any, Any], None] | None = None) -> tuple[int, int, int]:
    """(partition, offset, timestamp ms) of the Faust event being processed; ``sample``
    (live reads served: ``StatesWeb.sample``) sees its message."""
    event = faust.current_event()
    if event is None:
        raise TypeError(f"state {state.name!r} was called outside a Faust agent's event: pass partition, "
                        "offset and timestamp_ms")
    m = event.message
    if m.topic != state.source_topic:
        raise ValueError(f"state {state.name!r} is bound to topic {state.source_topic!r}, but the event "
                         f"being processed is of {m.topic!r}")
    if sample is not None and (m.offset < SAMPLE_FIRST or not m.offset & SAMPLE_MASK):
        sample(state, m)
    return m.partition, m.offset, int(round(m.timestamp * 1000))
