"""Dead letters: what a record that cannot be applied becomes, cut to fit its topic.

``dead_letter_record`` builds one (the original key and value base64-encoded, cut to the
topic's limit with their length and digest kept); ``reason_class`` sorts its free-text
reason into the classes of the ``grudge_dead_letters_by_reason_total`` metric. Operators
(``grudge_stream.operators.base``), the output publisher and the repartition stage use them.
"""
from __future__ import annotations

import base64
import hashlib

from grudge_stream.operators.records import CutBytes, DeadLetter, OutputRecord, output_id

__all__ = ["DEAD_LETTER_KEY_BYTES", "DEFAULT_DEAD_LETTER_LIMIT", "REASON_CLASSES", "dead_letter_record",
           "reason_class"]

# Kafka's default max.message.bytes (1 MiB + 12) less headroom for the record framing: the
# dead-letter budget when the runtime has not read the topic's own limit.
DEFAULT_DEAD_LETTER_LIMIT = 1_000_000
# Record keys up to this size are kept as the dead letter's Kafka key; longer ones are
# replaced by their SHA-256 (the full key, cut to fit, stays in the body).
DEAD_LETTER_KEY_BYTES = 1024
_REASON_CHARS = 2000


def _cut_field(data: bytes | None, budget_chars: int) -> tuple[CutBytes, int]:
    """A dead-letter field for ``data``: base64 of as much as ``budget_chars`` allows, with the
    full length and SHA-256 whenever it had to be cut. Returns (field, chars used)."""
    if data is None:
        return CutBytes(None), 4
    full = -(-len(data) // 3) * 4
    if full <= budget_chars:
        return CutBytes(base64.b64encode(data).decode("ascii")), full + 8
    keep = max(0, budget_chars // 4 * 3)
    return (CutBytes(base64.b64encode(data[:keep]).decode("ascii"), len(data), hashlib.sha256(data).hexdigest()),
            keep // 3 * 4 + 140)


def dead_letter_record(operator_id: str, reason: str, source: dict | None, key: bytes | None,
                       value: bytes | None, limit: int = DEFAULT_DEAD_LETTER_LIMIT,
                       extra: dict | None = None) -> OutputRecord:
    """A dead letter that fits in ``limit`` bytes (Kafka key + value).

    The original key and value travel base64-encoded as ``key_b64`` / ``value_b64``; a
    field that does not fit is cut, and ``key_bytes``/``key_sha256`` (``value_...``) keep
    its length and digest so the original can be matched on the source topic at
    ``source.partition`` / ``source.offset``.

    ``id`` is the output id (docs/runtime.md, "Output ids") of the source record's dead
    letter; without a source (an output that could not be delivered) it is a digest of the
    operator and the output's key and value, so a re-sent copy gets the same id.
    """
    reason = reason if len(reason) <= _REASON_CHARS else reason[:_REASON_CHARS] + "..."
    rkey = key
    if key is not None and len(key) > DEAD_LETTER_KEY_BYTES:
        rkey = b"sha256:" + hashlib.sha256(key).hexdigest().encode()
    if source is not None and "partition" in source and "offset" in source:
        oid = output_id(operator_id, source["partition"], source["offset"], "dead_letter", key or b"")
    else:
        digest = hashlib.sha256(b"%d:%s%s" % (len(key or b""), key or b"", value or b"")).digest()
        oid = output_id(operator_id, -1, -1, "undeliverable", digest)
    head = DeadLetter(oid, reason, operator_id, source, extra)
    fixed = len(head.to_bytes()) + (len(rkey) if rkey else 0) + 400
    room = max(0, limit - fixed)
    kf, used = _cut_field(key, room if value is None else max(room // 2, room - (-(-len(value) // 3) * 4)))
    vf, _ = _cut_field(value, room - used)
    return head._replace(key=kf, value=vf).output(rkey)


# The classes of grudge_dead_letters_by_reason_total (a dead letter's own reason is free text).
REASON_CLASSES = ("late", "future", "time", "key", "value", "other")


def reason_class(reason: str) -> str:
    """A dead letter's reason, as one of ``REASON_CLASSES``: ``late`` / ``future`` (event time
    out of bounds), ``time`` (a bad time field), ``key`` (missing, empty or too long), ``value``
    (an unreadable payload or value field), ``other``."""
    r = reason.lower()
    if "behind the" in r:
        return "late"
    if "ahead of processing" in r:
        return "future"
    if "time field" in r or "timestamp" in r:
        return "time"
    if "key" in r:
        return "key"
    if "value" in r or "json" in r or "field" in r or "outcome" in r or "utf-8" in r:
        return "value"
    return "other"
