"""Every shipped topology builds, runs its operator on sample records and round-trips its state."""
from __future__ import annotations

import secrets

import pytest

from grudge_stream import ConfigError
from grudge_stream.operators import SourceRecord
from grudge_stream.topology import Settings, load_topology

SAMPLES = {
    "abuse_scores": [b'{"outcome":"bad"}', b'{"outcome":"good"}', b"junk"],
    "rate_limit": [b'{"cost":1}', b'{"cost":2.5}', b'{"cost":"x"}'],
    "heavy_hitters": [None, b"", b"x"],
    "dedup": [b"a", b"b", None],
    "known_keys": [b'{"event":"seen"}', b'{"event":"accepted"}', b'{"event":"nope"}'],
    "heavy_global": [b'{"operator":"hh","partition":1,"partitions":2,"interval_start_ms":0,'
                     b'"interval_end_ms":1000,"k":1,"top":[{"key":"a","estimate":3}]}', b"junk", None],
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_topology_runs_and_round_trips(name: str) -> None:
    small = {"abuse_scores": {"cells_per_level": "1000"}, "rate_limit": {"cells_per_level": "1000"},
             "heavy_hitters": {"width": "1024"}, "dedup": {"capacity": "1000"},
             "known_keys": {"capacity": "1000"}, "heavy_global": {}}[name]
    topo = load_topology(name, Settings({**small, "seed": secrets.token_hex(16)},
                                        environ={}))
    assert "dead_letters" in topo.outputs
    op = topo.make_operator(3)
    recs = [SourceRecord(topo.source_topic, 3, i, 10_000 + i, f"k{i % 2}".encode(), SAMPLES[name][i % 3])
            for i in range(30)]
    out = op.process(recs)
    assert all(o.role in topo.outputs for o in out), {o.role for o in out} - set(topo.outputs)
    clone = topo.make_operator(3)
    clone.restore(op.snapshot())
    assert clone.snapshot() == op.snapshot()
    assert op.next_offset == 30


def test_settings_come_from_flags_then_environment_then_defaults() -> None:
    s = Settings({"raise_at": "0.7"}, environ={"GRUDGE_RAISE_AT": "0.9", "GRUDGE_CLEAR_AT": "0.1"})
    assert s.get("raise_at", 0.5) == 0.7
    assert s.get("clear_at", 0.25) == 0.1
    assert s.get("levels", 4) == 4
    with pytest.raises(ConfigError):
        Settings({"levels": "four"}, environ={}).get("levels", 4)


def test_unknown_topology_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown topology"):
        load_topology("no_such_topology", Settings(environ={}))


def test_operators_get_the_runtime_context_and_attached_overrides() -> None:
    """``Topology.operator`` hands each operator its ``OperatorContext``: the partition
    count, the dead-letter limit and the overrides table attached to the topology (an
    attached table reaches every operator built afterwards; attaching again replaces it)."""
    from grudge_stream.operators.base import OperatorContext
    from grudge_stream.overrides import OverrideTable, attach_overrides

    topo = load_topology("abuse_scores", Settings({"cells_per_level": "1000", "seed": secrets.token_hex(16)},
                                                  environ={}))
    before = topo.operator(2, 8, 5_000)
    assert (before.partition, before.source_partition_count, before.dead_letter_limit, before.overrides) == \
        (2, 8, 5_000, None)
    first, second = OverrideTable(), OverrideTable()
    attach_overrides(topo, first)
    attach_overrides(topo, second)
    assert topo.operator(2).overrides is second and topo.operator(2).source_partition_count is None
    assert before.overrides is None  # built before: unchanged
    with pytest.raises(ValueError, match="context of partition 3"):
        topo.make_operator(2).init(OperatorContext(3))
