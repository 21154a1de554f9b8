"""The api's monitor loop: queue depths, DLQ ages and publish backlogs as gauges."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import structlog

from services.api.dlq_access import DlqAccess
from shared import dlq, queries
from shared.metrics import QueueMetrics

log = structlog.get_logger(__name__)

INTERVAL_S = 15.0


async def refresh(pool: asyncpg.Pool[Any], access: DlqAccess, metrics: QueueMetrics) -> None:
    topology = access.topology
    async with access.channel() as channel:
        for work in topology.work.values():
            for name in (work.name, work.dlq):
                metrics.queue_messages.labels(queue=name).set(await dlq.depth(channel, name))
        metrics.queue_messages.labels(queue=topology.unrouted).set(
            await dlq.depth(channel, topology.unrouted)
        )
    async with access.channel() as channel:
        # Reading a DLQ's messages is needed for their age; only done for non-empty ones.
        for stat in await dlq.stats(channel, topology):
            metrics.oldest_age.labels(queue=stat.queue).set(stat.oldest_age_seconds or 0)
    inbox, outbox = await queries.backlog(pool)
    metrics.inbox_unpublished.set(inbox)
    metrics.outbox_backlog.set(outbox)


async def run_forever(
    pool: asyncpg.Pool[Any], access: DlqAccess, metrics: QueueMetrics, interval_s: float
) -> None:
    while True:
        try:
            await refresh(pool, access, metrics)
        except Exception as e:  # the gauges go stale; the next round tries again
            log.warning("monitor.failed", error=repr(e))
        await asyncio.sleep(interval_s)
