"""``grudge-stream worker`` whose operator snapshots block while a flag file exists.

Not a test module (pytest does not collect it); test_deploy.py runs it as a subprocess:
``python wedge_worker.py FLAG_FILE worker abuse_scores ...``. Creating the flag wedges the
next checkpoint round (in the batch runtime's main loop; in the Faust runtime's executor
thread, with the runtime's lock held, so the fetch loop stops at its next batch) while the
HTTP server keeps answering — the state the issue describes: ``/metrics`` and ``/ready`` answer
200 while nothing is processed. ``/live`` must turn 503; removing the flag un-wedges it.
"""
from __future__ import annotations

import os
import sys
import time


def main() -> int:
    flag = sys.argv[1]
    from grudge_stream.operators.scores import FeedbackScoreOperator

    original = FeedbackScoreOperator.snapshot

    def snapshot(self) -> bytes:
        while os.path.exists(flag):
            time.sleep(0.05)
        return original(self)

    FeedbackScoreOperator.snapshot = snapshot  # type: ignore[method-assign]
    from grudge_stream.cli import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
