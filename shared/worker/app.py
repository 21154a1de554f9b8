"""A worker service's app: health and metrics routes, its pool and broker, what its handler
needs besides, and the Worker consuming its queue, with a probe for each dependency it pauses
for (PostgreSQL, RabbitMQ, and what its contexts add to PROBES: the email worker's SMTP)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from aiohttp import web

from shared.amqp.broker import BROKER, broker_ctx
from shared.amqp.topology import WorkQueue, build_topology
from shared.config import Settings
from shared.db import DB_POOL, pool_ctx, probe_writable
from shared.errors import Dependency
from shared.metrics import WorkerMetrics
from shared.process.web import READINESS_CHECKS, READINESS_DETAILS, base_app
from shared.worker.batches import BatchHandler
from shared.worker.pause import Probe
from shared.worker.runtime import BATCH_SIZE, BATCHERS, Worker

# Database connections per worker process; PostgreSQL's default of 100 connections must fit
# every replica of every service.
POOL_SIZE = 10

CleanupContext = Callable[[web.Application], AsyncIterator[None]]

# Probes of the dependencies a worker's handler needs besides PostgreSQL and RabbitMQ.
PROBES = web.AppKey("dependency_probes", dict[Dependency, Probe])


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
    app[PROBES] = {}
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
        pool, broker = app[DB_POOL], app[BROKER]

        async def postgresql() -> None:
            await probe_writable(pool)

        probes: dict[Dependency, Probe] = {
            Dependency.POSTGRESQL: postgresql,
            Dependency.RABBITMQ: broker.probe,
        }
        extra: dict[Dependency, Probe] | None = app.get(PROBES)
        probes.update(extra or {})
        worker = Worker(
            name,
            broker,
            queue,
            make_handler(app),
            metrics,
            batch_size=batch_size,
            batchers=batchers,
            probes=probes,
        )

        async def consumer() -> bool:
            # Paused is not ready from the moment it is decided, not only once the consumer
            # is cancelled (a /readyz between the two answered 200 with a pause in its body).
            return not worker.pause.is_paused and await worker.consuming()

        def paused() -> dict[str, object]:
            return {"paused": pauses} if (pauses := worker.pause.describe()) else {}

        app[READINESS_CHECKS].append(consumer)
        app[READINESS_DETAILS].append(paused)
        worker.start()
        try:
            yield
        finally:
            await worker.stop()

    return ctx
