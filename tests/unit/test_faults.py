"""tests/faults.py acts on a private RabbitMQ node or PostgreSQL cluster only: the machine's
shared ones (rabbit@localhost on 5672, the main cluster on 5432) can't even be named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults import PgCluster, RabbitNode, SharedServerError


@pytest.mark.parametrize(
    ("name", "port"), [("rabbit@localhost", 25000), ("chaos_1@localhost", 5672)]
)
def test_the_shared_broker_cannot_be_named(name: str, port: int) -> None:
    with pytest.raises(SharedServerError):
        RabbitNode(name, port, 25001, Path("/tmp/x"))


@pytest.mark.parametrize(("name", "port"), [("main", 26000), ("chaos_1", 5432)])
def test_the_shared_cluster_cannot_be_named(name: str, port: int) -> None:
    with pytest.raises(SharedServerError):
        PgCluster("15", name, port)


def test_a_private_node_starts_with_its_own_name_ports_and_files() -> None:
    node = RabbitNode("chaos_1@localhost", 25000, 25001, Path("/tmp/x"))
    env = node.environment()
    assert env["RABBITMQ_NODENAME"] == "chaos_1@localhost"
    assert env["RABBITMQ_NODE_PORT"] == "25000"
    assert env["RABBITMQ_DIST_PORT"] == "25001"
    # Every file of the node below its own folder, the machine's config files not read.
    paths = [v for k, v in env.items() if k.endswith(("_FILE", "_BASE"))]
    assert paths
    assert all(v.startswith("/tmp/x/") for v in paths)
    assert PgCluster("15", "chaos_1", 26000).url("db") == "postgresql://postgres@127.0.0.1:26000/db"
