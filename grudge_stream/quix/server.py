"""Live reads of a Quix application's states over HTTP (``StatesServer``, started by
``grudge_stream.quix.serve``): a small web server of grudge-stream's own, since Quix Streams
has none.
"""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("grudge_stream.quix")


class _NotStarted:
    """The API of a state that has not started yet (the app has not joined its group): every
    score request answers 503 ``not_ready``, as on a Faust app."""

    def __init__(self, name: str) -> None:
        self.name = name

    health = staticmethod(lambda path: None)
    is_score = staticmethod(lambda path: True)

    def admit(self, headers: Any, peer: str) -> tuple[None, Any]:
        from grudge_stream.serving.http import _json

        return None, _json(503, {"error": "not_ready", "message": f"state {self.name!r} has not started yet (the "
                                 "application has not joined its group)", "retry_after_s": 1}, {"Retry-After": "1"})

    def answered(self, answer: Any, t0: float) -> None:
        pass


class StatesServer:
    """Live reads of a Quix application's states over HTTP (``serve``).

    Quix Streams has no web server, so this is a small one of grudge-stream's own: the
    batch worker's threaded server (``grudge_stream.serving.server``), started on a thread
    when ``app.run()`` starts and stopped when it returns. Per state, ``<prefix>/<name>/v1/score``
    and ``<prefix>/<name>/v1/scores``: the score query API of a worker
    (``grudge_stream.serving``), whose access rules, parsing, routing, forwards and answers
    are used as they are. The key's partition is computed with ``key_partitioner`` (Kafka's
    murmur2 by default, as Quix's own producers place keys); a partition this instance
    does not hold is asked of its owner, found in the members directory
    ``grudge-embedded-<name>-members`` where every instance publishes the partitions it
    holds restored and the URL it answers at, and each answer says which instance read it
    (``served_by``, and ``forwarded_by`` when it was asked of another). While reads are
    served, each record is applied under its partition's lock (which a read holds while
    it reads), and the keys applied are sampled to check the partitioner; until a sampled
    key confirmed it, answers carry ``partitioner_check``.

    ``states`` is the app's ``QuixStates`` and the states it starts are its ``QuixState``
    objects (``grudge_stream.quix.binding``, which imports this module: typed ``Any`` here).
    """

    def __init__(self, states: Any, *, port: int | None = None, host: str | None = None,
                 token_file: str | None = None, key_partitioner: str | None = None, insecure_open: bool = False,
                 prefix: str = "/grudge", advertised_url: str | None = None, serving: Any = None) -> None:
        import dataclasses

        from grudge_stream.exceptions import ConfigError
        from grudge_stream.sections import Serving
        from grudge_stream.serving import PARTITIONERS
        from grudge_stream.settings import Settings
        from grudge_stream.webauth import QueryAccess, is_loopback, server_tls

        if key_partitioner is not None and key_partitioner not in PARTITIONERS:
            raise ConfigError(f"key_partitioner must be one of {PARTITIONERS}, not {key_partitioner!r}")
        if not isinstance(prefix, str) or not prefix.startswith("/") or "?" in prefix:
            raise ValueError(f"prefix must be a URL path starting with '/', not {prefix!r}")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
            raise ValueError(f"port must be an int from 0 to 65535 (0: any free port), not {port!r}")
        if host is not None and (not isinstance(host, str) or not host):
            raise ValueError(f"host must be an address to bind, not {host!r}")
        if serving is not None and not isinstance(serving, Serving):
            raise TypeError(f"serving must be a grudge_stream.sections.Serving, not {type(serving).__name__}")
        env = serving if serving is not None else Serving.of(Settings())  # default: GRUDGE_* variables
        insecure_open = insecure_open or (serving is not None and serving.insecure_open_queries)
        self.states = states
        self.host = host if host is not None else str(env.web_host)
        self.port = port if port is not None else int(env.web_port)
        token_file = token_file or env.query_token_file
        if not token_file and not is_loopback(self.host) and not insecure_open:
            raise ConfigError(
                f"host: live reads served on {self.host} would answer anyone who reaches port {self.port} "
                "without a token. Give serve(app, token_file=...) (or GRUDGE_QUERY_TOKEN_FILE: a file of bearer "
                "tokens, docs/security.md), serve on a loopback address (host='127.0.0.1', the default), or "
                "serve(app, insecure_open=True)")
        self.serving = dataclasses.replace(
            env, web_host=self.host, web_port=self.port, query_token_file=str(token_file) if token_file else None,
            insecure_open_queries=env.insecure_open_queries or insecure_open,
            advertised_url=str(advertised_url) if advertised_url else env.advertised_url)
        try:
            self.access = QueryAccess.from_settings(self.serving)
        except ConfigError as exc:  # a token file that cannot be read, or holds no token
            raise ConfigError(f"token_file: {exc}") from None
        self.tls = server_tls(self.serving)
        self.key_partitioner = key_partitioner
        self.prefix = prefix.rstrip("/")
        self.base_url = ""
        self.server: Any = None
        self.apis: dict[str, Any] = {}

    def path(self, bound: Any) -> str:
        """The state's path (``/v1/score`` and ``/v1/scores`` below it)."""
        from urllib.parse import quote

        return f"{self.prefix}/{quote(bound.name, safe='-._~')}"

    def url(self, bound: Any) -> str:
        """The state's URL, as other instances forward to it (once serving)."""
        return self.base_url + self.path(bound)

    def start(self) -> None:
        """Bind the port and serve from a thread (``app.run()`` calls it first); a port that
        cannot be bound is a ``ConfigError`` naming it, before the app joins its group."""
        import dataclasses

        from grudge_stream.exceptions import ConfigError
        from grudge_stream.serving.members import advertised_url
        from grudge_stream.serving.server import WebServer

        if self.server is not None:
            return
        try:
            self.server = WebServer((self.host, self.port), self.route, self.tls).start("grudge-quix-reads")
        except OSError as exc:
            raise ConfigError(f"port: live reads cannot be served on {self.host}:{self.port}: {exc}") from None
        self.base_url = advertised_url(dataclasses.replace(self.serving, web_port=self.server.port))
        log.info("live reads of the states at %s%s/<state>/v1/score", self.base_url, self.prefix)

    def route(self, path: str) -> tuple[Any, str] | None:
        """A request's state API and the path below the state, or None (404)."""
        from urllib.parse import unquote

        from grudge_stream.serving.http import WorkerHTTP

        if not path.startswith(self.prefix + "/"):
            return None
        name, _, rel = path[len(self.prefix) + 1:].partition("/")
        rel = "/" + rel
        name = unquote(name)
        if not WorkerHTTP.is_score(rel) or name not in self.states.states:
            return None
        api = self.apis.get(name)
        return (api if api is not None else _NotStarted(name)), rel

    def start_state(self, bound: Any) -> None:
        """A started state's queries under these access rules, answering at its URL, and its
        members directory (Quix's assignment callback calls it). Once per start of the state."""
        from grudge_stream.serving.http import mount_core

        core = bound.state.core
        if core is None or bound.name in self.apis:
            return
        url = self.url(bound)
        self.apis[bound.name] = mount_core(core, url, self.access, self.key_partitioner)
        bound.served = True
        log.info("state %s: live reads at %s/v1/score (key_partitioner=%s)", bound.name, url,
                 core.queries.partitioner)

    def close(self) -> None:
        """The port closed and every state's members directory withdrawn (a clean stop)."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()
        for name in list(self.apis):
            api = self.apis.pop(name)
            bound = self.states.states.get(name)
            if bound is not None:
                bound.served = False
            core = api.worker
            if core.membership.directory is not None:
                core.membership.directory.close()
                core.membership.directory = None
