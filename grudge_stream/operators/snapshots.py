"""Operator snapshots: the checksummed blob of one operator's state, and its restore.

A snapshot is an envelope (``grudge_stream.envelope``, kind ``operator``) whose header
names the operator, its state-shaping config (``state_config`` and its fingerprint), the
hash key's fingerprint, its topic and partition, its next offset, watermark, counters and
scalars, and lists the named binary sections (sketches, latches) its payload holds.
``take_snapshot`` writes one (``Operator.snapshot_taken``), ``restore_snapshot`` adopts
one after checking it is this very operator's (``Operator.restore``); ``read_snapshot``
validates a blob and ``differences`` names the settings two configs differ in.
"""
from __future__ import annotations

from typing import Any, Callable

from grudge_stream import envelope
from grudge_stream.exceptions import MismatchError, SnapshotError
from grudge_stream.hashkey import key_fingerprint

__all__ = ["SNAPSHOT_VERSION", "differences", "read_snapshot", "restore_snapshot", "take_snapshot"]

SNAPSHOT_VERSION = 1


def take_snapshot(op: Any) -> Callable[[], bytes]:
    """``Operator.snapshot`` of ``op`` in two steps: the state copied now (at a batch
    boundary, on the loop), the blob made by calling the result (off the loop: no later
    processing changes it)."""
    taken = op.state_sections_taken()
    header = {
        "snapshot_version": SNAPSHOT_VERSION,
        "operator_kind": op.kind,
        "operator_id": op.operator_id,
        "fingerprint": op.fingerprint,
        "state_config": op.state_config(),
        "hash_key_fingerprint": key_fingerprint(op.hash_key),
        "source_topic": op.source_topic,
        "partition": op.partition,
        "next_offset": op.next_offset,
        "watermark": op.watermark,
        "counters": dict(op.counters),
        "scalars": {**op.state_scalars(), **{"next_" + n: t for n, t in op.timers.items()}},
    }

    def make() -> bytes:
        sections = [(name, data if isinstance(data, bytes) else data()) for name, data in taken]
        header["sections"] = [[name, len(data)] for name, data in sections]
        # The sections are copied once, straight into the blob, without the GIL (no join first).
        return envelope.pack_parts(envelope.KIND_OPERATOR, header, [d for _, d in sections])
    return make


def restore_snapshot(op: Any, blob: bytes) -> None:
    """``op`` adopts ``blob``, a snapshot of this very operator (same config, topic and
    partition).

    Raises SnapshotError for a corrupt blob and MismatchError for one taken under
    another configuration, topic or partition; the current state is untouched then.
    """
    header, payload = read_snapshot(blob)
    theirs = header.get("hash_key_fingerprint")
    if theirs is not None and theirs != key_fingerprint(op.hash_key):
        raise MismatchError(
            f"snapshot of {header.get('operator_id')!r} was written under another hash key "
            f"(fingerprint {theirs}; this worker's is {key_fingerprint(op.hash_key)}). "
            "Operator action: start the worker with the seed / seed_file that wrote it, or "
            "replay the partition from its earliest retained offset under the new key."
        )
    if header.get("fingerprint") != op.fingerprint:
        theirs_conf = header.get("state_config")
        if isinstance(theirs_conf, dict):
            diff = "; ".join(f"{k}: {a!r} in the snapshot, {b!r} now"
                             for k, a, b in differences(theirs_conf, op.state_config()))
            what = f"settings that shape the state differ ({diff or 'fingerprint'})"
        else:
            what = (f"it was written by an earlier release (config fingerprint "
                    f"{header.get('fingerprint')}, now {op.fingerprint})")
        raise MismatchError(
            f"snapshot of {header.get('operator_id')!r} is foreign: {what}. Operator action: "
            "restart with the settings that wrote it, or set reset_state=true to rebuild the "
            "state by replaying the partition from its earliest retained offset."
        )
    if header.get("source_topic") != op.source_topic or header.get("partition") != op.partition:
        raise MismatchError(
            f"snapshot is of {header.get('source_topic')}[{header.get('partition')}], "
            f"not {op.source_topic}[{op.partition}]"
        )
    sections: dict[str, memoryview] = {}
    pos = 0
    try:
        for name, length in header["sections"]:
            sections[name] = payload[pos:pos + length]
            pos += length
        if pos != len(payload):
            raise SnapshotError("operator snapshot sections do not cover the payload")
        next_offset = header["next_offset"]
        watermark = header["watermark"]
        # Counters a snapshot of an older release lacks start at zero.
        counters = {**{k: 0 for k in op.counters},
                    **{k: int(v) for k, v in header["counters"].items()}}
        timers = {n: None if header["scalars"].get("next_" + n) is None
                  else int(header["scalars"]["next_" + n]) for n in op._timer_intervals}
        op.load_sections(sections, header["scalars"])
        op.timers = timers
    except SnapshotError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"operator snapshot state is invalid: {exc}") from None
    op.next_offset = next_offset
    op.watermark = watermark
    op.counters = counters


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, a's value, b's value) for every leaf where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += differences(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if a == b else [(path or "value", a, b)]


def read_snapshot(blob: bytes) -> tuple[dict, memoryview]:
    """Validate an operator snapshot and return (header, payload)."""
    header, payload = envelope.unpack(blob, envelope.KIND_OPERATOR)
    if header.get("snapshot_version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"operator snapshot version {header.get('snapshot_version')} is not supported")
    for field in ("operator_id", "fingerprint", "source_topic", "partition", "next_offset", "sections"):
        if field not in header:
            raise SnapshotError(f"operator snapshot header lacks {field!r}")
    return header, payload
