"""The orders worker: provider events through the state machine, transitions via the outbox;
events parked for a missing order released or dead-lettered by the parked relay."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from services.orders.handler import WORKER, make_handler
from services.orders.outbox import OutboxRelay
from services.orders.parked import ParkedRelay
from shared.amqp.broker import BROKER
from shared.amqp.topology import build_topology
from shared.config import Settings
from shared.db import DB_POOL
from shared.listen import listen_forever
from shared.metrics import OrderMetrics, WorkerMetrics
from shared.process.service import Service
from shared.process.tasks import background
from shared.queries.parked import RELEASED_CHANNEL
from shared.worker.app import worker_app
from shared.worker.runtime import BATCH_SIZE, BATCHERS

RELAY = web.AppKey("outbox_relay", OutboxRelay)


def create_app(
    settings: Settings, *, batch_size: int = BATCH_SIZE, batchers: int = BATCHERS
) -> web.Application:
    metrics = WorkerMetrics.create(WORKER)
    order_metrics = OrderMetrics.create(metrics.registry)

    async def relay_ctx(app: web.Application) -> AsyncIterator[None]:
        relay = OutboxRelay(app[DB_POOL], app[BROKER])
        app[RELAY] = relay
        async with background(relay.run_forever(), "outbox-relay"):
            yield

    async def parked_ctx(app: web.Application) -> AsyncIterator[None]:
        queue = build_topology(settings.amqp_prefix, settings.retry_delays_s).work["orders"]
        parked = ParkedRelay(
            app[DB_POOL], app[BROKER], queue, settings.unknown_payment_park_s, order_metrics
        )
        listener = listen_forever(
            settings.database_url, RELEASED_CHANNEL, parked.wake, "parked.listen_failed"
        )
        async with (
            background(listener, "parked-listener"),
            background(parked.run_forever(), "parked-relay"),
        ):
            yield

    return worker_app(
        settings,
        metrics,
        "orders",
        lambda app: make_handler(app[DB_POOL], app[RELAY], order_metrics),
        contexts=[relay_ctx, parked_ctx],
        batch_size=batch_size,
        batchers=batchers,
    )


SERVICE = Service("orders", create_app, lambda s: s.orders_port)
