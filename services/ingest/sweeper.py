"""The sweeper: publishes stored webhooks no confirm reached (a crash or outage between commit
and confirm, and no copy since), rows locked SKIP LOCKED for one transaction, so several
ingest replicas sweep side by side."""

from __future__ import annotations

from typing import Any

import asyncpg
import structlog

from services.ingest.accept import outgoing
from shared.broker import Broker
from shared.metrics import IngestMetrics
from shared.queries import inbox as inbox_sql
from shared.tasks import keep_running

log = structlog.get_logger(__name__)

# Rows younger than this may still be waiting for the confirm of the batch that stored them
# (its database and publish deadlines together are 8 s).
SWEEP_AFTER_S = 10.0
_PUBLISH_TIMEOUT_S = 4.0


class Sweeper:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        broker: Broker,
        metrics: IngestMetrics,
        *,
        interval_s: float = 5.0,
        after_s: float = SWEEP_AFTER_S,
        batch: int = 500,
    ) -> None:
        self._pool = pool
        self._broker = broker
        self._metrics = metrics
        self._interval_s = interval_s
        self._after_s = after_s
        self._batch = batch

    async def run_forever(self) -> None:
        await keep_running(self._drain, self._interval_s, "sweeper.failed")

    async def _drain(self) -> None:
        while await self.sweep_once() == self._batch:
            pass  # a full batch all published: there may be more waiting

    async def sweep_once(self) -> int:
        """Publish one batch of stranded rows; return how many were confirmed."""
        if not self._broker.is_ready:
            return 0
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await inbox_sql.lock_unpublished(conn, self._after_s, self._batch)
            if not rows:
                return 0
            results = await self._broker.publish_many(
                [outgoing(r.provider, r.event_id, r.event_type, r.body) for r in rows],
                _PUBLISH_TIMEOUT_S,
            )
            done = [row.id for row, error in zip(rows, results, strict=True) if error is None]
            if done:
                await inbox_sql.mark_published(conn, done)
        self._metrics.sweeper_published.inc(len(done))
        log.info("sweeper.published", published=len(done), failed=len(rows) - len(done))
        return len(done)
