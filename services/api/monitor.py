"""The api's monitor loop: queue depths, work queue consumers, DLQ ages, publish backlogs,
undecided orders and parked events as gauges."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import structlog
from aiohttp import web

from services.api.dlq_access import DlqAccess
from shared.metrics import QueueMetrics
from shared.ops import dlq
from shared.process.tasks import keep_running
from shared.queries import inbox as inbox_sql
from shared.queries import orders as orders_sql
from shared.queries import outbox as outbox_sql
from shared.queries import parked as parked_sql

log = structlog.get_logger(__name__)

INTERVAL_S = 15.0
# Workers started with the api attach their consumers within seconds of it: a pass begun
# sooner after the api's start may count none of them yet.
STARTING_S = 15.0


@dataclass
class Passes:
    """When the api started and when its monitor's last complete pass began (monotonic)."""

    started_at: float = field(default_factory=time.monotonic)
    last_at: float | None = None

    @property
    def measured(self) -> bool:
        return self.last_at is not None

    @property
    def consumers_measured(self) -> bool:
        """A pass has counted the consumers of workers started with the api."""
        return self.last_at is not None and self.last_at - self.started_at >= STARTING_S


PASSES = web.AppKey("monitor_passes", Passes)


async def refresh(
    pool: asyncpg.Pool[Any], access: DlqAccess, metrics: QueueMetrics, passes: Passes
) -> None:
    begun = time.monotonic()
    topology = access.topology

    def label(name: str) -> str:
        # Labels are the queue names of SPEC section 4 whatever AMQP_PREFIX is, so alert
        # rules and dashboards match every deployment.
        return name.removeprefix(topology.prefix)

    async with access.channel() as channel:
        work = {w.name for w in topology.work.values()}
        names = [n for w in topology.work.values() for n in (w.name, w.dlq)]
        for name in [*names, topology.unrouted]:
            counts = await dlq.counts(channel, name)
            metrics.queue_messages.labels(queue=label(name)).set(counts.messages)
            if name in work:  # DLQs and unrouted have no consumer by design
                metrics.queue_consumers.labels(queue=label(name)).set(counts.consumers)
    async with access.channel() as channel:
        # Reading a DLQ's messages is needed for their age; only done for non-empty ones.
        for stat in await dlq.stats(channel, topology):
            metrics.oldest_age.labels(queue=label(stat.queue)).set(stat.oldest_age_seconds or 0)
    inbox = await inbox_sql.unpublished_count(pool)
    outbox = await outbox_sql.unpublished_count(pool)
    metrics.inbox_unpublished.set(inbox)
    metrics.outbox_backlog.set(outbox)
    undecided, oldest_s = await orders_sql.undecided_backlog(pool)
    metrics.orders_undecided.set(undecided)
    metrics.orders_undecided_oldest.set(oldest_s)
    parked, parked_oldest_s = await parked_sql.waiting(pool)
    metrics.parked_events.set(parked)
    metrics.parked_oldest.set(parked_oldest_s)
    passes.last_at = begun


async def run_forever(
    pool: asyncpg.Pool[Any],
    access: DlqAccess,
    metrics: QueueMetrics,
    passes: Passes,
    interval_s: float,
) -> None:
    await keep_running(lambda: refresh(pool, access, metrics, passes), interval_s, "monitor.failed")
