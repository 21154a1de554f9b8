"""The naive baseline for `bench.ingest`: ingest without batching.

Ingest's own app (`endpoint_app`: handler, signature check, parsing, logging, metrics, limits,
inbox table, topology), with only the accept path replaced: per request one
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
from aiohttp import web

from services.ingest.accept import Acceptor, Outcome, outgoing
from services.ingest.app import SERVICE, endpoint_app
from services.ingest.endpoint import ACCEPTORS, METRICS
from services.ingest.webhook import Webhook
from shared.amqp.broker import BROKER, Broker
from shared.config import Settings
from shared.db import DB_POOL, TRANSIENT_DB_ERRORS
from shared.errors import UnavailableError
from shared.process import service
from shared.providers.xhub import PROVIDER
from shared.queries import inbox as inbox_sql
from shared.queries.inbox import InboxEntry

TIMEOUT_S = 4.0
_DB_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_DB_ERRORS, asyncpg.PostgresError)


class NaiveAcceptor:
    """Duck-types services.ingest.accept.Acceptor.accept, one round-trip pair per request."""

    def __init__(self, pool: asyncpg.Pool[Any], broker: Broker) -> None:
        self._pool = pool
        self._broker = broker

    async def accept(self, webhook: Webhook, headers: dict[str, str], deadline: float) -> Outcome:
        try:
            async with asyncio.timeout_at(deadline):
                entry = InboxEntry(
                    webhook.event_id, webhook.event_type, webhook.payment_id, webhook.body, headers
                )
                row_id = await inbox_sql.store_one(self._pool, PROVIDER, entry)
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
    """Ingest's own app (services/ingest/app.py endpoint_app) with the naive accept path."""
    app = endpoint_app(settings)

    async def acceptor_ctx(app: web.Application) -> AsyncIterator[None]:
        naive = cast(Acceptor, NaiveAcceptor(app[DB_POOL], app[BROKER]))
        app[ACCEPTORS] = dict.fromkeys(app[METRICS].providers, naive)
        yield

    app.cleanup_ctx.append(acceptor_ctx)
    return app


def main() -> None:
    service.serve(replace(SERVICE, create_app=create_app))


if __name__ == "__main__":
    main()
