"""The dev cluster's node configuration (no broker started here; tests/integration/test_cluster_faults.py
starts one)."""
from pathlib import Path

from grudge_devkafka import broker_properties, cluster_properties


def test_cluster_node_uses_static_voters_and_production_replication():
    voters = "1@127.0.0.1:9001,2@127.0.0.1:9002,3@127.0.0.1:9003"
    props = broker_properties(9102, 9002, Path("/tmp/x"), "4.4.0", node_id=2, voters=voters)
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == voters
    assert "controller.quorum.bootstrap.servers" not in props
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["default.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert props["listeners"].startswith("PLAINTEXT://127.0.0.1:9102,CONTROLLER://127.0.0.1:9002")


def test_single_node_keeps_a_standalone_quorum_and_one_replica():
    props = broker_properties(9102, 9002, Path("/tmp/x"), "4.4.0")
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:9002"
    assert "controller.quorum.voters" not in props
    assert props["offsets.topic.replication.factor"] == "1"
    assert cluster_properties(2)["default.replication.factor"] == 2
