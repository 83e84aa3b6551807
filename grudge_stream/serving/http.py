"""The worker's HTTP API, one flow for every runtime: ``/ready``, ``/live``, ``/metrics``,
``/v1/score`` and ``/v1/scores``.

A runtime mounts it on the web server it has and hands it only the transport: the batch
runtime's threaded server calls it from a request thread, the Faust runtime's pages from
its event loop. What a request means, who may ask, how it is routed and answered, what is
counted, lives here once:

- ``health(path)``: the three probes, answered from the worker's own state (never the
  network, never a lock the processing loop holds);
- ``admit(headers, peer)``: the access rules from the headers alone (docs/security.md), so
  an unauthenticated caller never makes a worker read a request body;
- ``score(...)`` (blocking: local reads under each slot's lock, forwards over kept
  connections) or ``score_on_loop(...)`` (an event loop's: local reads in slices of
  ``LOOP_SLICE`` keys between its other tasks, forwards from an executor thread);
- ``answered(answer, t0)``: the query metrics.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from grudge_stream.serving.queries import LOOP_SLICE

__all__ = ["Answer", "WorkerHTTP", "JSON", "METRICS"]

JSON = "application/json"
METRICS = "text/plain; version=0.0.4"


@dataclass(frozen=True)
class Answer:
    """One response: status, body bytes, content type and extra headers."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: Mapping[str, str] = field(default_factory=dict)


def _json(status: int, doc: Any, headers: Mapping[str, str] | None = None) -> Answer:
    return Answer(status, json.dumps(doc).encode(), JSON, headers or {})


class WorkerHTTP:
    """The HTTP API of one worker (a ``WorkerCore``: ``ready_status``, ``liveness``,
    ``metrics``, ``queries``). ``gate``: the batch runtime's ``QueryGate``, held while a
    score request is worked on so it runs ahead of the consume loop; None elsewhere.
    ``ready_status``: what ``/ready`` answers, when the runtime adds to the core's."""

    def __init__(self, worker: Any, gate: Any = None, ready_status: Callable[[], tuple[int, dict]] | None = None
                 ) -> None:
        self.worker = worker
        self.gate = gate
        self._ready_status = ready_status

    def health(self, path: str) -> Answer | None:
        """``/ready``, ``/live`` or ``/metrics``; None for any other path."""
        if path.startswith("/ready"):
            return _json(*(self._ready_status or self.worker.ready_status)())
        if path.startswith("/live"):
            return _json(*self.worker.liveness.status())
        if path.startswith("/metrics"):
            return Answer(200, self.worker.metrics.render(), METRICS)
        return None

    @staticmethod
    def is_score(path: str) -> bool:
        return path.startswith("/v1/score")

    def admit(self, headers: Any, peer: str) -> tuple[str | None, Answer | None]:
        """``(client, None)`` for a caller the access rules let in, else ``(None, refusal)``."""
        client, refusal = self.worker.queries.admit(headers, peer)
        if client is not None:
            return client, None
        return None, _json(*refusal)

    def score(self, method: str, path: str, query: str, body: bytes, headers: Any, peer: str,
              client: str) -> Answer:
        """A score request of an admitted ``client``, blocking (a request thread)."""
        queries = self.worker.queries
        with self.gate.serving() if self.gate is not None else contextlib.nullcontext():
            parsed = queries.prepare(method, path, query, body, headers, peer, client)
            if not isinstance(parsed[0], int):
                parsed = queries.answer(*parsed)
            return _json(*parsed)

    async def score_on_loop(self, method: str, path: str, query: str, body: bytes, headers: Any, peer: str,
                            client: str) -> Answer:
        """The same request from an event loop that also processes records: the forwards go
        out first (from an executor thread); the local reads run on the loop in slices,
        yielding between them, so a 1000-key request never holds the loop (and the records
        waiting on it) for the whole read."""
        queries = self.worker.queries
        parsed = queries.prepare(method, path, query, body, headers, peer, client)
        if isinstance(parsed[0], int):
            return _json(*parsed)
        keys, forward, single = parsed
        results: list = [None] * len(keys)
        local: dict = {}
        remote: dict = {}
        n = queries.route(keys, forward, 0, len(keys), results, local, remote)
        pending = (asyncio.get_running_loop().run_in_executor(None, queries.remote_part, keys, remote)
                   if remote else None)
        for p, idxs in local.items():
            for lo in range(0, len(idxs), LOOP_SLICE):
                queries.read_partition(keys, p, n, idxs[lo:lo + LOOP_SLICE], results)
                await asyncio.sleep(0)
        fwd = await pending if pending is not None else {}
        return _json(*queries.combine(results, fwd, single))

    def answered(self, answer: Answer, t0: float) -> None:
        """Count a score request answered (``t0``: ``time.perf_counter()`` at its arrival)."""
        self.worker.metrics.query_answered(answer.status, time.perf_counter() - t0)


def mount_core(core: Any, url: str, access: Any, key_partitioner: str | None) -> WorkerHTTP:
    """A core's score queries made servable at ``url`` (an embedded state's, by a Faust or
    Quix app's ``serve``): its access rules, its key partitioner (and the check that
    samples it), its members directory record; the HTTP flow that answers them."""
    from grudge_stream.serving.partitioner import PartitionerCheck

    queries = core.queries
    queries.url = url
    queries.access = access
    if key_partitioner is not None and key_partitioner != queries.partitioner:
        queries.partitioner = key_partitioner
        core.partitioner_check = PartitionerCheck(key_partitioner, core.topic, core.metrics)
        queries.partitioner_check = core.partitioner_check
    core.start_members(url)
    return WorkerHTTP(core)
