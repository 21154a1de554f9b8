"""The reconciler: every RECONCILE_INTERVAL, and at once when the orders worker flags an
undecided order (PostgreSQL NOTIFY), check orders against the provider's API and repair drift
through the orders queue; every RECONCILE_INTERVAL, delete rows past the retention."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import structlog
from aiohttp import web

from services.reconciler.jobs import Reconciler
from shared.amqp.broker import BROKER, broker_ctx
from shared.amqp.topology import build_topology
from shared.config import Settings, is_set
from shared.db import DB_POOL, pool_ctx
from shared.listen import listen_forever
from shared.metrics import ProviderMetrics, ReconcilerMetrics, new_registry
from shared.process.service import Service
from shared.process.tasks import background, keep_running
from shared.process.web import base_app
from shared.providers.registry import BY_NAME
from shared.providers.xhub import PROVIDER
from shared.providers.xhub.client import ProviderClient
from shared.queries.orders import UNDECIDED_CHANNEL

log = structlog.get_logger(__name__)


async def listen_for_undecided(database_url: str, wake: asyncio.Event) -> None:
    """Set `wake` whenever an order is flagged undecided; reconnects after a lost connection
    (meanwhile the loop still runs every RECONCILE_INTERVAL)."""
    await listen_forever(database_url, UNDECIDED_CHANNEL, wake, "reconcile.listen_failed")


def payment_clients(settings: Settings, metrics: ProviderMetrics) -> dict[str, ProviderClient]:
    """The payment APIs the reconciler asks, by provider. X-Hub's (XHUB_API_URL and
    XHUB_API_KEY) is required where the reconciler's environment accepts X-Hub's webhooks
    (XHUB_WEBHOOK_SECRETS): X-Hub's lost webhooks are repaired only by asking it. A deployment
    without X-Hub (Stripe's or Standard Webhooks' alone) runs the reconciler without it: it
    asks the APIs that are set (STRIPE_API_KEY), and keeps the inbox's retention and archive
    whatever it can ask."""
    clients: dict[str, ProviderClient] = {}
    if settings.xhub_api_url or settings.xhub_api_key or settings.provider_secrets.get(PROVIDER):
        clients[PROVIDER] = ProviderClient.from_settings(settings, metrics)  # says what's missing
    for name, (url, key) in settings.provider_apis.items():
        api = BY_NAME[name].payment_api
        if api is not None:
            clients[name] = ProviderClient.for_api(name, api, url, key, metrics)
    return clients


def create_app(settings: Settings) -> web.Application:
    registry = new_registry()
    metrics = ReconcilerMetrics.create(registry)
    clients = payment_clients(settings, ProviderMetrics.create(registry))
    if not clients:
        log.warning(
            "reconcile.no_payment_api",
            hint="no provider API is set (XHUB_API_URL, STRIPE_API_KEY): orders are not"
            " checked; retention and archive go on",
        )
    app = base_app(registry)
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url, max_size=4))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))

    async def loop_ctx(app: web.Application) -> AsyncIterator[None]:
        for client in clients.values():
            await client.start()

        wake = asyncio.Event()

        async def run() -> None:
            await app[BROKER].wait_connected(float("inf"))
            reconciler = Reconciler(app[DB_POOL], app[BROKER], clients, metrics, settings)
            interval_s = settings.reconcile_interval_s
            await keep_running(reconciler.run_pass, interval_s, "reconcile.pass_failed", wake)

        try:
            async with (
                background(listen_for_undecided(settings.database_url, wake), "undecided-listener"),
                background(run(), "reconciler"),
            ):
                yield
        finally:
            for client in clients.values():
                await client.close()

    app.cleanup_ctx.append(loop_ctx)
    return app


def required_env(env: Mapping[str, str]) -> tuple[str, ...]:
    """X-Hub's API where X-Hub is configured at all (payment_clients)."""
    if any(is_set(env, name) for name in (BY_NAME[PROVIDER].secrets_variable, *_XHUB_API)):
        return _XHUB_API
    return ()


_XHUB_API = ("XHUB_API_URL", "XHUB_API_KEY")
SERVICE = Service("reconciler", create_app, lambda s: s.reconciler_port, required_env)
