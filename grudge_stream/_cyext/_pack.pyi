from collections.abc import Sequence
from typing import Any

ENVELOPE_MAGIC: bytes
CHUNK_MAGIC: bytes
CHUNK_HEADER_SIZE: int

def pack(kind: int, header: bytes, parts: Sequence[Any], version: int = 1) -> bytes: ...
def encode_chunk(generation: int, index: int, count: int, data: Any) -> bytes: ...
