"""RabbitMQ gone and back under running services: every consumer comes back by itself.

The round-1 services reconnected after `rabbitmqctl stop_app` / `start_app` but never
consumed again (the work queue was taken with `get_queue(ensure=False)`, which aio-pika's
robust channel does not restore), while every /readyz said ready. This is the regression test:
the broker goes away for 10 s, comes back, and a new paid webhook is processed end to end
within 30 s with no service restarted; while a worker has no consumer its /readyz says so.

The services reach the machine's RabbitMQ through a TcpProxy, and the proxy is cut, never the
broker: other clients share it (its side sees every connection closed, as in a restart, and
takes back what they held unacknowledged).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import aio_pika
import orjson
import pytest

from shared.amqp import broker as broker_module
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology, declare
from shared.config import Settings
from shared.worker import consumer as consumer_module
from shared.worker.batches import Delivery, Result
from tests.conftest import TEST_AMQP_URL, SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    WORK_QUEUE,
    consumer_counts,
    effects,
    post,
    quiescent,
    register,
    smtp_messages,
    start_system,
    system_settings,
)
from tests.integration.test_worker_message_id import publish, running_worker
from tests.proxy import TcpProxy, proxy_to, via

pytestmark = pytest.mark.timeout(180)

DOWN_S = 10.0
RECOVERY_BUDGET_S = 30.0


@pytest.fixture
async def rabbitmq_path(settings: Settings) -> AsyncIterator[TcpProxy]:
    """The way to RabbitMQ the test's services take, which the test cuts."""
    proxy = await proxy_to(settings.amqp_url, 5672)
    try:
        yield proxy
    finally:
        await proxy.close()


async def statuses(system: Any) -> dict[str, int]:
    result = {}
    for name, clients in system.clients.items():
        response = await clients[0].get("/readyz")
        result[name] = response.status
    return result


async def test_services_consume_again_after_rabbitmq_restarts(
    rabbitmq_path: TcpProxy,
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    sink, port = smtp
    url = system_settings(make_settings, port).amqp_url
    settings = system_settings(make_settings, port, AMQP_URL=via(url, rabbitmq_path))
    system = await start_system(aiohttp_client, settings, amqp, topology)
    await register(db, "pay_before")
    await register(db, "pay_after")
    await post(system.ingest, payment_event("pay_before", "paid"))
    await quiescent(db, system)
    assert await statuses(system) == dict.fromkeys(system.clients, 200)

    try:
        rabbitmq_path.cut()
        # Every service says it can't work while the broker is away (the workers because
        # their consumers are gone with the connection).
        await eventually(
            lambda: statuses(system),
            lambda s: s == dict.fromkeys(system.clients, 503),
            timeout_s=10,
        )
        await asyncio.sleep(DOWN_S)
    finally:
        rabbitmq_path.restore()
    back = time.monotonic()

    # No service restarted: the same apps reconnect and consume again.
    await eventually(
        lambda: statuses(system),
        lambda s: s == dict.fromkeys(system.clients, 200),
        timeout_s=RECOVERY_BUDGET_S,
        interval_s=0.2,
    )
    async with await aio_pika.connect(TEST_AMQP_URL) as connection:
        channel = await connection.channel()
        queues = {topology.work[q].name: 1 for q in WORK_QUEUE.values()}
        assert await consumer_counts(channel, queues) == queues

        deadline = back + RECOVERY_BUDGET_S
        await post(system.ingest, payment_event("pay_after", "paid"))
        await quiescent(db, system, timeout_s=max(1.0, deadline - time.monotonic()))
    assert await effects(db, "pay_after") == {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant"],
        "emails": ["payment_succeeded"],
    }
    assert smtp_messages(sink, "pay_after") == ["payment_succeeded"]
    assert time.monotonic() - back < RECOVERY_BUDGET_S


async def test_a_connection_that_never_comes_back_is_replaced_and_consumed_again(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aio-pika's robust connection once never reconnected (made while RabbitMQ was stopping;
    `make chaos`). Such a connection is what a closed one looks like: the broker starts
    afresh, and the workers consume on the new connection."""
    monkeypatch.setattr(broker_module, "_STUCK_AFTER_S", 2.0)
    monkeypatch.setattr(consumer_module, "_RECONSUME_AFTER_S", 2.0)
    sink, port = smtp
    system = await start_system(
        aiohttp_client, system_settings(make_settings, port), amqp, topology
    )
    await register(db, "pay_afresh")
    for clients in system.clients.values():
        app = clients[0].app
        assert app is not None
        await app[BROKER].connection.close()  # a robust connection closed never reconnects

    await eventually(
        lambda: statuses(system),
        lambda s: s == dict.fromkeys(system.clients, 200),
        timeout_s=RECOVERY_BUDGET_S,
        interval_s=0.2,
    )
    await post(system.ingest, payment_event("pay_afresh", "paid"))
    await quiescent(db, system)
    assert (await effects(db, "pay_afresh"))["emails"] == ["payment_succeeded"]
    assert smtp_messages(sink, "pay_afresh") == ["payment_succeeded"]


async def test_a_batch_in_hand_while_rabbitmq_restarts_does_not_stop_the_worker(
    rabbitmq_path: TcpProxy, settings: Settings, amqp: Any, topology: Topology
) -> None:
    """`make chaos` (rabbitmq-stop, rabbitmq-kill, cut-rabbitmq): a batch finished after its
    channel closed asked aio-pika for the message's channel to ack it, which raises on a
    closed channel; the batcher died of it and, the worker's only one, nothing was processed
    again while /readyz said ready. Its messages are RabbitMQ's again (redelivered); the
    worker goes on with the next ones."""
    await declare(amqp, topology)
    queue = topology.work["orders"].name
    holding = asyncio.Event()
    release = asyncio.Event()
    handled: list[str] = []

    async def handle(deliveries: Sequence[Delivery]) -> list[Result]:
        handled.extend(d.message_id for d in deliveries)
        if not holding.is_set():
            holding.set()
            await release.wait()
        return ["ok"] * len(deliveries)

    proxied = replace(settings, amqp_url=via(settings.amqp_url, rabbitmq_path))
    async with running_worker(proxied, topology, amqp, lambda _: handle) as worker:
        await publish(amqp, queue, orjson.dumps(payment_event("pay_held")), "evt_held")
        await asyncio.wait_for(holding.wait(), 10)
        try:
            rabbitmq_path.cut()
            release.set()  # the batch ends while its channel is closed
            await asyncio.sleep(1.0)
            assert await worker.consuming() is False
        finally:
            rabbitmq_path.restore()

        async with await aio_pika.connect(TEST_AMQP_URL) as connection:
            channel = await connection.channel()
            await eventually(worker.consuming, bool, timeout_s=RECOVERY_BUDGET_S)
            await publish(channel, queue, orjson.dumps(payment_event("pay_next")), "evt_next")
            await eventually(lambda: _async(handled), lambda h: "evt_next" in h, timeout_s=30)
            assert "evt_held" in handled[1:]  # not acked: RabbitMQ delivered it again


async def _async(value: list[str]) -> list[str]:
    return value
