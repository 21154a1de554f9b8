"""The sweeper: publishes stored webhooks no confirm reached (a crash or outage between commit
and confirm, and no copy since), rows locked SKIP LOCKED for one transaction, so several
ingest replicas sweep side by side."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any

import asyncpg
import structlog

from services.ingest.accept import outgoing
from shared.amqp.broker import Broker
from shared.amqp.outgoing import Outgoing
from shared.amqp.relay import confirmed, drain, on_events_exchange, publish_unpublished
from shared.db import Executor
from shared.metrics import IngestMetrics
from shared.process.tasks import keep_running
from shared.queries import inbox as inbox_sql

log = structlog.get_logger(__name__)

# Rows younger than this may still be waiting for the confirm of the batch that stored them
# (its database and publish deadlines together are 8 s).
SWEEP_AFTER_S = 10.0
_PUBLISH_TIMEOUT_S = 4.0


@dataclass(frozen=True, slots=True)
class Sweeper:
    pool: asyncpg.Pool[Any]
    broker: Broker
    metrics: IngestMetrics
    _: KW_ONLY
    interval_s: float = 5.0
    after_s: float = SWEEP_AFTER_S
    batch: int = 500

    async def run_forever(self) -> None:
        await keep_running(self._drain, self.interval_s, "sweeper.failed")

    async def _drain(self) -> None:
        await drain(self.sweep_once, self.batch)

    async def sweep_once(self) -> int:
        """Publish one batch of stranded rows; return how many were confirmed."""
        outcome = await publish_unpublished(
            self.pool,
            self.broker,
            inbox_sql.lock_unpublished,
            _mark,
            on_events_exchange(self.broker, _outgoing, _PUBLISH_TIMEOUT_S),
            older_than_s=self.after_s,
            batch=self.batch,
        )
        if not outcome:
            return 0
        done = confirmed(outcome)
        self.metrics.sweeper_published.inc(done)
        log.info("sweeper.published", published=done, failed=len(outcome) - done)
        return done


def _outgoing(row: inbox_sql.Unpublished) -> Outgoing:
    return outgoing(row.provider, row.event_id, row.event_type, row.body)


async def _mark(conn: Executor, rows: list[inbox_sql.Unpublished]) -> None:
    await inbox_sql.mark_published(conn, [row.id for row in rows])
