"""A worker service's app: health and metrics routes, its pool and broker, what its handler
needs besides, and the Worker consuming its queue."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from aiohttp import web

from shared.batches import BatchHandler
from shared.broker import BROKER, broker_ctx
from shared.config import Settings
from shared.db import pool_ctx
from shared.metrics import WorkerMetrics
from shared.topology import WorkQueue, build_topology
from shared.web import READINESS_CHECKS, base_app
from shared.worker import BATCH_SIZE, BATCHERS, Worker

# Database connections per worker process; PostgreSQL's default of 100 connections must fit
# every replica of every service.
POOL_SIZE = 10

CleanupContext = Callable[[web.Application], AsyncIterator[None]]


def worker_app(
    settings: Settings,
    metrics: WorkerMetrics,
    queue: str,
    make_handler: Callable[[web.Application], BatchHandler],
    *,
    contexts: Sequence[CleanupContext] = (),
    batch_size: int = BATCH_SIZE,
    batchers: int = BATCHERS,
) -> web.Application:
    """`contexts` start after the pool and the broker, before the worker (its handler's
    dependencies), and stop after it."""
    app = base_app(metrics.registry)
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url, max_size=POOL_SIZE))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))
    app.cleanup_ctx.extend(contexts)
    app.cleanup_ctx.append(
        worker_ctx(
            metrics.worker,
            topology.work_queue(queue),
            make_handler,
            metrics,
            batch_size=batch_size,
            batchers=batchers,
        )
    )
    return app


def worker_ctx(
    name: str,
    queue: WorkQueue,
    make_handler: Callable[[web.Application], BatchHandler],
    metrics: WorkerMetrics,
    *,
    batch_size: int = BATCH_SIZE,
    batchers: int = BATCHERS,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that consumes `queue` with the handler built from the app."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        worker = Worker(
            name,
            app[BROKER],
            queue,
            make_handler(app),
            metrics,
            batch_size=batch_size,
            batchers=batchers,
        )

        async def consumer() -> bool:
            return await worker.consuming()

        app[READINESS_CHECKS].append(consumer)
        worker.start()
        try:
            yield
        finally:
            await worker.stop()

    return ctx
