"""The bonuses worker: consumes order transitions, keeps the bonus ledger."""

from __future__ import annotations

from aiohttp import web

from services.bonuses.handler import WORKER, make_handler
from shared.broker import broker_ctx
from shared.config import Settings
from shared.db import DB_POOL, pool_ctx
from shared.metrics import BonusMetrics, WorkerMetrics
from shared.service import Service
from shared.topology import build_topology
from shared.web import base_app
from shared.worker import BATCH_SIZE, BATCHERS, POOL_SIZE, worker_ctx


def create_app(
    settings: Settings, *, batch_size: int = BATCH_SIZE, batchers: int = BATCHERS
) -> web.Application:
    metrics = WorkerMetrics.create(WORKER)
    bonus_metrics = BonusMetrics.create(metrics.registry)
    app = base_app(metrics.registry)
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url, max_size=POOL_SIZE))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))
    app.cleanup_ctx.append(
        worker_ctx(
            WORKER,
            topology.work_queue("bonuses"),
            lambda app: make_handler(app[DB_POOL], settings.bonus_points, bonus_metrics),
            metrics,
            batch_size=batch_size,
            batchers=batchers,
        )
    )
    return app


SERVICE = Service("bonuses", create_app, lambda s: s.bonuses_port)
