"""Live score queries: any worker answers ``GET /v1/score?key=K`` from the owning partition's state.

Runtime-neutral; both runtimes add thin HTTP hooks (docs/runtime.md, "Live score queries").
One module per part: ``partitioner`` (which partition a key is in), ``members`` (the
members directory), ``peers`` (kept connections for forwards), ``queries`` (parsing,
routing, answering) and ``gate`` (queries ahead of the batch consume loop).

- **The owner.** A key's partition is the one its producers wrote it to: the Kafka default
  partitioner (``murmur2``: Java clients, Kafka Streams, Faust/aiokafka, confluent-kafka
  with ``partitioner=murmur2_random``) or librdkafka's default (``crc32``:
  ``consistent_random``), setting ``key_partitioner``. A partition computed with the wrong
  one names another partition, whose sketch has never seen the key: the answer would be a
  confident zero. That is why the setting is explicit and documented, not guessed.
- **Answering locally.** A worker that holds the partition restored reads the operator's
  ``describe_key`` (read-only: nothing written, the state stays bit-identical to a replay)
  under the slot's lock, so a batch never runs halfway through a read.
- **Forwarding.** Otherwise the worker looks the partition up in the members directory and
  forwards the request once, marked with the ``X-Grudge-Forwarded`` header; a marked
  request is never forwarded again. The owner recomputes the partition from the key itself,
  so a stale directory can only cost a 503, never another partition's state.
- **The members directory** is a compacted topic ``<app_id>-members``: each worker
  publishes, on every assignment change, a record keyed by its member id with its
  advertised URL and the partitions it holds restored, and a tombstone on a clean
  shutdown. Every worker follows the whole topic in a background thread (manual
  assignment, no group, no commits). When two records claim a partition (a rebalance
  in flight, a killed worker's last record) the newest wins; a wrong pick answers 503.
- **Failure is explicit.** Every way a query cannot be answered is a 503 with a JSON
  ``error`` (``not_owner``, ``owner_unknown``, ``owner_unreachable``, ``not_ready``) and
  a ``Retry-After``: during a rebalance a query answers or fails clearly.
"""
from __future__ import annotations

from grudge_stream.serving.gate import QueryGate
from grudge_stream.serving.members import (
    MEMBERS_KIND, MEMBERS_TOPIC_CONFIG, MembersDirectory, advertised_url, read_watermarks,
)
from grudge_stream.serving.partitioner import PARTITIONERS, PartitionerCheck, murmur2, partition_for
from grudge_stream.serving.peers import PeerConnections
from grudge_stream.serving.queries import (
    FORWARD_TIMEOUT_S, FORWARDED_HEADER, LOOP_SLICE, MAX_KEYS, RETRY_AFTER_S, QueryError, ScoreQueries, key_fields,
    parse_body, parse_query,
)

__all__ = ["FORWARD_TIMEOUT_S", "FORWARDED_HEADER", "LOOP_SLICE", "MAX_KEYS", "MEMBERS_KIND", "MEMBERS_TOPIC_CONFIG",
           "PARTITIONERS", "RETRY_AFTER_S", "MembersDirectory", "PartitionerCheck", "PeerConnections", "QueryError",
           "QueryGate", "ScoreQueries", "advertised_url", "key_fields", "murmur2", "parse_body", "parse_query",
           "partition_for", "read_watermarks"]
