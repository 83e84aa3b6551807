"""The Faust runtime moved to ``grudge_stream.runtime.faust``; this name stays for imports."""
from grudge_stream.runtime.faust import (MAX_POLL_RECORDS, CheckpointedConsumer, FaustRuntime,  # noqa: F401
                                         GrudgeApp, ShortWaitConsumerThread, build_app, log)

__all__ = ["MAX_POLL_RECORDS", "CheckpointedConsumer", "FaustRuntime", "GrudgeApp", "ShortWaitConsumerThread",
           "build_app"]
