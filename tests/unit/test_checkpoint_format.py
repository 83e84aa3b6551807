"""The records of the snapshot topic (grudge_stream.checkpoint.format), without a broker:
keys, chunk headers and manifests as written before the checkpoint package existed, and
every way a damaged one is refused."""
from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from grudge_stream.checkpoint.format import (
    CHUNK_HEADER,
    CHUNK_MAGIC,
    MANIFEST_VERSION,
    Manifest,
    SnapshotRef,
    chunk_key,
    decode_chunk,
    encode_chunk,
    join_chunks,
    manifest_key,
)
from grudge_stream.exceptions import SnapshotError
from grudge_stream.hashing import crc32c

BLOB = b"0123456789"

# Written by grudge_stream/checkpoint.py before the split (the manifest of docs/checkpoints.md):
# a snapshot topic written then must still restore.
MANIFEST_V1 = (
    b'{"current":{"crc":671876766,"fingerprint":"9f1c2a7e01b3d4c5","generation":42,'
    b'"next_offset":918273,"offsets":[1200,1201],"partition_count":8,"size":10,"slot":0,'
    b'"source_topic":"abuse-events","watermark":1764000000000,"written_ms":1764000000123},'
    b'"magic":"grudge-stream-snapshot","operator_id":"abuse-scores","partition":3,'
    b'"previous":{"crc":7,"fingerprint":"9f1c2a7e01b3d4c5","generation":41,"next_offset":null,'
    b'"offsets":[1100],"partition_count":8,"size":3,"slot":1,"source_topic":"abuse-events",'
    b'"watermark":null,"written_ms":1763999990000},"version":1}'
)
# Chunk 1 of 2 of generation 42 (data b"56789"), written by the same code.
CHUNK_1_OF_2 = bytes.fromhex("475244432a000000000000000100000002000000d865b58305000000000000003536373839")

CURRENT = SnapshotRef(generation=42, slot=0, offsets=(1200, 1201), size=10, crc=crc32c(BLOB),
                      next_offset=918273, watermark=1764000000000, fingerprint="9f1c2a7e01b3d4c5",
                      source_topic="abuse-events", partition_count=8, written_ms=1764000000123)
PREVIOUS = SnapshotRef(generation=41, slot=1, offsets=(1100,), size=3, crc=7, next_offset=None,
                       watermark=None, fingerprint="9f1c2a7e01b3d4c5", source_topic="abuse-events",
                       partition_count=8, written_ms=1763999990000)


# -- keys ------------------------------------------------------------------------------------

def test_keys_are_those_on_existing_topics() -> None:
    assert manifest_key("abuse-scores", 3) == b"abuse-scores\x003"
    assert chunk_key("abuse-scores", 3, 1, 2) == b"abuse-scores\x003\x00chunk\x001\x002"
    # Slot and index are part of the key: compaction keeps one record per chunk of each slot.
    keys = {chunk_key("op", 0, s, i) for s in (0, 1) for i in range(3)} | {manifest_key("op", 0)}
    assert len(keys) == 7


# -- manifests -------------------------------------------------------------------------------

def test_a_manifest_written_before_decodes() -> None:
    m = Manifest.decode(MANIFEST_V1, offset=17)
    assert (m.operator_id, m.partition, m.offset) == ("abuse-scores", 3, 17)
    assert m.current == CURRENT and m.previous == PREVIOUS


def test_manifest_encoding_is_unchanged_and_round_trips() -> None:
    m = Manifest("abuse-scores", 3, CURRENT, PREVIOUS)
    assert m.encode() == MANIFEST_V1
    again = Manifest.decode(m.encode())
    assert again == m and again.offset == -1
    first = Manifest("op", 0, PREVIOUS, None)
    assert Manifest.decode(first.encode()) == first


@pytest.mark.parametrize("value, why", [
    (None, "malformed"),  # a tombstone
    (b"", "malformed"),
    (b"\xff\xfe", "malformed"),  # not UTF-8
    (b"[]", "not a snapshot manifest"),
    (b'"grudge-stream-snapshot"', "not a snapshot manifest"),
    (b"null", "not a snapshot manifest"),
    (b"7", "not a snapshot manifest"),
    (b'{"version":1}', "not a snapshot manifest"),
])
def test_what_is_not_a_manifest_is_refused(value, why: str) -> None:
    with pytest.raises(SnapshotError, match=why):
        Manifest.decode(value)


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_other_manifest_versions_are_refused(version) -> None:
    body = dict(json.loads(MANIFEST_V1), version=version)
    with pytest.raises(SnapshotError, match=f"version {version} is not supported"):
        Manifest.decode(json.dumps(body).encode())
    assert MANIFEST_VERSION == 1


@pytest.mark.parametrize("change", [
    {"current": None}, {"current": []}, {"operator_id": None, "partition": "three"},
    {"current": {**json.loads(MANIFEST_V1)["current"], "offsets": "12"}},  # would read as (1, 2)
    {"current": {**json.loads(MANIFEST_V1)["current"], "offsets": 1200}},
    {"previous": {"generation": 41}},
])
def test_malformed_manifests_are_refused(change: dict) -> None:
    body = {**json.loads(MANIFEST_V1), **change}
    with pytest.raises(SnapshotError, match="malformed"):
        Manifest.decode(json.dumps(body).encode())


@pytest.mark.parametrize("field", ["operator_id", "partition", "current", "previous"])
def test_a_manifest_missing_a_field_is_refused(field: str) -> None:
    body = json.loads(MANIFEST_V1)
    del body[field]
    with pytest.raises(SnapshotError, match="malformed"):
        Manifest.decode(json.dumps(body).encode())


def test_every_truncation_of_a_manifest_is_refused() -> None:
    for n in range(len(MANIFEST_V1)):
        with pytest.raises(SnapshotError):
            Manifest.decode(MANIFEST_V1[:n])


# -- chunks ----------------------------------------------------------------------------------

def test_chunk_header_layout_is_unchanged() -> None:
    value = encode_chunk(42, 1, 2, memoryview(BLOB)[5:])
    assert value == CHUNK_1_OF_2
    assert CHUNK_HEADER.size == 32
    # The table of docs/checkpoints.md: magic, generation u64, index, count, CRC-32C, length, reserved.
    assert value[0:4] == CHUNK_MAGIC == b"GRDC"
    assert struct.unpack_from("<QIIIII", value, 4) == (42, 1, 2, crc32c(b"56789"), 5, 0)
    assert value[32:] == b"56789"


def test_a_chunk_written_before_decodes() -> None:
    assert decode_chunk(CHUNK_1_OF_2, CURRENT, 1) == b"56789"
    assert decode_chunk(encode_chunk(42, 0, 2, BLOB[:5]), CURRENT, 0) == b"01234"
    assert decode_chunk(encode_chunk(42, 0, 2, b""), CURRENT, 0) == b""


def _with(value: bytes, fmt: str, at: int, field_value) -> bytes:
    out = bytearray(value)
    struct.pack_into(fmt, out, at, field_value)
    return bytes(out)


@pytest.mark.parametrize("value, why", [
    (None, "chunk 1 of generation 42 is truncated"),
    (b"", "is truncated"),
    (CHUNK_1_OF_2[:31], "is truncated"),  # one byte short of a header
    (b"GRDX" + CHUNK_1_OF_2[4:], "is not a snapshot chunk"),
    (_with(CHUNK_1_OF_2, "<Q", 4, 41), r"another snapshot generation \(41, chunk 1 of 2\)"),
    (_with(CHUNK_1_OF_2, "<I", 12, 0), r"another snapshot generation \(42, chunk 0 of 2\)"),
    (_with(CHUNK_1_OF_2, "<I", 16, 3), r"another snapshot generation \(42, chunk 1 of 3\)"),
    (CHUNK_1_OF_2[:-1], "holds 4 bytes, its header says 5"),  # data cut short
    (CHUNK_1_OF_2 + b"!", "holds 6 bytes, its header says 5"),
    (CHUNK_1_OF_2[:-1] + b"!", "fails its CRC-32C check"),
    (_with(CHUNK_1_OF_2, "<I", 20, 0), "fails its CRC-32C check"),
])
def test_damaged_chunks_are_refused(value, why: str) -> None:
    with pytest.raises(SnapshotError, match=why):
        decode_chunk(value, CURRENT, 1)


def test_a_chunk_read_for_another_index_or_generation_is_refused() -> None:
    with pytest.raises(SnapshotError, match="another snapshot generation"):
        decode_chunk(CHUNK_1_OF_2, CURRENT, 0)
    with pytest.raises(SnapshotError, match="another snapshot generation"):
        decode_chunk(CHUNK_1_OF_2, PREVIOUS, 1)


def test_every_truncation_of_a_chunk_is_refused() -> None:
    for n in range(len(CHUNK_1_OF_2)):
        with pytest.raises(SnapshotError):
            decode_chunk(CHUNK_1_OF_2[:n], CURRENT, 1)


def test_the_reserved_field_is_not_read() -> None:
    """The chunk header has no version: a layout change is a new manifest version, and the
    reserved field (written 0) is ignored on read."""
    assert decode_chunk(_with(CHUNK_1_OF_2, "<I", 28, 0xFFFFFFFF), CURRENT, 1) == b"56789"


# -- a whole generation ----------------------------------------------------------------------

def test_chunks_join_into_the_blob_the_manifest_describes() -> None:
    assert join_chunks([b"01234", b"56789"], CURRENT) == BLOB


@pytest.mark.parametrize("parts, why", [
    ([b"01234", None], "are missing"),
    ([None, None], "are missing"),
    ([b"0123456789"], "are missing"),  # fewer parts than the manifest names
    ([b"01234", b"5678"], "fails its size/CRC-32C check"),
    ([b"01234", b"56788"], "fails its size/CRC-32C check"),
    ([b"56789", b"01234"], "fails its size/CRC-32C check"),  # out of order
])
def test_a_generation_that_does_not_add_up_is_refused(parts, why: str) -> None:
    with pytest.raises(SnapshotError, match=why):
        join_chunks(parts, CURRENT)


# -- the package face ------------------------------------------------------------------------

def test_the_package_face() -> None:
    import grudge_stream.checkpoint as checkpoint
    from grudge_stream.checkpoint import format, store

    assert set(checkpoint.__all__) <= set(dir(checkpoint))
    assert all(hasattr(checkpoint, n) for n in checkpoint.__all__)
    assert checkpoint.Manifest is format.Manifest is store.Manifest
    assert checkpoint.CheckpointStore is store.CheckpointStore
    assert checkpoint.CHUNK_HEADER is format.CHUNK_HEADER
    with pytest.raises(AttributeError):
        checkpoint.NoSuchName  # noqa: B018
    with pytest.raises(AttributeError):
        checkpoint._RETRIABLE  # noqa: B018 - private names live in their module only


def test_the_format_loads_no_kafka_client() -> None:
    code = ("import sys\nimport grudge_stream.checkpoint.format\nimport grudge_stream.checkpoint\n"
            "print('confluent_kafka' in sys.modules)\n"
            "from grudge_stream.checkpoint import CheckpointStore\n"
            "print('confluent_kafka' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_the_writing_deployment_rides_along_and_older_manifests_still_read() -> None:
    from dataclasses import replace

    ref = replace(CURRENT, app_id="grudge-abuse-events")
    m = Manifest("abuse-scores", 3, ref, PREVIOUS)
    body = json.loads(m.encode())
    assert body["current"]["app_id"] == "grudge-abuse-events" and "app_id" not in body["previous"]
    assert Manifest.decode(m.encode()).current.app_id == "grudge-abuse-events"
    assert Manifest.decode(MANIFEST_V1).current.app_id == ""  # written before the field
