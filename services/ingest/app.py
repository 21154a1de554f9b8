"""The ingest service: the webhook endpoint plus its batching acceptor and sweeper."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from services.ingest.accept import Acceptor, AcceptorConfig
from services.ingest.endpoint import ACCEPTOR, METRICS, SETTINGS, receive_webhook
from services.ingest.sweeper import SWEEP_AFTER_S, Sweeper
from shared.broker import BROKER, broker_ctx
from shared.config import Settings
from shared.db import DB_POOL, pool_ctx
from shared.metrics import IngestMetrics
from shared.service import Service
from shared.tasks import background
from shared.topology import build_topology
from shared.web import base_app
from shared.xhub import WEBHOOK_PATH


def create_app(
    settings: Settings,
    *,
    acceptor_config: AcceptorConfig | None = None,
    sweep_interval_s: float = 5.0,
    sweep_after_s: float = SWEEP_AFTER_S,
) -> web.Application:
    metrics = IngestMetrics.create(secrets=len(settings.webhook_secrets))
    # Raw bodies: the signature covers the exact bytes received, so a `Content-Encoding:
    # gzip` body is checked (and stored) as sent, and then is no JSON (400), never inflated.
    app = base_app(metrics.registry, client_max_size=settings.max_body_bytes, raw_bodies=True)
    app[SETTINGS] = settings
    app[METRICS] = metrics
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url, max_size=10))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))

    async def acceptor_ctx(app: web.Application) -> AsyncIterator[None]:
        config = acceptor_config or AcceptorConfig()
        acceptor = Acceptor(app[DB_POOL], app[BROKER], app[METRICS], config)
        acceptor.start()
        app[ACCEPTOR] = acceptor
        sweeper = Sweeper(
            app[DB_POOL],
            app[BROKER],
            app[METRICS],
            interval_s=sweep_interval_s,
            after_s=sweep_after_s,
        )
        try:
            async with background(sweeper.run_forever(), "sweeper"):
                yield
        finally:
            await acceptor.close()

    app.cleanup_ctx.append(acceptor_ctx)
    app.router.add_post(WEBHOOK_PATH, receive_webhook)
    return app


def _tls(settings: Settings) -> ssl.SSLContext | None:
    if not (settings.ingest_tls_cert and settings.ingest_tls_key):
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.ingest_tls_cert, settings.ingest_tls_key)
    return context


SERVICE = Service(
    "ingest",
    create_app,
    lambda s: s.ingest_port,
    ("XHUB_WEBHOOK_SECRETS",),
    _tls,
    processes=lambda s: s.ingest_processes,
)
