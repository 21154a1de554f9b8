"""The reconciler: every RECONCILE_INTERVAL, and at once when the orders worker flags an
undecided order (PostgreSQL NOTIFY), check orders against the provider's API and repair drift
through the orders queue; every RECONCILE_INTERVAL, delete rows past the retention."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from services.reconciler.jobs import Reconciler
from shared.amqp.broker import BROKER, broker_ctx
from shared.amqp.topology import build_topology
from shared.config import Settings
from shared.db import DB_POOL, pool_ctx
from shared.listen import listen_forever
from shared.metrics import ProviderMetrics, ReconcilerMetrics, new_registry
from shared.process.service import Service
from shared.process.tasks import background, keep_running
from shared.process.web import base_app
from shared.providers.registry import BY_NAME
from shared.providers.xhub.client import ProviderClient
from shared.queries.orders import UNDECIDED_CHANNEL

log = structlog.get_logger(__name__)


async def listen_for_undecided(database_url: str, wake: asyncio.Event) -> None:
    """Set `wake` whenever an order is flagged undecided; reconnects after a lost connection
    (meanwhile the loop still runs every RECONCILE_INTERVAL)."""
    await listen_forever(database_url, UNDECIDED_CHANNEL, wake, "reconcile.listen_failed")


def create_app(settings: Settings) -> web.Application:
    registry = new_registry()
    metrics = ReconcilerMetrics.create(registry)
    provider_metrics = ProviderMetrics.create(registry)
    client = ProviderClient.from_settings(settings, provider_metrics)
    # Other providers' payment APIs, those whose key is set (STRIPE_API_KEY): by name.
    others = {}
    for name, (url, key) in settings.provider_apis.items():
        api = BY_NAME[name].payment_api
        if api is not None:
            others[name] = ProviderClient.for_api(api, url, key, provider_metrics)
    app = base_app(registry)
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url, max_size=4))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))

    async def loop_ctx(app: web.Application) -> AsyncIterator[None]:
        await client.start()
        for other in others.values():
            await other.start()

        wake = asyncio.Event()

        async def run() -> None:
            await app[BROKER].wait_connected(float("inf"))
            reconciler = Reconciler(app[DB_POOL], app[BROKER], client, metrics, settings, others)
            interval_s = settings.reconcile_interval_s
            await keep_running(reconciler.run_pass, interval_s, "reconcile.pass_failed", wake)

        try:
            async with (
                background(listen_for_undecided(settings.database_url, wake), "undecided-listener"),
                background(run(), "reconciler"),
            ):
                yield
        finally:
            await client.close()
            for other in others.values():
                await other.close()

    app.cleanup_ctx.append(loop_ctx)
    return app


SERVICE = Service(
    "reconciler", create_app, lambda s: s.reconciler_port, ("XHUB_API_URL", "XHUB_API_KEY")
)
