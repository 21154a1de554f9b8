"""The bonuses worker: consumes order transitions, keeps the bonus ledger."""

from __future__ import annotations

from aiohttp import web

from services.bonuses.handler import WORKER, make_handler
from shared.config import Settings
from shared.db import DB_POOL
from shared.metrics import BonusMetrics, WorkerMetrics
from shared.process.service import Service
from shared.worker.app import worker_app
from shared.worker.runtime import BATCH_SIZE, BATCHERS


def create_app(
    settings: Settings, *, batch_size: int = BATCH_SIZE, batchers: int = BATCHERS
) -> web.Application:
    metrics = WorkerMetrics.create(WORKER)
    bonus_metrics = BonusMetrics.create(metrics.registry)
    return worker_app(
        settings,
        metrics,
        "bonuses",
        lambda app: make_handler(app[DB_POOL], settings.bonus_points, bonus_metrics),
        batch_size=batch_size,
        batchers=batchers,
    )


SERVICE = Service("bonuses", create_app, lambda s: s.bonuses_port)
