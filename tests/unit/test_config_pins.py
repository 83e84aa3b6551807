"""Pins that the typed configuration changes nothing stored or sent.

An operator's ``config_dict()`` feeds the fingerprint stored in every snapshot, so it must
stay byte for byte what it was before operators took the typed sketch configs (a snapshot
written before the change still restores); the output records must stay the same bytes.
The pinned values (``data/config_pins.json``, ``data/output_records.json`` and ``DIRECT``
below) were computed on the release before the typed configs and typed records, all under
Kirsch-Mitzenmacher indexes (the only scheme of 0.2): they hold with ``index_scheme=km``,
and the default (``independent``) changes the identity by exactly its ``index_scheme`` field.
"""
from __future__ import annotations

import json
import os

import pytest

from grudge_stream.operators import SourceRecord
from grudge_stream.operators.dedup import DedupOperator
from grudge_stream.operators.heavy import HeavyHitterOperator
from grudge_stream.operators.knownkeys import KnownKeyOperator
from grudge_stream.operators.ratelimit import RateLimitOperator
from grudge_stream.operators.scores import FeedbackScoreOperator
from grudge_stream.topology import Settings, load_topology

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SEED = "00112233445566778899aabbccddeeff"


def _load(name: str):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return json.load(f)


CONFIG_PINS = _load("config_pins.json")


SCHEMED = ("abuse_scores", "rate_limit", "heavy_hitters", "dedup", "known_keys")  # have index_scheme


def _km(name: str, settings: dict) -> dict:
    return {**settings, "index_scheme": "km"} if name in SCHEMED else settings


@pytest.mark.parametrize("pin", CONFIG_PINS, ids=lambda p: p["topology"] + ("+" if p["settings"] else ""))
def test_topology_config_dict_and_fingerprint_are_unchanged(pin: dict) -> None:
    topo = load_topology(pin["topology"], Settings({**_km(pin["topology"], pin["settings"]), "seed": SEED},
                                                   environ={}))
    op = topo.make_operator(0)
    assert json.dumps(op.config_dict()) == pin["config_dict"]
    assert json.dumps(op.full_config()) == pin["full_config"]
    assert op.fingerprint == pin["fingerprint"]


@pytest.mark.parametrize("pin", CONFIG_PINS, ids=lambda p: p["topology"] + ("+" if p["settings"] else ""))
def test_the_default_scheme_adds_its_name_to_the_identity_and_nothing_else(pin: dict) -> None:
    topo = load_topology(pin["topology"], Settings({**pin["settings"], "seed": SEED}, environ={}))
    got = topo.make_operator(0).config_dict()
    want = json.loads(pin["config_dict"])
    if pin["topology"] in SCHEMED:
        part = next(k for k in ("sketch", "bloom", "bucket") if k in want)
        want[part]["index_scheme"] = "independent"
    assert got == want


def _direct_operators() -> list:
    c = dict(operator_id="op", source_topic="t", partition=0)
    ops = [
     FeedbackScoreOperator(**c, sketch={"levels": 2, "cells_per_level": 64}, raise_at=0.5, clear_at=0.2),
     FeedbackScoreOperator(**c, sketch={"cells_per_level": 64, "levels": 2, "lo": 0, "hi": 1, "seed": 9,
                                        "decay": {"kind": "linear", "rate_per_s": 2}}, raise_at=0.5, clear_at=0.2),
     HeavyHitterOperator(**c, sketch={"depth": 2, "width": 128}, raise_at=5, clear_at=1),
     HeavyHitterOperator(**c, sketch={"width": 128, "depth": 2, "epoch_ms": None, "seed": 3, "counter_bits": 20}, raise_at=5, clear_at=1, top_k=0),
     DedupOperator(**c, bloom={"capacity": 100, "fp_rate": 0.01}),
     DedupOperator(**c, bloom={"fp_rate": 0.01, "capacity": 100, "generations": 3, "overload": "raise_fp", "period_ms": 5000}),
     KnownKeyOperator(**c, bloom={"capacity": 100, "fp_rate": 0.01, "overload": "shrink_window", "seed": 1}),
     RateLimitOperator(**c, rate_per_s=2, burst=5),
     RateLimitOperator(**c, rate_per_s=2, burst=5, reject_penalty=1, max_debt=9, levels=3, cells_per_level=50, hasher="murmur3", seed=4, index_scheme="km"),
    ]
    return ops


# (config_dict JSON, fingerprint, max_future_ms, max_late_ms) of _direct_operators(): operators
# given plain dicts (the compatibility path) keep the dict as given in their identity.
DIRECT = [
    ('{"sketch": {"levels": 2, "cells_per_level": 64}, "raise_at": 0.5, "clear_at": 0.2, "latch_capacity": 100000, "sweep_interval_ms": 10000, "emit_scores": "crossings"}', '55d7b2dfd37f229a', 5000, 1400000),
    ('{"sketch": {"cells_per_level": 64, "levels": 2, "lo": 0, "hi": 1, "seed": 9, "decay": {"kind": "linear", "rate_per_s": 2}}, "raise_at": 0.5, "clear_at": 0.2, "latch_capacity": 100000, "sweep_interval_ms": 10000, "emit_scores": "crossings"}', 'fd0b73b87f1311e5', 1000, 60000),
    ('{"sketch": {"depth": 2, "width": 128}, "top_k": 100, "raise_at": 5.0, "clear_at": 1.0, "latch_capacity": 100000, "report_interval_ms": 10000}', '947be7b2b3ba5299', 1000, 60000),
    ('{"sketch": {"width": 128, "depth": 2, "epoch_ms": null, "seed": 3, "counter_bits": 20}, "top_k": 0, "raise_at": 5.0, "clear_at": 1.0, "latch_capacity": 100000, "report_interval_ms": 10000}', 'e8114d3934be3b7d', 60000, 86400000),
    ('{"bloom": {"capacity": 100, "fp_rate": 0.01}}', '3a31f391e73b9fe9', 60000, 86400000),
    ('{"bloom": {"fp_rate": 0.01, "capacity": 100, "generations": 3, "overload": "raise_fp", "period_ms": 5000}}', 'f45e8a140aac2622', 1000, 70000),
    ('{"bloom": {"capacity": 100, "fp_rate": 0.01, "seed": 1}}', '6ebbe730f2c4975f', 60000, 86400000),
    ('{"bucket": {"rate_per_s": 2.0, "burst": 5.0, "reject_penalty": 0.0, "max_debt": null, "levels": 4, "cells_per_level": 100000, "hasher": "siphash", "seed": 0}, "emit": "all", "default_cost": 1.0, "request_id_field": "request_id", "request_id_header": "request-id"}', 'c19db4ab91c344c6', 1000, 60000),
    ('{"bucket": {"rate_per_s": 2.0, "burst": 5.0, "reject_penalty": 1.0, "max_debt": 9.0, "levels": 3, "cells_per_level": 50, "hasher": "murmur3", "seed": 4}, "emit": "all", "default_cost": 1.0, "request_id_field": "request_id", "request_id_header": "request-id"}', 'b9bc4ed21819f385', 1000, 60000),
]


def test_operators_given_dicts_keep_their_config_dict_and_fingerprint() -> None:
    """Dicts naming ``index_scheme: km`` keep 0.2's identity exactly (the field stays out of
    it); a dict leaving the scheme to its default gets ``"index_scheme": "independent"``."""
    ops = _direct_operators()
    got = [(json.dumps(o.config_dict()), o.fingerprint, o.max_future_ms, o.max_late_ms) for o in ops]
    assert got[-1] == DIRECT[-1]
    for (conf, _, fut, late), (want, _, wfut, wlate) in zip(got[:-1], DIRECT[:-1]):
        want = json.loads(want)
        part = next(k for k in ("sketch", "bloom", "bucket") if k in want)
        want[part]["index_scheme"] = "independent"
        assert (json.loads(conf), fut, late) == (want, wfut, wlate)


OUTPUT_CASES = {
    "abuse_scores": ({"cells_per_level": "1000", "raise_at": "0.1", "clear_at": "0.05", "emit_scores": "every",
                      "sweep_interval_ms": "2000"},
                     [b'{"outcome":"bad"}'] * 5 + [b'{"outcome":"good"}', b"junk"], [b"k1", b"\xff\x00", b"k3"]),
    "rate_limit": ({"cells_per_level": "1000", "burst": "3", "rate_per_s": "1"},
                   [b'{"cost":1}', b'{"cost":2.5,"request_id":"abc"}', b'{"cost":"x"}', b'{"request_id":7}'],
                   [b"k1", b"k2"]),
    "heavy_hitters": ({"width": "1024", "epoch_ms": "60000", "raise_at": "5", "clear_at": "2",
                       "report_interval_ms": "5000", "top_k": "3"},
                      [b"x"], [b"a", b"b", b"a", b"\xfe"]),
    "dedup": ({"capacity": "1000"}, [b"v1", None], [b"a", b"b", b"c", b"a", b"d"]),
    "known_keys": ({"capacity": "1000"}, [b'{"event":"seen"}', b'{"event":"accepted"}', b'{"event":"nope"}',
                                          b'{"event":"seen"}'], [b"a", b"b", b"c"]),
    "heavy_global": ({"grace_ms": "1000"}, [
        b'{"operator":"hh","partition":1,"partitions":2,"interval_start_ms":0,"interval_end_ms":1000,"k":2,'
        b'"top":[{"key":"a","estimate":3},{"key":"b","estimate":1}]}',
        b'{"operator":"hh","partition":0,"partitions":2,"interval_start_ms":0,"interval_end_ms":1000,"k":2,'
        b'"top":[{"key":"a","estimate":2},{"key_b64":"/w==","estimate":2}]}',
        b'{"operator":"hh","partition":0,"partitions":2,"interval_start_ms":1000,"interval_end_ms":2000,"k":2,'
        b'"top":[{"key":"c","estimate":9}]}',
        b'{"operator":"hh","partition":0,"partitions":2,"interval_start_ms":5000,"interval_end_ms":6000,"k":2,"top":[]}',
        b"junk"], [b"0"]),
}
OUTPUT_PINS = _load("output_records.json")


def _records(topic: str, values: list, keys: list) -> list[SourceRecord]:
    return [SourceRecord(topic, 0, i, 10_000 + 700 * i, keys[i % len(keys)], values[i % len(values)],
                         [("request-id", b"r%d" % i)] if i % 3 == 0 else None) for i in range(40)]


def _wire(out: list) -> list:
    return [[o.role, o.key.hex() if o.key is not None else None,
             o.value.decode("latin-1") if o.value is not None else None,
             [[h, v.hex()] for h, v in o.headers] if o.headers else None, o.timestamp_ms] for o in out]


@pytest.mark.parametrize("name", sorted(OUTPUT_CASES))
@pytest.mark.parametrize("path", ["records", "columns"])
def test_output_records_are_the_same_bytes(name: str, path: str) -> None:
    settings, values, keys = OUTPUT_CASES[name]
    topo = load_topology(name, Settings({**_km(name, settings), "seed": SEED}, environ={}))
    op = topo.make_operator(0)
    recs = _records(topo.source_topic, values, keys)
    if path == "records" or op.needs_headers:
        out = op.process(recs, processing_ms=10_000_000)
    else:
        # The column path (what the batch runtime calls), header-free.
        if name == "rate_limit":
            pytest.skip("decisions echo the request-id header: the record path only")
        out = op.process_columns(topo.source_topic, 0, [r.offset for r in recs], [r.timestamp_ms for r in recs],
                                 [r.key for r in recs], [r.value for r in recs], processing_ms=10_000_000)
    assert _wire(out) == OUTPUT_PINS[name]


# Snapshots written by the release before the typed configs (small shapes, 5 records each).
SNAPSHOT_SETTINGS = {"abuse_scores": {"cells_per_level": "64"}, "rate_limit": {"cells_per_level": "64"},
                     "heavy_hitters": {"width": "64"}, "dedup": {"capacity": "100"},
                     "known_keys": {"capacity": "100"}, "heavy_global": {}}


@pytest.mark.parametrize("name", sorted(SNAPSHOT_SETTINGS))
def test_snapshots_written_before_the_typed_configs_restore(name: str) -> None:
    with open(os.path.join(DATA, "snapshots", name + ".snapshot"), "rb") as f:
        blob = f.read()
    topo = load_topology(name, Settings({**_km(name, SNAPSHOT_SETTINGS[name]), "seed": SEED}, environ={}))
    op = topo.make_operator(0)
    op.restore(blob)
    assert op.next_offset == 5
    assert op.snapshot() == blob
