"""Signed members records and override entries, without a broker: a forged, unsigned,
re-signed-under-another-key or replayed entry is ignored and counted; a signed one applies,
its ``by`` is the signer's key name, and a signed clear removes an entry."""
from __future__ import annotations

import json

import pytest

from grudge_stream.exceptions import ConfigError
from grudge_stream.overrides import OverrideTable, encode_override
from grudge_stream.serving import MembersDirectory
from grudge_stream.signing import SigningKeys

OPS = SigningKeys.parse("alice:" + "a" * 40 + "\nworkers:" + "w" * 40 + "\n", "t")
MALLORY = SigningKeys.parse("alice:" + "m" * 40 + "\n", "t")  # alice's name, another secret


def test_key_files_are_checked() -> None:
    assert OPS.signer == "alice"
    for bad in ("", "alice:short\n", "nocolon" + "x" * 40 + "\n", f"a:{'x' * 40}\na:{'y' * 40}\n"):
        with pytest.raises(ConfigError):
            SigningKeys.parse(bad, "t")


def test_overrides_apply_only_when_signed() -> None:
    rejected = []
    table = OverrideTable(OPS, on_reject=lambda: rejected.append(1))
    t = 1_700_000_000_000
    # Unsigned, forged under another secret, moved to another key, tampered: all ignored.
    assert table.apply(b"eve", encode_override("allow", now_ms=t, by="alice")) is None
    assert table.apply(b"eve", encode_override("allow", now_ms=t, key=b"eve", signing=MALLORY)) is None
    assert table.apply(b"eve", encode_override("allow", now_ms=t, key=b"bob", signing=OPS)) is None
    doc = json.loads(encode_override("deny", now_ms=t, key=b"bob", signing=OPS))
    doc["action"] = "allow"
    assert table.apply(b"bob", json.dumps(doc).encode()) is None
    assert table.apply(b"bob", None) is None  # an unsigned tombstone
    assert len(table) == 0 and table.rejected == len(rejected) == 5
    # Signed: applies, by = the signer; a signed clear removes it; the older deny replayed does not.
    deny = encode_override("deny", now_ms=t, reason="ticket 1", by="ignored", key=b"bob", signing=OPS)
    assert table.apply(b"bob", deny) is not None
    assert table.action(b"bob", t + 1) == "deny" and table.get(b"bob").by == "alice"
    assert table.apply(b"bob", encode_override("clear", now_ms=t + 10, key=b"bob", signing=OPS)) is not None
    assert table.get(b"bob") is None
    assert table.apply(b"bob", deny) is None and table.stale == 1 and table.get(b"bob") is None


def test_a_forged_members_record_does_not_redirect() -> None:
    me = MembersDirectory("unused:9092", "app", "me", "http://me:1", signing=OPS)
    owner = MembersDirectory("unused:9092", "app", "owner", "http://owner:1", signing=OPS)
    rec = {"member": "owner", "url": "http://owner:1", "partitions": [2, 3], "partition_count": 4,
           "timestamp_ms": 10}
    me._apply(b"owner", owner._encode(rec))
    assert me.owner(2)["url"] == "http://owner:1"
    forged = {**rec, "member": "evil", "url": "http://evil:1", "timestamp_ms": 99}
    me._apply(b"evil", json.dumps(forged).encode())  # unsigned
    me._apply(b"evil", MembersDirectory("u", "app", "evil", "http://evil:1", signing=MALLORY)._encode(forged))
    me._apply(b"owner", json.dumps({**rec, "url": "http://evil:1", "timestamp_ms": 99}).encode())
    me._apply(b"owner", None)  # an unsigned tombstone
    assert me.owner(2)["url"] == "http://owner:1" and me.owner(3)["url"] == "http://owner:1"
    assert me.rejected == 4
    # The owner's own signed shutdown record (no partitions) does remove it.
    me._apply(b"owner", owner._encode({**rec, "partitions": [], "timestamp_ms": 20}))
    assert me.owner(2) is None


def test_members_watermarks_skip_malformed_records() -> None:
    """The members topic is readable input: malformed watermark fields are skipped, never
    a crash of `grudge-stream alerts`."""
    d = MembersDirectory("127.0.0.1:1", "app", "me", "http://127.0.0.1:1")  # not started
    d.members.update({
        "a": {"partitions": [0, 1], "watermarks": {"0": 1000, "1": "soon"}, "timestamp_ms": 5},
        "b": {"partitions": "0", "watermarks": {"0": 9}, "timestamp_ms": 9},
        "c": {"partitions": [2, True, "x"], "watermarks": ["2"], "timestamp_ms": "late"},
        "d": {"partitions": [0], "watermarks": {"0": 2000}, "timestamp_ms": 7},
    })
    assert d.watermarks() == {0: (2000, 7), 1: (None, 5)}
