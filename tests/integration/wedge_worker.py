"""``grudge-stream worker`` whose processing stops while a flag file exists.

Not a test module (pytest does not collect it); test_deploy.py runs it as a subprocess:
``python wedge_worker.py FLAG_FILE worker abuse_scores ...``. Creating the flag wedges the
worker while its HTTP server keeps answering — the state the issue describes: ``/metrics``
and ``/ready`` answer 200 while nothing is processed. ``/live`` must turn 503; removing the
flag un-wedges it.

- Batch runtime: the next snapshot's copy of the state blocks (taken on the main loop at a
  batch boundary; the HTTP server runs in threads of its own).
- Faust runtime: the step after each batch waits, holding the runtime's lock, so the next
  batch never runs while the event loop (and its web server) goes on.
"""
from __future__ import annotations

import asyncio
import os
import sys
import time


def main() -> int:
    flag = sys.argv[1]
    from grudge_stream.operators.scores import FeedbackScoreOperator
    from grudge_stream.runtime.faust.worker import FaustRuntime

    original = FeedbackScoreOperator.snapshot_taken

    def snapshot_taken(self):
        while os.path.exists(flag):
            time.sleep(0.05)
        return original(self)

    FeedbackScoreOperator.snapshot_taken = snapshot_taken  # type: ignore[method-assign]

    after_batch = FaustRuntime._checkpoint_if_due

    async def checkpoint_if_due(self) -> None:
        while os.path.exists(flag):
            await asyncio.sleep(0.05)
        await after_batch(self)

    FaustRuntime._checkpoint_if_due = checkpoint_if_due  # type: ignore[method-assign]
    from grudge_stream.cli import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
