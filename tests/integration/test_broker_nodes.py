"""AMQP_URL naming a RabbitMQ cluster's nodes (SPEC 2): tried in turn on connect and on every
reconnect. Two proxies to the test broker stand for two nodes of a cluster (the queues are one
broker's, as a cluster's quorum queues are reachable from any node); cutting one is losing a
node. A real three-node cluster is the chaos harness's business."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from shared.amqp.broker import NODE_LOST_AFTER_S, Broker
from shared.amqp.topology import Topology
from tests.conftest import SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    System,
    effects,
    post,
    register,
    start_system,
    system_settings,
)
from tests.proxy import TcpProxy, proxy_to, via


@pytest.fixture
async def nodes(settings: Any) -> AsyncIterator[tuple[TcpProxy, TcpProxy]]:
    first = await proxy_to(settings.amqp_url, 5672)
    second = await proxy_to(settings.amqp_url, 5672)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_a_node_that_is_down_is_skipped_for_the_next(
    settings: Any, topology: Topology, nodes: tuple[TcpProxy, TcpProxy]
) -> None:
    down, up = nodes
    down.cut()
    broker = Broker(f"{via(settings.amqp_url, down)},{via(settings.amqp_url, up)}", topology)
    started = time.monotonic()
    await broker.start()
    try:
        await broker.wait_connected(10)
        assert time.monotonic() - started < 3  # no backoff before the second node is tried
        assert broker.node == up.address
        assert await broker.ping()
    finally:
        await broker.close()


async def test_services_follow_the_cluster_when_the_node_they_are_on_is_lost(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
    nodes: tuple[TcpProxy, TcpProxy],  # closed before the services stop: they stop all the same
) -> None:
    """Ingest, orders, bonuses and email on node A; A is lost; every one of them goes on with
    node B within seconds, without a restart, and a payment paid after the loss gets its
    effects once."""
    first, second = nodes
    url = system_settings(make_settings, smtp[1]).amqp_url
    cluster = f"{via(url, first)},{via(url, second)}"
    settings = system_settings(make_settings, smtp[1], AMQP_URL=cluster)
    system: System = await start_system(aiohttp_client, settings, amqp, topology)
    done = {"status": "PAID", "bonus": 500, "ledger": ["grant"], "emails": ["payment_succeeded"]}
    await register(db, "pay_before_loss")
    await post(system.ingest, payment_event("pay_before_loss"))
    await eventually(lambda: effects(db, "pay_before_loss"), lambda e: e == done)

    first.cut()  # node A is gone (and stays gone)
    await register(db, "pay_after_loss")
    await post(system.ingest, payment_event("pay_after_loss"))  # 503s retried, as X-Hub would

    got = await eventually(
        lambda: effects(db, "pay_after_loss"), lambda e: e == done, timeout_s=NODE_LOST_AFTER_S + 20
    )
    assert got == done
    for name, clients in system.clients.items():
        ready = await clients[0].get("/readyz")
        body = await ready.json()
        assert body["serving"]["rabbitmq"] == second.address, name


async def test_a_broker_that_stays_away_is_said_once_plainly_not_every_few_seconds(
    settings: Any, topology: Topology, nodes: tuple[TcpProxy, TcpProxy]
) -> None:
    down, _ = nodes
    down.cut()
    broker = Broker(via(settings.amqp_url, down), topology)
    with capture_logs() as logs:
        await broker.start()
        await asyncio.sleep(4)  # attempts after 0.5, 1 and 2 s: four failures
        await broker.close()

    said = [e for e in logs if e["event"].startswith("broker.")]
    assert [e["event"] for e in said] == ["broker.unreachable"]
    assert said[0]["node"] == down.address
    assert "rabbitmq-server" in said[0]["hint"]
