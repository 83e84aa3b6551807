"""Pinned outputs of every shipped operator over one hostile stream.

Each topology's operator reads the same kind of stream — good and bad payloads, late
and future event times, re-delivered chunks, tick records — once as records and once
as columns, in uneven chunks. The digest of everything it wrote (outputs, counters,
snapshot) must equal the pinned one: a change to any operator's semantics, or a path
that differs from the other, is a deliberate diff. Re-pin with
``python tests/golden/test_operator_golden.py`` only when the change is meant, and
say why in the commit.

``PINNED`` holds the digests under Kirsch-Mitzenmacher indexes (``index_scheme=km``, the
only scheme before independent levels: unchanged since), ``PINNED_INDEPENDENT`` those
under the default scheme (heavy_global hashes no key into a sketch: one digest for both).
"""
from __future__ import annotations

import hashlib
import json
import random

import pytest

from grudge_stream.operators.records import TICK_KEY, SourceRecord
from grudge_stream.topology import Settings, load_topology

SEED = "00112233445566778899aabbccddeeff"
T0 = 1_700_000_000_000
SMALL = {"abuse_scores": {"cells_per_level": "1000", "raise_at": "0.3", "clear_at": "0.1"},
         "rate_limit": {"cells_per_level": "1000", "rate_per_s": "2", "burst": "3"},
         "heavy_hitters": {"width": "1024", "raise_at": "5", "clear_at": "2"},
         "dedup": {"capacity": "1000"},
         "known_keys": {"capacity": "1000"},
         "heavy_global": {"source_partitions": "2"}}
VALUES = {
    "abuse_scores": [b'{"outcome":"bad"}', b'{"outcome":"good"}', b"junk", b'{"outcome":"bad"}'],
    "rate_limit": [b'{"cost":1}', b'{"cost":2.5}', b'{"cost":"x"}', b'{"cost":-1}'],
    "heavy_hitters": [None, b"", b"x", b"3"],
    "dedup": [b"a", b"b", None, b"a"],
    "known_keys": [b'{"event":"seen"}', b'{"event":"accepted"}', b'{"event":"nope"}', b'{"event":"rejected"}'],
    "heavy_global": [None, b"junk", None, None],
}
PINNED = {  # (records, columns), pinned before the column pipeline served every operator
    "abuse_scores": ("1ada7a0b469dfc9b6708a8c9a377272628bd1362172ca8fa41323a660cd6a58b",
                    "1ada7a0b469dfc9b6708a8c9a377272628bd1362172ca8fa41323a660cd6a58b"),
    "abuse_scores/policies": ("b1dec134b073762e11ba51ef835eee2d855a9ad29a7c91dd9b4961ce74462ce7",
                             "b1dec134b073762e11ba51ef835eee2d855a9ad29a7c91dd9b4961ce74462ce7"),
    "dedup": ("562a7db89b5da2ef65dc7f90165b508fde35983c70b5cc9da1731346718eb5f4",
             "e14a5e40367595581a773095c6b01ff06ed405698df3ed4b989e6b0cec341338"),
    "dedup/policies": ("2a06fa84a363e784e46d84804e82ec3a8b89b1d49d6f8b1a09b29ae751c41e96",
                      "cc38db06b9cbf6e5b4d545ce4e9e90c1c81cb0e8ba2796c9ac7d2ca3f9b5a3ca"),
    "heavy_global": ("8456e70baa951f0cb98a60b33cd1afc2a17e18a46981221672faa0e1338fda89",
                    "8456e70baa951f0cb98a60b33cd1afc2a17e18a46981221672faa0e1338fda89"),
    "heavy_global/policies": ("8456e70baa951f0cb98a60b33cd1afc2a17e18a46981221672faa0e1338fda89",
                             "8456e70baa951f0cb98a60b33cd1afc2a17e18a46981221672faa0e1338fda89"),
    "heavy_hitters": ("44e663d47c5999324fbb82dea0ed960ca64469b449e96a95fa8cfeba8af57584",
                     "44e663d47c5999324fbb82dea0ed960ca64469b449e96a95fa8cfeba8af57584"),
    "heavy_hitters/policies": ("a791c1435ca3d8a19c02e6814d77a74cb66937b5409b2443aa90a587e27ad9b9",
                              "a791c1435ca3d8a19c02e6814d77a74cb66937b5409b2443aa90a587e27ad9b9"),
    "known_keys": ("7b60cc1bfea21089c0ca5489dccd0c2cedf1ae25ee31cf75dc3cd460c6396690",
                  "94f033dbccf02f80a15a30b703dfb7c34c431847563501f25bd153be4bb323ab"),
    "known_keys/policies": ("4a1f01455833d2ce83e089793151d777dbf9e8e98081336f3cfea7b53b284cc3",
                           "04ac8ec584031e804d9c2a57a7b80f687a8bf36a2c0eb449c37a17bd3fa2a3d5"),
    "rate_limit": ("0fcc2ca182af0d4ade86c9a520b46a457a8174ad320accb87d68519024951f1e",
                  "6ec1347e9bf65916547dc79c1cb2fd758a08a3065dc7ccd37027fa2c7cc30087"),
    "rate_limit/policies": ("60e0129ea09ee789a4befd3b8bf20ec4445f627ab66201fcbfb3351d55179a2c",
                           "07517976ed5220b265e49415bfddadeb1110ec0f6e005954599485ad5d868331"),
}
PINNED_INDEPENDENT = {  # the default index scheme (independent levels)
    "abuse_scores": ("c92b15e968cb264700e930adecfe5321e23bf2c27937ce17607d91b95e3c5f3f",
                    "c92b15e968cb264700e930adecfe5321e23bf2c27937ce17607d91b95e3c5f3f"),
    "abuse_scores/policies": ("d7242c27fb01d88a644414e769a48d1b7ddf9ddd3bcb0bad184735688ae2c8b8",
                             "d7242c27fb01d88a644414e769a48d1b7ddf9ddd3bcb0bad184735688ae2c8b8"),
    "dedup": ("b0c015562c6490c79af3705c9346251ffb8c191d6469a790bd7c12798c0d5568",
             "5b06ffe6a8a5d9f4982d7cce93d8eb8786cbefa85e886d7864209aa936aae3e8"),
    "dedup/policies": ("e51cbae6ca9855ddff09a45a5eca32b41168555c082b9d579c60b38b13ceb6c8",
                      "4b872a6400c8ad22c516bd1862afddd897be6a8e0b57e994797c9eee2d96eadb"),
    "heavy_hitters": ("1c23aa8be3f5d260caf0421626a406c51dc2fdae214d4a5fd1b5ae71b531cd4a",
                     "1c23aa8be3f5d260caf0421626a406c51dc2fdae214d4a5fd1b5ae71b531cd4a"),
    "heavy_hitters/policies": ("66b231c4752aff0dc9e993642b090889fe4e78e7230231fd88bfeb618a4b6f63",
                              "66b231c4752aff0dc9e993642b090889fe4e78e7230231fd88bfeb618a4b6f63"),
    "known_keys": ("51cc1c7d1a85cb4ac6c667abb838f3d52309879122b3ede2b066233ccdb2bd6a",
                  "de61712c294f4b602f2f85557ae9588bbe789620bf8e0f4a74725ab45806984b"),
    "known_keys/policies": ("568050146c2b73639f2a174240c2ae14bab61fa3a9b7bcfd8da2010a3ae90900",
                           "fc9e7305e12b437dcb2d7326d3cab562e64862088d282a2b341ec2564731da0c"),
    "rate_limit": ("6a91ab6ef90d663fee2739ccef5079f8e2438e9f758a59f0587634b6f027b75a",
                  "567b550ce50b92be8fe8485fcacd4e6aecc88cd062314ed29407ccbbb4e40170"),
    "rate_limit/policies": ("f2b7e7ca78994e98415fbf51c6e3a4f00d18782ce5a93a4c39a2f95209707b45",
                           "9d133b74c50c6f681504ac263d9ace49099825e6334288e8ebcae50472345252"),
}


def _report(rnd: random.Random, i: int) -> bytes:
    start = (i // 40) * 1000
    return json.dumps({"operator": "hh", "partition": rnd.randrange(2), "partitions": rnd.choice([2, 2, 2, 3]),
                       "interval_start_ms": T0 + start, "interval_end_ms": T0 + start + 1000, "k": 2,
                       "top": [{"key": f"k{rnd.randrange(4)}", "estimate": rnd.randrange(1, 9)}]}).encode()


def stream(name: str, topic: str, n: int = 1500) -> list[tuple[list[SourceRecord], int]]:
    """Chunks of one partition's records, each with the processing time it is read at;
    some chunks are delivered twice (a restart)."""
    rnd = random.Random(name)
    t = T0
    recs, clock = [], []
    for off in range(n):
        t += rnd.randint(0, 40)
        clock.append(t)
        r = rnd.random()
        ts = t - rnd.randint(1_000, 10_000_000) if r < 0.04 else (t + 10 ** 9 if r < 0.06 else t)
        if rnd.random() < 0.01:
            recs.append(SourceRecord(topic, 0, off, t + 200, TICK_KEY, None))
            continue
        value = _report(rnd, off) if name == "heavy_global" and rnd.random() < 0.8 else rnd.choice(VALUES[name])
        key = rnd.choice([b"", b"x" * 2000]) if rnd.random() < 0.01 else f"user-{rnd.randrange(30)}".encode()
        headers = [("request-id", f"r{off}".encode())] if rnd.random() < 0.5 else None
        recs.append(SourceRecord(topic, 0, off, ts, key, value, headers))
    chunks, i = [], 0
    while i < n:
        size = rnd.choice([1, 3, 17, 64, 250])
        now = clock[min(i + size, n) - 1] + 1_000
        chunks.append((recs[i:i + size], now))
        if rnd.random() < 0.05:
            chunks.append((recs[max(0, i - 20):i + size], now))  # re-delivered
        i += size
    return chunks


# The other event-time policies: future times refused, late events only counted.
POLICIES = {"future_policy": "dead_letter", "late_policy": "count"}


SCHEMED = ("abuse_scores", "rate_limit", "heavy_hitters", "dedup", "known_keys")  # have index_scheme


def topology(case: str, scheme: str = "km"):
    name, _, variant = case.partition("/")
    extra = dict(POLICIES if variant == "policies" else {})
    if name in SCHEMED:
        extra["index_scheme"] = scheme
    return name, load_topology(name, Settings({**SMALL[name], **extra, "seed": SEED}, environ={}))


def digest(case: str, columns: bool, scheme: str = "km") -> str:
    name, topo = topology(case, scheme)
    op = topo.make_operator(0)
    op.source_partition_count = 2
    h = hashlib.sha256()
    for chunk, now in stream(name, topo.source_topic):
        if columns:
            out = op.process_columns(topo.source_topic, 0, [r.offset for r in chunk], [r.timestamp_ms for r in chunk],
                                     [r.key for r in chunk], [r.value for r in chunk], processing_ms=now)
        else:
            out = op.process(chunk, processing_ms=now)
        for o in out:
            h.update(repr(tuple(o)).encode())
    h.update(json.dumps(op.counters, sort_keys=True).encode())
    h.update(repr((op.watermark, op.next_offset, op.skipped)).encode())
    h.update(op.snapshot())
    return h.hexdigest()


def _pinned(scheme: str) -> dict:
    return PINNED if scheme == "km" else {**PINNED, **PINNED_INDEPENDENT}


@pytest.mark.parametrize("scheme", ["km", "independent"])
@pytest.mark.parametrize("case", sorted(PINNED))
def test_records_and_columns_give_the_pinned_outputs(case: str, scheme: str) -> None:
    records, columns = digest(case, False, scheme), digest(case, True, scheme)
    if not topology(case)[1].needs_headers:  # (columns carry no headers: forwarding operators differ there)
        assert columns == records
    assert (records, columns) == _pinned(scheme)[case]


@pytest.mark.parametrize("scheme", ["km", "independent"])
@pytest.mark.parametrize("case", sorted(PINNED))
def test_the_column_steps_give_the_same_outputs_for_every_operator(case: str, scheme: str, monkeypatch) -> None:
    """Operators whose payloads the column steps cannot decode faster take the record steps
    (``Operator._columns_pay``); forced through the column steps they give the same."""
    from grudge_stream.operators.base import Operator

    monkeypatch.setattr(Operator, "_columns_pay", lambda self: not self.validates_against_state)
    assert (digest(case, False, scheme), digest(case, True, scheme)) == _pinned(scheme)[case]


if __name__ == "__main__":
    for scheme in ("km", "independent"):
        print(scheme)
        for n in sorted(f"{name}{variant}" for name in SMALL for variant in ("", "/policies")):
            print(f'    "{n}": ("{digest(n, False, scheme)}",\n{" " * (len(n) + 8)}"{digest(n, True, scheme)}"),')
