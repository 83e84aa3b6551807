"""examples/faust_app/app.py, except that its first Table recovery that has changelog
records to read never gets them: the changelog partitions it resumes stay paused, as if
their fetches never delivered. Run as a subprocess by test_embedded_faust.py (not
collected); ``GRUDGE_TEST_STALL_S`` sets the app's ``recovery_stall_s``."""
from __future__ import annotations

import logging
import os
import runpy
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "faust_app" / "app.py"


def withhold_first_recovery() -> None:
    from faust.transport.consumer import Consumer

    import grudge_stream.runtime.faust.states as binding

    binding.RECOVERY_STALL_S = float(os.environ.get("GRUDGE_TEST_STALL_S", "4"))
    resume = Consumer.resume_partitions
    left = [1]

    def resume_partitions(self, tps):
        tps = set(tps)
        changelogs = {tp for tp in tps if tp.topic.endswith("-changelog")}
        recovery = self.app.tables.recovery
        if left[0] and changelogs and recovery.in_recovery and recovery.need_recovery():
            left[0] -= 1
            logging.getLogger("stall-test").warning("withheld changelog partitions %s from the recovery",
                                                    sorted(f"{tp.topic}[{tp.partition}]" for tp in changelogs))
            tps -= changelogs
        return resume(self, tps)

    Consumer.resume_partitions = resume_partitions


if __name__ == "__main__":
    withhold_first_recovery()
    runpy.run_path(str(EXAMPLE), run_name="__main__")
