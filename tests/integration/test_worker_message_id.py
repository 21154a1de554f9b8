"""A message without a message id is invalid: the worker runtime dead-letters every such
message with reason `invalid_message` instead of deduplicating them all under an empty key
(issue 11, point 6). Real RabbitMQ, real PostgreSQL, the real orders handler."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aio_pika
import orjson
from aio_pika.abc import AbstractChannel, DeliveryMode
from aiormq.abc import ChannelFrame
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from services.orders.handler import make_handler as orders_handler
from services.orders.outbox import OutboxRelay
from shared.amqp.broker import Broker
from shared.amqp.topology import Topology, declare
from shared.config import Settings
from shared.db import create_pool
from shared.metrics import OrderMetrics, WorkerMetrics, new_registry
from shared.worker.batches import BatchHandler
from shared.worker.runtime import Worker
from tests.helpers import drain, eventually, payment_event
from tests.integration.system import consumer_counts, depths, effects, header, register


@asynccontextmanager
async def running_worker(
    settings: Settings,
    topology: Topology,
    channel: AbstractChannel,
    make_handler: Callable[[Broker], BatchHandler],
    **batching: Any,
) -> AsyncIterator[Worker]:
    """The orders queue consumed by shared.worker.runtime.Worker with the handler `make_handler`
    makes from the worker's broker, once its consumer is on the queue; `batching`: the Worker's
    batch_size, batchers, linger_s."""
    broker = Broker(settings.amqp_url, topology)
    await broker.start()
    worker = Worker(
        "orders",
        broker,
        topology.work["orders"],
        make_handler(broker),
        WorkerMetrics.create("t"),
        **batching,
    )
    try:
        await broker.wait_connected(10)
        worker.start()
        queue = topology.work["orders"].name
        await eventually(lambda: consumer_counts(channel, [queue]), lambda c: c == {queue: 1})
        yield worker
    finally:
        await worker.stop()
        await broker.close()


@asynccontextmanager
async def orders_worker(
    settings: Settings, topology: Topology, channel: AbstractChannel, **batching: Any
) -> AsyncIterator[None]:
    """running_worker with the real orders handler (its outbox relay never runs: the test
    looks at the order and processed_events only)."""
    pool = await create_pool(settings.database_url, max_size=2)
    metrics = OrderMetrics.create(new_registry())

    def make_handler(broker: Broker) -> BatchHandler:
        return orders_handler(pool, OutboxRelay(pool, broker), metrics)

    try:
        async with running_worker(settings, topology, channel, make_handler, **batching):
            yield
    finally:
        await pool.close()


async def publish_without_message_id(channel: AbstractChannel, queue: str, body: bytes) -> None:
    """Publish as a producer that sets no message id would (another client library, a manual
    publish). aiormq gives every message it publishes a random id, so the frames are written
    here by hand: the message reaches the queue with no message_id at all."""
    underlay = await channel.get_underlay_channel()
    raw = await underlay.connection.channel(publisher_confirms=False)
    try:
        properties = Basic.Properties(content_type="application/json", delivery_mode=2)
        frames: list[Basic.Publish | ContentHeader | ContentBody] = [
            Basic.Publish(exchange="", routing_key=queue),
            ContentHeader(properties=properties, body_size=len(body)),
            ContentBody(body),
        ]
        written = asyncio.get_running_loop().create_future()
        await raw.write_queue.put(  # type: ignore[attr-defined]
            ChannelFrame.marshall(channel_number=raw.number, frames=frames, drain_future=written)
        )
        await written
    finally:
        await raw.close()


async def publish(channel: AbstractChannel, queue: str, body: bytes, message_id: str) -> None:
    message = aio_pika.Message(
        body,
        message_id=message_id,
        type="payment.status_changed",
        content_type="application/json",
        delivery_mode=DeliveryMode.PERSISTENT,
    )
    await channel.default_exchange.publish(message, routing_key=queue, mandatory=True)


async def test_every_message_without_a_message_id_is_dead_lettered_as_invalid_message(
    settings: Settings, topology: Topology, amqp: Any, db: Any
) -> None:
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    await register(db, payment_id)
    await declare(amqp, topology)
    work = topology.work["orders"]
    paid = orjson.dumps(payment_event(payment_id, "paid"))
    settled = orjson.dumps(payment_event(payment_id, "settled"))

    async with orders_worker(settings, topology, amqp):
        # Two different valid events, neither with a message id: under one empty key the
        # second used to be skipped as a duplicate of the first.
        await publish_without_message_id(amqp, work.name, paid)
        await publish_without_message_id(amqp, work.name, settled)
        await eventually(lambda: depths(amqp, [work.dlq]), lambda d: d == {work.dlq: 2})
        # The same worker still processes a message that has an id: it was up all along.
        await publish(amqp, work.name, paid, f"evt_{uuid.uuid4().hex}")
        await eventually(lambda: effects(db, payment_id), lambda e: e["status"] == "PAID")

    dead = await drain(amqp, work.dlq)
    assert sorted(m.body for m in dead) == sorted([paid, settled])
    # aiormq gave each DLQ copy a random id when the worker published it there (it publishes
    # nothing without one): two different ids, and the error says the original had none.
    assert len({m.message_id for m in dead}) == 2
    for message in dead:
        assert header(message, "reason") == "invalid_message"
        assert "message_id" in header(message, "error")
        assert header(message, "original_queue") == work.name
        assert int(header(message, "attempts")) == 1
    for queue in (work.name, *work.retry_queues):
        assert await drain(amqp, queue) == []
    # Neither reached the handler: no idempotency row under the empty key, and the order moved
    # only once, by the message with an id.
    assert await db.fetchval("SELECT count(*) FROM processed_events WHERE event_id = ''") == 0
    transitions = await db.fetch(
        "SELECT to_status FROM order_transitions WHERE payment_id = $1", payment_id
    )
    assert [r["to_status"] for r in transitions] == ["PAID"]
