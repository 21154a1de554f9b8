"""The orders worker: provider events through the state machine, transitions via the outbox."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from services.orders.handler import WORKER, make_handler
from services.orders.outbox import OutboxRelay
from shared.broker import BROKER
from shared.config import Settings
from shared.db import DB_POOL
from shared.metrics import OrderMetrics, WorkerMetrics
from shared.service import Service
from shared.tasks import background
from shared.worker import BATCH_SIZE, BATCHERS
from shared.worker_app import worker_app

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

    return worker_app(
        settings,
        metrics,
        "orders",
        lambda app: make_handler(app[DB_POOL], app[RELAY], order_metrics),
        contexts=[relay_ctx],
        batch_size=batch_size,
        batchers=batchers,
    )


SERVICE = Service("orders", create_app, lambda s: s.orders_port)
