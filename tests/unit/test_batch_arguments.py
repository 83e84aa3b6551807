"""One batch-argument contract for every sketch and hash64_many (docs/hashing.md, "Batch
arguments"): the same key and time forms are accepted, read alike, and refused alike,
and a refused argument leaves the sketch unchanged."""

from __future__ import annotations

import array
import math
from collections import deque
from typing import Any, Callable

import numpy as np
import pytest

from grudge_stream import DecayingCountMin, ForgettingBloom, Rotator, ScoreSketch
from grudge_stream.exceptions import InvalidInputError
from grudge_stream.hashing import hash64_many
from grudge_stream.sketches import NoDecay

SEED = 99
KEYS = [b"%06d" % i for i in range(40)] + [b"k\x00", b"k"]  # a trailing NUL must count
ROWS_KEYS = [b"%06d" % i for i in range(40)]


class Batcher:
    """One sketch behind a uniform face: ``write(keys, now_ms)``, ``read(keys, now_ms)``,
    ``state()`` (its bytes) and ``hashes(keys)`` (its pre-hashed form)."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "score":
            self.s: Any = ScoreSketch(levels=3, cells_per_level=512, decay=NoDecay(),
                                      hi=1e9, seed=SEED, hasher="siphash")
        elif name == "rotator":
            self.s = Rotator(generations=2, period_ms=10**9, levels=3, cells_per_level=512,
                             decay=NoDecay(), hi=1e9, seed=SEED, hasher="siphash")
        elif name == "countmin":
            self.s = DecayingCountMin(depth=3, width=512, epoch_ms=1000, seed=SEED,
                                      hasher="siphash")
        else:
            self.s = ForgettingBloom(capacity=1000, fp_rate=0.01, period_ms=10**9,
                                     seed=SEED, hasher="siphash")

    def write(self, keys: Any, now_ms: Any = 5) -> None:
        if self.name in ("score", "rotator"):
            self.s.update_many(keys, 1.0, now_ms=now_ms)
        elif self.name == "countmin":
            self.s.increment_many(keys, now_ms=now_ms)
        else:
            self.s.add_many(keys, now_ms=now_ms)

    def read(self, keys: Any, now_ms: Any = 5) -> list:
        if self.name in ("score", "rotator"):
            return self.s.query_many(keys, now_ms=now_ms).tolist()
        if self.name == "countmin":
            return self.s.query_many(keys, now_ms=now_ms).tolist()
        return self.s.contains_many(keys, now_ms=now_ms).tolist()

    def state(self) -> bytes:
        return self.s.to_bytes()

    def hashes(self, keys: list) -> np.ndarray:
        if self.name in ("score", "rotator"):
            return self.s.key_hashes(keys)
        return hash64_many(keys, SEED, "siphash")


NAMES = ["score", "rotator", "countmin", "bloom"]


def _rows(keys: list) -> np.ndarray:
    return np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), -1)


ACCEPTED: dict[str, Callable[[Batcher], Any]] = {
    "list": lambda b: list(KEYS),
    "tuple": lambda b: tuple(KEYS),
    "generator": lambda b: (k for k in KEYS),
    "deque": lambda b: deque(KEYS),
    "object array": lambda b: np.array(KEYS, dtype=object),
    "str and bytearray": lambda b: [k.decode() if i % 2 else bytearray(k) for i, k in enumerate(KEYS)],
    "uint64 hashes": lambda b: b.hashes(KEYS),
    "read-only uint64": lambda b: _read_only(b.hashes(KEYS)),
    "big-endian uint64": lambda b: b.hashes(KEYS).astype(">u8"),
    "strided uint64": lambda b: np.repeat(b.hashes(KEYS), 2)[::2],
    "array.array('Q')": lambda b: array.array("Q", b.hashes(KEYS).tolist()),
    "memoryview of uint64": lambda b: memoryview(b.hashes(KEYS)),
}


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", sorted(ACCEPTED))
def test_every_key_form_is_read_as_the_list_of_keys(name: str, form: str) -> None:
    ref, got = Batcher(name), Batcher(name)
    ref.write(list(KEYS))
    got.write(ACCEPTED[form](got))
    assert got.state() == ref.state()
    assert got.read(ACCEPTED[form](got)) == ref.read(list(KEYS))


def test_top_k_keeps_each_key_form_as_given() -> None:
    got = {}
    for form, keys in (("list", [b"hot"] * 9 + [b"cold"]), ("str", ["hot"] * 9 + ["cold"]),
                       ("rows", _rows([b"hot"] * 9 + [b"olc"])),
                       ("hashes", hash64_many([b"hot"] * 9, SEED, "siphash"))):
        c = DecayingCountMin(depth=3, width=512, epoch_ms=None, seed=SEED, hasher="siphash", top_k=2)
        c.increment_many(keys)
        got[form] = c.top(1)[0]
    assert got == {"list": (b"hot", 9), "str": ("hot", 9), "rows": (b"hot", 9),
                   "hashes": (int(hash64_many([b"hot"], SEED, "siphash")[0]), 9)}


@pytest.mark.parametrize("name", NAMES)
def test_rows_are_the_same_keys_as_bytes(name: str) -> None:
    ref, got = Batcher(name), Batcher(name)
    ref.write(list(ROWS_KEYS))
    got.write(_rows(ROWS_KEYS))
    assert got.state() == ref.state()
    got.write(_rows(ROWS_KEYS)[::2])  # a strided view is copied, not misread
    ref.write(ROWS_KEYS[::2])
    assert got.state() == ref.state()


REFUSED: dict[str, Callable[[Batcher], Any]] = {
    "one bytes key": lambda b: b"abc",
    "one str key": lambda b: "abc",
    "one bytearray key": lambda b: bytearray(b"abc"),
    "int64 array": lambda b: b.hashes(KEYS).view(np.int64),
    "np.arange ids": lambda b: np.arange(10),
    "int32 array": lambda b: np.arange(10, dtype=np.int32),
    "uint32 array": lambda b: np.arange(10, dtype=np.uint32),
    "float array": lambda b: np.arange(10, dtype=np.float64),
    "numpy S array": lambda b: np.array(KEYS),
    "numpy U array": lambda b: np.array([k.decode() for k in KEYS]),
    "1-D uint8": lambda b: np.zeros(8, dtype=np.uint8),
    "3-D uint8": lambda b: np.zeros((2, 2, 2), dtype=np.uint8),
    "array.array('q')": lambda b: array.array("q", [1, 2, 3]),
    "an int among keys": lambda b: [b"a", 3, b"b"],
    "None among keys": lambda b: [b"a", None],
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", sorted(REFUSED))
def test_every_refused_key_form_raises_type_error_and_touches_nothing(name: str, form: str) -> None:
    b = Batcher(name)
    b.write(list(KEYS))
    before = b.state()
    with pytest.raises(TypeError):
        b.write(REFUSED[form](b))
    with pytest.raises(TypeError):
        b.read(REFUSED[form](b))
    assert b.state() == before


@pytest.mark.parametrize("form", sorted(set(ACCEPTED) - {"uint64 hashes", "read-only uint64",
                                                          "big-endian uint64", "strided uint64",
                                                          "array.array('Q')", "memoryview of uint64"}))
def test_hash64_many_reads_the_same_key_forms(form: str) -> None:
    want = hash64_many(list(KEYS), SEED, "siphash")
    assert hash64_many(ACCEPTED[form](Batcher("bloom")), SEED, "siphash").tolist() == want.tolist()
    assert (hash64_many(_rows(ROWS_KEYS), SEED, "siphash").tolist()
            == hash64_many(ROWS_KEYS, SEED, "siphash").tolist())


@pytest.mark.parametrize("form", sorted(REFUSED) + ["uint64 hashes"])
def test_hash64_many_refuses_what_the_sketches_refuse_and_hashes(form: str) -> None:
    make = REFUSED.get(form) or ACCEPTED[form]
    with pytest.raises(TypeError):
        hash64_many(make(Batcher("bloom")), SEED, "siphash")


# ---- times -----------------------------------------------------------------------------

N = len(KEYS)
BASE = 1_000_000


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "times",
    [
        pytest.param(lambda t: t.tolist(), id="list of ints"),
        pytest.param(lambda t: tuple(t.tolist()), id="tuple"),
        pytest.param(lambda t: t.astype(np.int32), id="int32"),
        pytest.param(lambda t: t.astype(np.uint64), id="uint64"),
        pytest.param(lambda t: t.astype(np.float64) + 0.75, id="floats truncated"),
        pytest.param(lambda t: np.array(t.tolist(), dtype=object), id="object array"),
        pytest.param(lambda t: [np.int64(v) if i % 2 else float(v) for i, v in enumerate(t)],
                     id="mixed scalars"),
    ],
)
def test_every_time_form_is_read_as_the_int64_array(name: str, times: Callable) -> None:
    t = BASE + np.arange(N, dtype=np.int64) * 7
    ref, got = Batcher(name), Batcher(name)
    ref.write(list(KEYS), now_ms=t)
    got.write(list(KEYS), now_ms=times(t))
    assert got.state() == ref.state()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("one", [BASE, np.int64(BASE), np.uint32(BASE), BASE + 0.9,
                                 np.array(BASE)], ids=repr)
def test_one_time_in_every_form(name: str, one: Any) -> None:
    ref, got = Batcher(name), Batcher(name)
    ref.write(list(KEYS), now_ms=BASE)
    got.write(list(KEYS), now_ms=one)
    assert got.state() == ref.state()


TIME_REFUSED = [
    (TypeError, True),
    (TypeError, "5"),
    (TypeError, b"5"),
    (TypeError, [True] * N),
    (TypeError, ["5"] * N),
    (TypeError, np.array(["5"] * N)),
    (InvalidInputError, math.nan),
    (InvalidInputError, -math.inf),
    (InvalidInputError, 2**63),
    (InvalidInputError, [BASE] * (N - 1)),
    (InvalidInputError, np.full((N, 1), BASE)),
    (InvalidInputError, [BASE] * (N - 1) + [math.nan]),
    (InvalidInputError, np.full(N, 2**63, dtype=np.uint64)),
    (InvalidInputError, np.full(N, 1e19)),
    (InvalidInputError, [BASE] * (N - 1) + [2**64]),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("exc,bad", TIME_REFUSED, ids=[repr(b)[:30] for _, b in TIME_REFUSED])
def test_every_refused_time_raises_the_same_error_and_touches_nothing(
    name: str, exc: type, bad: Any
) -> None:
    b = Batcher(name)
    b.write(list(KEYS), now_ms=BASE)
    before = b.state()
    with pytest.raises(exc):
        b.write(list(KEYS), now_ms=bad)
    assert b.state() == before


def test_the_never_stamped_mark_is_refused_by_the_score_kernels_only() -> None:
    for name in ("score", "rotator"):
        b = Batcher(name)
        with pytest.raises(InvalidInputError, match="never-stamped"):
            b.write(list(KEYS), now_ms=[-(2**63)] * N)
    c = Batcher("countmin")
    c.write(list(KEYS), now_ms=-(2**63))  # a legal event time there (epoch floor(-2**63 / 1000))
