"""The live batch worker moved to ``grudge_stream.runtime.batch``; this name stays for imports."""
from grudge_stream.runtime.batch import BatchWorker, log, run_batch_worker  # noqa: F401

__all__ = ["BatchWorker", "run_batch_worker"]
