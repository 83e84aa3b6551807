"""The Faust runtime of grudge-stream, in five modules:

- ``worker``: ``build_app`` and ``FaustRuntime``, a topology run as a Faust app
  (``grudge-stream worker`` with ``runtime=faust``);
- ``states``: ``FaustStates``, ``attach`` and ``serve``, sketch states embedded in a
  user's own Faust app (``grudge_stream.faust``);
- ``web``: ``StatesWeb``, the embedded states' live reads on the app's web server;
- ``watchers``: threads that watch the consumer's group coordination and Table recovery;
- ``consumer``: the consumers (``CheckpointedConsumer``, ``EmbeddedStateConsumer``), the
  fetch guard, and every use of Faust's and aiokafka's private API.

Re-exported here: the names the CLI, ``grudge_stream.faust`` and users import.
"""
from __future__ import annotations

from grudge_stream.runtime.faust.states import FaustStates, attach, serve
from grudge_stream.runtime.faust.web import StatesWeb
from grudge_stream.runtime.faust.worker import FaustRuntime, build_app

__all__ = ["build_app", "FaustRuntime", "FaustStates", "StatesWeb", "attach", "serve"]
