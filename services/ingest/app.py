"""The ingest service: the webhook endpoint plus its batching acceptor and sweeper."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace

import structlog
from aiohttp import web

from services.ingest.accept import Acceptor, AcceptorConfig
from services.ingest.endpoint import ACCEPTORS, METRICS, REFUSALS, SETTINGS, webhook_handler
from services.ingest.refusals import Refusals
from services.ingest.sweeper import SWEEP_AFTER_S, Sweeper
from shared.amqp.broker import BROKER, broker_ctx
from shared.amqp.topology import build_topology
from shared.config import Settings
from shared.db import DB_POOL, pool_ctx
from shared.metrics import IngestMetrics
from shared.process.file_limit import open_files_allowed
from shared.process.http_limits import HTTP_LIMITS
from shared.process.service import Service, always
from shared.process.tasks import background
from shared.process.web import base_app
from shared.providers.registry import configured

log = structlog.get_logger(__name__)

# Webhook requests handled at once. Who waits is the accept path's admission (accept.py);
# this bounds memory (about 14 KB a request with its connection, measured on a burst of
# 10,000) and files (one a connection, FILES_KEPT_FREE left for idle keep-alive connections,
# PostgreSQL, RabbitMQ and the rest). X-Hub's breaker-release backlog comes all at once.
MAX_IN_FLIGHT = 20_000
BURST = 10_000  # the largest backlog X-Hub is expected to release at once (docs/ingest-burst.md)
FILES_KEPT_FREE = 512


def in_flight_cap(open_files: int) -> int:
    """Requests handled at once with `open_files` allowed (RLIMIT_NOFILE's soft limit)."""
    return max(64, min(MAX_IN_FLIGHT, open_files - FILES_KEPT_FREE))


def endpoint_app(settings: Settings) -> web.Application:
    """The webhook endpoints (a route per provider with secrets) and all they stand on but
    the accept paths (`ACCEPTORS`, set by a cleanup context the caller adds): ingest's, and
    the naive benchmark baseline's."""
    providers = configured(settings.provider_secrets)
    metrics = IngestMetrics.create(
        secrets={p.name: len(settings.provider_secrets[p.name]) for p in providers},
        providers=tuple(p.name for p in providers),
    )
    # Raw bodies: the signature covers the exact bytes received, so a `Content-Encoding:
    # gzip` body is checked (and stored) as sent, and then is no JSON (400), never inflated.
    app = base_app(metrics.registry, client_max_size=settings.max_body_bytes, raw_bodies=True)
    app[SETTINGS] = settings
    app[METRICS] = metrics
    open_files = open_files_allowed()
    app[HTTP_LIMITS] = replace(app[HTTP_LIMITS], max_in_flight=in_flight_cap(open_files))
    if app[HTTP_LIMITS].max_in_flight < BURST:
        log.warning(
            "ingest.file_limit_low",
            open_files=open_files,
            max_in_flight=app[HTTP_LIMITS].max_in_flight,
            needed=BURST + FILES_KEPT_FREE,
            hint="raise the hard limit on open files (ulimit -n, LimitNOFILE, container ulimits)",
        )
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url, max_size=10))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))
    app.cleanup_ctx.append(refusals_ctx)
    for provider in providers:
        app.router.add_post(provider.webhook_path, webhook_handler(provider))
    return app


async def refusals_ctx(app: web.Application) -> AsyncIterator[None]:
    """Refused event ids (401, 5xx) noted by the endpoint, written in the background."""
    refusals = Refusals()
    app[REFUSALS] = refusals
    async with background(refusals.run_forever(app[DB_POOL]), "refusals"):
        yield
    try:  # what the last second refused, if the database answers now
        async with asyncio.timeout(2.0):
            await refusals.flush(app[DB_POOL])
    except Exception as e:
        log.warning("webhook.refusals_not_written", error=repr(e), left=len(refusals))


def create_app(
    settings: Settings,
    *,
    acceptor_config: AcceptorConfig | None = None,
    sweep_interval_s: float = 5.0,
    sweep_after_s: float = SWEEP_AFTER_S,
) -> web.Application:
    app = endpoint_app(settings)

    async def acceptor_ctx(app: web.Application) -> AsyncIterator[None]:
        config = acceptor_config or AcceptorConfig()
        acceptors = {
            provider: Acceptor(app[DB_POOL], app[BROKER], app[METRICS], config, provider=provider)
            for provider in app[METRICS].providers
        }
        for acceptor in acceptors.values():
            acceptor.start()
        app[ACCEPTORS] = acceptors
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
            for acceptor in acceptors.values():
                await acceptor.close()

    app.cleanup_ctx.append(acceptor_ctx)
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
    always("XHUB_WEBHOOK_SECRETS"),
    _tls,
    processes=lambda s: s.ingest_processes,
)
