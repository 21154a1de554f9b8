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

from services.ingest.accept import AcceptorConfig
from services.ingest.publishing import ClaimedPublisher, ClaimedRow, outgoing
from shared.broker import Broker
from shared.metrics import IngestMetrics
from shared.queries import inbox as inbox_sql

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
        publisher: ClaimedPublisher,
        config: AcceptorConfig | None = None,
    ) -> None:
        self._publisher = publisher
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
                    pass  # a full batch all published: there may be more waiting
            except Exception as e:  # the sweeper must outlive any outage
                log.warning("sweeper.failed", error=repr(e))
            await asyncio.sleep(self._interval_s)

    async def sweep_once(self) -> int:
        """Claim and publish one batch of stranded rows; return how many were published."""
        if not self._broker.is_ready:
            return 0  # claiming now would only hold the rows hostage for a lease
        claim = uuid.uuid4()
        rows = await inbox_sql.claim_unpublished(
            self._pool, claim, self._config.claim_lease_s, self._batch
        )
        if not rows:
            return 0
        claimed = [
            ClaimedRow(r.id, r.event_id, outgoing(r.provider, r.event_id, r.event_type, r.body))
            for r in rows
        ]
        results = await self._publisher.publish(claim, claimed)
        done = sum(1 for err in results if err is None)
        self._metrics.sweeper_published.inc(done)
        log.info("sweeper.published", published=done, failed=len(rows) - done)
        return done
