"""The outbox relay: publishes `order.*` rows committed with their transition, oldest first,
with confirms, then marks them. A crash before the mark publishes a row twice (consumers
dedup by message id); never zero times."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import structlog

from shared.broker import Broker
from shared.messages import ORDER_TRANSITION_SCHEMA
from shared.outgoing import Outgoing
from shared.queries import outbox as outbox_sql
from shared.tasks import keep_running

log = structlog.get_logger(__name__)

_BATCH = 200
_HEADERS = {"schema": ORDER_TRANSITION_SCHEMA}  # every outbox row is an order transition
_PUBLISH_TIMEOUT_S = 5.0


class OutboxRelay:
    def __init__(
        self, pool: asyncpg.Pool[Any], broker: Broker, *, poll_interval_s: float = 1.0
    ) -> None:
        self._pool = pool
        self._broker = broker
        self._poll_interval_s = poll_interval_s
        self._wakeup = asyncio.Event()

    def notify(self) -> None:
        """A transaction just committed outbox rows: publish them now, not at the next poll."""
        self._wakeup.set()

    async def run_forever(self) -> None:
        await keep_running(self._drain, self._poll_interval_s, "outbox.relay_failed", self._wakeup)

    async def _drain(self) -> None:
        while await self.relay_once() == _BATCH:
            pass  # a full batch went out: more may be waiting

    async def relay_once(self) -> int:
        """Publish one batch of unpublished rows; return how many were confirmed."""
        if not self._broker.is_ready:
            return 0
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await outbox_sql.lock_unpublished_outbox(conn, _BATCH)
            if not rows:
                return 0
            messages = [
                Outgoing(r.routing_key, r.body, r.message_id, r.routing_key, _HEADERS) for r in rows
            ]
            results = await self._broker.publish_many(messages, _PUBLISH_TIMEOUT_S)
            # Every confirmed row is marked, whatever failed before it: all of them were sent,
            # and leaving them unmarked would only send them again (and a row that keeps
            # failing would hold back every row after it). Order across rows doesn't matter
            # to the consumers: bonuses and emails follow the order's current status.
            done = []
            for row, error in zip(rows, results, strict=True):
                if error is None:
                    done.append(row.id)
                else:
                    log.warning(
                        "outbox.publish_failed", message_id=row.message_id, error=repr(error)
                    )
            if done:
                await outbox_sql.mark_outbox_published(conn, done)
        return len(done)
