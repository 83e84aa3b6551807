"""State written by the released 0.2.0 restores under the current code, without a broker.

The fixture (tests/data/upgrade-0.2.0, its README says how it was made) holds every record
0.2.0 batch workers left in the snapshot, alert and alert-state topics of each shipped
topology, the source records they read, and what the 0.2.0 code itself made of them (SHA-256
of each snapshot generation's blob, of its re-snapshot and sketch bytes after a restore, of a
replay up to its offset). Here the current code parses the same chunk and manifest records
(grudge_stream.checkpoint.format) and restores every generation; tests/integration/
test_upgrade.py does the same through the broker, a worker and ``AlertView``.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


def _helper():
    path = Path(__file__).resolve().parents[1] / "upgrade_fixture.py"
    spec = importlib.util.spec_from_file_location("grudge_tests_upgrade_fixture", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


uf = _helper()


def test_the_fixture_is_there_and_small() -> None:
    assert {"abuse_scores", "rate_limit", "heavy_hitters", "dedup", "known_keys"} <= set(uf.NAMES)
    total = sum(p.stat().st_size for p in uf.FIXTURE.iterdir())
    assert total < 2_000_000
    for name in uf.NAMES:
        fx = uf.Fixture(name)
        assert fx.doc["release"] == "0.2.0" and fx.doc["written_by"] == "grudge-stream 0.2.0"
        for p in range(fx.partitions):
            gens = fx.generations(p)
            # At least two generations per partition, so manifests name a previous one too.
            assert len([g for g in gens if g["loads"]]) >= 2, (name, p)


@pytest.mark.parametrize("name", uf.NAMES)
def test_every_manifest_and_chunk_of_0_2_0_parses_to_the_same_blob(name: str) -> None:
    fx = uf.Fixture(name)
    for p in range(fx.partitions):
        refs = fx.refs(p)
        for g in fx.generations(p):
            if not g["loads"]:
                continue  # compacted away before the fixture was read (0.2.0 could not load it either)
            blob = fx.assemble(p, refs[g["generation"]])
            assert uf.sha(blob) == g["blob_sha256"], (name, p, g["generation"])


@pytest.mark.parametrize("name", uf.NAMES)
def test_0_2_0_snapshots_restore_to_the_same_state_as_a_replay(name: str) -> None:
    """Each generation restores; its sketch bytes are 0.2.0's, and a current-code replay of the
    source records below its next offset reaches the very same state."""
    fx = uf.Fixture(name)
    topology = fx.topology()
    for p in range(fx.partitions):
        refs = fx.refs(p)
        for g in fx.generations(p):
            if not g["loads"]:
                continue
            ref = refs[g["generation"]]
            blob = fx.assemble(p, ref)
            op = topology.make_operator(p)
            op.restore(blob)
            where = f"{name}[{p}] generation {g['generation']} (next_offset {ref.next_offset})"
            assert op.next_offset == ref.next_offset, where
            if g["sketch_sha256"] is not None:
                assert uf.sha(op.sketch_bytes()) == g["sketch_sha256"], where
            replay = topology.make_operator(p)
            replay.process(fx.source_records(p, below=ref.next_offset))
            assert replay.next_offset == op.next_offset, where
            if g["replay_sketch_sha256"] is not None:
                assert uf.sha(replay.sketch_bytes()) == g["replay_sketch_sha256"], where
                assert replay.sketch_bytes() == op.sketch_bytes(), where
            assert replay.snapshot() == op.snapshot(), where


@pytest.mark.parametrize("name", uf.NAMES)
def test_0_2_0_snapshots_re_snapshot_byte_identically(name: str) -> None:
    """A restored 0.2.0 snapshot, snapshotted again by the current code, is the same bytes:
    nothing in the blob is lost or reinterpreted on the way (a deliberate change of the
    snapshot layout would show here first, and must keep old blobs restoring as above)."""
    fx = uf.Fixture(name)
    topology = fx.topology()
    for p in range(fx.partitions):
        refs = fx.refs(p)
        for g in fx.generations(p):
            if not g["loads"]:
                continue
            blob = fx.assemble(p, refs[g["generation"]])
            op = topology.make_operator(p)
            op.restore(blob)
            assert g["resnapshot_sha256"] == g["blob_sha256"], "0.2.0 itself re-snapshots to the same bytes"
            assert op.snapshot() == blob, f"{name}[{p}] generation {g['generation']}"


@pytest.mark.parametrize("name", uf.NAMES)
def test_0_2_0_replay_matched_its_own_snapshots(name: str) -> None:
    """The fixture's own consistency: 0.2.0's workers and a 0.2.0 replay agreed (else the
    comparisons above would test the fixture, not the upgrade)."""
    fx = uf.Fixture(name)
    for p in range(fx.partitions):
        for g in fx.generations(p):
            if g["loads"]:
                assert g["replay_snapshot_sha256"] == g["blob_sha256"], (name, p, g["generation"])
