"""The reconciler: every RECONCILE_INTERVAL, check stale orders against the provider's API
and repair drift through the orders queue; then delete rows past the retention."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from services.reconciler.jobs import BATCH, housekeeping_once, reconcile_once
from shared import service
from shared.broker import BROKER, broker_ctx
from shared.config import Settings
from shared.db import DB_POOL, pool_ctx
from shared.metrics import ProviderMetrics, ReconcilerMetrics, new_registry
from shared.provider import ProviderClient
from shared.tasks import background
from shared.topology import build_topology
from shared.web import base_app

log = structlog.get_logger(__name__)

REQUIRED_ENV = ("XHUB_API_URL", "XHUB_API_KEY")


def create_app(settings: Settings) -> web.Application:
    registry = new_registry()
    metrics = ReconcilerMetrics.create(registry)
    client = ProviderClient.from_settings(settings, ProviderMetrics.create(registry))
    app = base_app(registry)
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url, max_size=4))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))

    async def loop_ctx(app: web.Application) -> AsyncIterator[None]:
        await client.start()

        async def run() -> None:
            await app[BROKER].wait_connected(float("inf"))
            while True:
                started = time.monotonic()
                try:
                    # Full batches: more may be waiting. A pass ends after one interval, so a
                    # backlog bigger than the provider's rate limit can't starve housekeeping.
                    while (
                        await reconcile_once(
                            app[DB_POOL],
                            app[BROKER],
                            client,
                            metrics,
                            after_s=settings.reconcile_after_s,
                            again_after_s=settings.reconcile_interval_s,
                        )
                        == BATCH
                        and time.monotonic() - started < settings.reconcile_interval_s
                    ):
                        pass
                    await housekeeping_once(app[DB_POOL], settings.retention_days)
                except Exception as e:  # a pass may fail; the reconciler never does
                    log.warning("reconcile.pass_failed", error=repr(e))
                await asyncio.sleep(settings.reconcile_interval_s)

        try:
            async with background(run(), "reconciler"):
                yield
        finally:
            await client.close()

    app.cleanup_ctx.append(loop_ctx)
    return app


def main(settings: Settings) -> None:
    service.run(create_app(settings), settings.reconciler_port)
