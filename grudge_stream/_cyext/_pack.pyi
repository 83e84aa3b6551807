from collections.abc import Sequence
from typing import Any

ENVELOPE_MAGIC: bytes
CHUNK_MAGIC: bytes
CHUNK_HEADER_SIZE: int

class Envelope:
    kind: int
    version: int
    header: bytes
    parts: tuple[Any, ...]
    nbytes: int
    def __init__(self, kind: int, header: bytes, parts: Sequence[Any], version: int = 1) -> None: ...
    def __len__(self) -> int: ...

def build(env: Envelope) -> bytes: ...
def pack(kind: int, header: bytes, parts: Sequence[Any], version: int = 1) -> bytes: ...
def encode_chunk(generation: int, index: int, count: int, data: Any) -> bytes: ...
