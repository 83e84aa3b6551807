"""The Faust runtime, now ``grudge_stream.runtime.faust`` (``grudge_stream.faust.app`` re-exports it)."""
