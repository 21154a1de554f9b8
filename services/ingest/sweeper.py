"""The sweeper: publishes stored webhooks whose publish was never confirmed.

A row stays unpublished when the broker failed after the commit and the provider never
retried (or its retry also failed). Rows are claimed with SKIP LOCKED and a lease, so several
ingest replicas sweep without publishing the same row at the same time.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import structlog

from services.ingest.accept import AcceptorConfig, outgoing, publish_claimed
from shared import queries
from shared.broker import Broker
from shared.metrics import IngestMetrics

log = structlog.get_logger(__name__)


class Sweeper:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        broker: Broker,
        metrics: IngestMetrics,
        *,
        interval_s: float = 5.0,
        batch: int = 500,
        config: AcceptorConfig | None = None,
    ) -> None:
        self._pool = pool
        self._broker = broker
        self._metrics = metrics
        self._interval_s = interval_s
        self._batch = batch
        self._config = config or AcceptorConfig()

    async def run_forever(self) -> None:
        while True:
            try:
                while await self.sweep_once() == self._batch:
                    pass  # a full batch: there may be more waiting
            except Exception as e:  # the sweeper must outlive any outage
                log.warning("sweeper.failed", error=repr(e))
            await asyncio.sleep(self._interval_s)

    async def sweep_once(self) -> int:
        """Claim and publish one batch of stranded rows; return how many were claimed."""
        if not self._broker.is_ready:
            return 0  # claiming now would only hold the rows hostage for a lease
        claim = uuid.uuid4()
        rows = await queries.claim_unpublished(
            self._pool, claim, self._config.claim_lease_s, self._batch
        )
        if not rows:
            return 0
        pending = [(r.id, outgoing(r.provider, r.event_id, r.event_type, r.body)) for r in rows]
        results = await publish_claimed(
            self._pool, self._broker, claim, pending, self._config.publish_timeout_s
        )
        done = [row_id for (row_id, _), err in zip(pending, results, strict=True) if err is None]
        if done:
            await queries.mark_published(self._pool, done)
            self._metrics.sweeper_published.inc(len(done))
        log.info("sweeper.published", published=len(done), failed=len(rows) - len(done))
        return len(rows)
