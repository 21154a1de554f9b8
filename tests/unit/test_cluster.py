"""The cluster harness's names and URLs (tests/cluster.py), without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import faults
from tests.cluster import Cluster, PgPair, RabbitCluster


def _cluster() -> Cluster:
    nodes = tuple(
        faults.RabbitNode(f"ha{i}@localhost", 30000 + i, 31000 + i, Path(f"/tmp/r{i}"))
        for i in (1, 2, 3)
    )
    pair = PgPair(faults.PgCluster("15", "ha_a", 32001), faults.PgCluster("15", "ha_b", 32002))
    return Cluster(RabbitCluster(nodes), pair, Path("/tmp/payhooks-cluster-ha"))


def test_the_stack_is_told_to_payhooks_as_a_node_list_and_a_two_host_dsn() -> None:
    env = _cluster().environment()
    assert env["AMQP_URL"] == (
        "amqp://guest:guest@127.0.0.1:30001/,amqp://guest:guest@127.0.0.1:30002/,"
        "amqp://guest:guest@127.0.0.1:30003/"
    )
    assert env["DATABASE_URL"] == (
        "postgresql://postgres@127.0.0.1:32001,127.0.0.1:32002/payhooks"
        "?target_session_attrs=read-write"
    )


def test_the_stack_survives_its_state_file() -> None:
    cluster = _cluster()
    assert Cluster.from_json(cluster.to_json()) == cluster


def test_the_harness_cannot_name_the_shared_servers() -> None:
    with pytest.raises(faults.SharedServerError):
        PgPair(faults.PgCluster("15", "main", 5432), faults.PgCluster("15", "ha_b", 32002))
    with pytest.raises(faults.SharedServerError):
        faults.RabbitNode("rabbit@localhost", 5672, 25672, Path("/"))
