"""The orders worker: provider events through the state machine, transitions via the outbox."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from services.orders.handler import WORKER, make_handler
from shared.broker import BROKER, broker_ctx
from shared.config import Settings
from shared.db import DB_POOL, pool_ctx
from shared.metrics import OrderMetrics, WorkerMetrics
from shared.outbox import OutboxRelay
from shared.service import Service
from shared.tasks import background
from shared.topology import build_topology
from shared.web import base_app
from shared.worker import BATCH_SIZE, BATCHERS, POOL_SIZE, worker_ctx

RELAY = web.AppKey("outbox_relay", OutboxRelay)


def create_app(
    settings: Settings, *, batch_size: int = BATCH_SIZE, batchers: int = BATCHERS
) -> web.Application:
    metrics = WorkerMetrics.create(WORKER)
    order_metrics = OrderMetrics.create(metrics.registry)
    app = base_app(metrics.registry)
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url, max_size=POOL_SIZE))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))

    async def relay_ctx(app: web.Application) -> AsyncIterator[None]:
        relay = OutboxRelay(app[DB_POOL], app[BROKER])
        app[RELAY] = relay
        async with background(relay.run_forever(), "outbox-relay"):
            yield

    app.cleanup_ctx.append(relay_ctx)
    app.cleanup_ctx.append(
        worker_ctx(
            WORKER,
            topology.work_queue("orders"),
            lambda app: make_handler(app[DB_POOL], app[RELAY], order_metrics),
            metrics,
            batch_size=batch_size,
            batchers=batchers,
        )
    )
    return app


SERVICE = Service("orders", create_app, lambda s: s.orders_port)
