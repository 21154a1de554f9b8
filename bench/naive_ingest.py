"""The naive baseline for `bench.ingest`: ingest without batching.

The same endpoint as `payhooks run ingest` (handler, signature check, parsing, logging,
metrics, inbox table, topology), with only the accept path replaced: per request one
`INSERT ... ON CONFLICT DO NOTHING RETURNING` in its own transaction and one awaited publish
confirm, then the answer. No sweeper: it exists to be measured, not deployed.

    python -m bench.naive_ingest     # same environment variables as `payhooks run ingest`
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, cast

import asyncpg
import orjson
from aiohttp import web

from services.ingest.accept import Acceptor, Outcome, outgoing
from services.ingest.app import SERVICE
from services.ingest.endpoint import ACCEPTOR, METRICS, SETTINGS, receive_webhook
from services.ingest.webhook import Webhook
from shared import service
from shared.broker import BROKER, Broker, broker_ctx
from shared.config import Settings
from shared.db import DB_POOL, TRANSIENT_DB_ERRORS, pool_ctx
from shared.errors import UnavailableError
from shared.metrics import IngestMetrics
from shared.topology import build_topology
from shared.web import base_app
from shared.xhub import PROVIDER, WEBHOOK_PATH

TIMEOUT_S = 4.0
_DB_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_DB_ERRORS, asyncpg.PostgresError)

_INSERT = """
INSERT INTO inbox (provider, event_id, event_type, payment_id, body, headers)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
ON CONFLICT (provider, event_id) DO NOTHING
RETURNING id
"""


class NaiveAcceptor:
    """Duck-types services.ingest.accept.Acceptor.accept, one round-trip pair per request."""

    def __init__(self, pool: asyncpg.Pool[Any], broker: Broker) -> None:
        self._pool = pool
        self._broker = broker

    async def accept(self, webhook: Webhook, headers: dict[str, str], deadline: float) -> Outcome:
        try:
            async with asyncio.timeout_at(deadline):
                row_id = await self._pool.fetchval(  # autocommit: its own transaction
                    _INSERT,
                    PROVIDER,
                    webhook.event_id,
                    webhook.event_type,
                    webhook.payment_id,
                    webhook.body,
                    orjson.dumps(headers).decode(),
                )
        except _DB_ERRORS as e:
            raise UnavailableError("PostgreSQL unavailable") from e
        if row_id is None:
            return Outcome.DUPLICATE
        message = outgoing(PROVIDER, webhook.event_id, webhook.event_type, webhook.body)
        [error] = await self._broker.publish_many([message], TIMEOUT_S)
        if error is not None:
            raise UnavailableError("RabbitMQ did not confirm") from error
        return Outcome.ACCEPTED


def create_app(settings: Settings) -> web.Application:
    metrics = IngestMetrics.create()
    app = base_app(metrics.registry, client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[METRICS] = metrics
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url, max_size=10))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))

    async def acceptor_ctx(app: web.Application) -> AsyncIterator[None]:
        app[ACCEPTOR] = cast(Acceptor, NaiveAcceptor(app[DB_POOL], app[BROKER]))
        yield

    app.cleanup_ctx.append(acceptor_ctx)
    app.router.add_post(WEBHOOK_PATH, receive_webhook)
    return app


def main() -> None:
    service.serve(replace(SERVICE, create_app=create_app))


if __name__ == "__main__":
    main()
