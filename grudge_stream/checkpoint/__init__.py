"""Operator snapshots on a compacted Kafka topic (docs/checkpoints.md).

- ``grudge_stream.checkpoint.format``: the records — keys, chunk headers, manifests,
  snapshot refs. Pure, no Kafka client.
- ``grudge_stream.checkpoint.store``: the Kafka I/O — ``CheckpointStore`` writes and
  restores snapshots;
- ``grudge_stream.checkpoint.transactions``: how a restore finds the newest manifest past
  other producers' open transactions (the store's part that waits for them);
- ``grudge_stream.checkpoint.offsets``: ``watermarks`` asks a partition for its offsets.

The store (and confluent-kafka with it) loads on first use of one of its names, so
importing the format alone stays light.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from grudge_stream._lazy import lazy_exports
from grudge_stream.checkpoint.format import (
    CHUNK_HEADER,
    CHUNK_MAGIC,
    DEFAULT_CHUNK_BYTES,
    MANIFEST_MAGIC,
    MANIFEST_VERSION,
    Manifest,
    SnapshotRef,
    chunk_key,
    decode_chunk,
    encode_chunk,
    join_chunks,
    manifest_key,
)

_STORE = "grudge_stream.checkpoint.store"
_TRANSACTIONS = "grudge_stream.checkpoint.transactions"
_LAZY = {
    **{name: _STORE for name in ("SNAPSHOT_TOPIC_CONFIG", "CheckpointStore", "RestoreResult", "SnapshotWrite")},
    **{name: _TRANSACTIONS for name in (
        "BROKER_ABORT_CHECK_INTERVAL_S", "DEFAULT_OPEN_TRANSACTION_WAIT_S", "DEFAULT_TRANSACTION_TIMEOUT_S",
        "OPEN_TRANSACTION_MARGIN_S")},
    "watermarks": "grudge_stream.checkpoint.offsets",
}

if TYPE_CHECKING:
    from grudge_stream.checkpoint.offsets import watermarks
    from grudge_stream.checkpoint.store import SNAPSHOT_TOPIC_CONFIG, CheckpointStore, RestoreResult, SnapshotWrite
    from grudge_stream.checkpoint.transactions import (
        BROKER_ABORT_CHECK_INTERVAL_S,
        DEFAULT_OPEN_TRANSACTION_WAIT_S,
        DEFAULT_TRANSACTION_TIMEOUT_S,
        OPEN_TRANSACTION_MARGIN_S,
    )

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [
    "BROKER_ABORT_CHECK_INTERVAL_S",
    "CHUNK_HEADER",
    "CHUNK_MAGIC",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_OPEN_TRANSACTION_WAIT_S",
    "DEFAULT_TRANSACTION_TIMEOUT_S",
    "MANIFEST_MAGIC",
    "MANIFEST_VERSION",
    "OPEN_TRANSACTION_MARGIN_S",
    "SNAPSHOT_TOPIC_CONFIG",
    "CheckpointStore",
    "Manifest",
    "RestoreResult",
    "SnapshotRef",
    "SnapshotWrite",
    "chunk_key",
    "decode_chunk",
    "encode_chunk",
    "join_chunks",
    "manifest_key",
    "watermarks",
]
