"""Operator snapshots on a compacted Kafka topic (docs/checkpoints.md).

- ``grudge_stream.checkpoint.store``: the Kafka I/O — ``CheckpointStore`` writes and
  restores snapshots, ``watermarks`` asks a partition for its offsets.

Every name this package had as a single module is still importable from it. The store
(and confluent-kafka with it) loads on first use of one of its names.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from grudge_stream._lazy import lazy_exports

_STORE = "grudge_stream.checkpoint.store"
_LAZY = {name: _STORE for name in (
    "BROKER_ABORT_CHECK_INTERVAL_S", "CHUNK_MAGIC", "CheckpointError", "CheckpointStore", "ConfigError",
    "DEFAULT_CHUNK_BYTES", "DEFAULT_OPEN_TRANSACTION_WAIT_S", "DEFAULT_TRANSACTION_TIMEOUT_S",
    "MANIFEST_MAGIC", "MANIFEST_VERSION", "Manifest", "OPEN_TRANSACTION_MARGIN_S", "RestoreResult",
    "SNAPSHOT_TOPIC_CONFIG", "SnapshotError", "SnapshotRef", "SnapshotWrite", "_CHUNK",
    "_OPEN_TRANSACTION_GRACE_S", "_OPEN_TRANSACTION_PROGRESS_S", "_RETRIABLE", "_chunk_delivered",
    "chunk_key", "crc32c", "log", "manifest_key", "watermarks",
)}

if TYPE_CHECKING:
    from grudge_stream.checkpoint.store import (
        _CHUNK, _OPEN_TRANSACTION_GRACE_S, _OPEN_TRANSACTION_PROGRESS_S, _RETRIABLE,
        BROKER_ABORT_CHECK_INTERVAL_S, CHUNK_MAGIC, DEFAULT_CHUNK_BYTES, DEFAULT_OPEN_TRANSACTION_WAIT_S,
        DEFAULT_TRANSACTION_TIMEOUT_S, MANIFEST_MAGIC, MANIFEST_VERSION, OPEN_TRANSACTION_MARGIN_S,
        SNAPSHOT_TOPIC_CONFIG, CheckpointError, CheckpointStore, ConfigError, Manifest, RestoreResult,
        SnapshotError, SnapshotRef, SnapshotWrite, _chunk_delivered, chunk_key, crc32c, log, manifest_key,
        watermarks,
    )

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [
    "BROKER_ABORT_CHECK_INTERVAL_S", "CHUNK_MAGIC", "DEFAULT_CHUNK_BYTES", "DEFAULT_OPEN_TRANSACTION_WAIT_S",
    "DEFAULT_TRANSACTION_TIMEOUT_S", "MANIFEST_MAGIC", "MANIFEST_VERSION", "OPEN_TRANSACTION_MARGIN_S",
    "SNAPSHOT_TOPIC_CONFIG", "CheckpointStore", "Manifest", "RestoreResult", "SnapshotRef", "SnapshotWrite",
    "chunk_key", "manifest_key", "watermarks",
]
