"""A worker service's app: health and metrics routes, its pool and broker, what its handler
needs besides, and the Worker consuming its queue, with a probe for each dependency it pauses
for (PostgreSQL, RabbitMQ, and what its contexts add to PROBES: the email worker's SMTP),
and its operator controls (pause, rate cap: shared/worker/controls.py), listened for.

An operator-paused worker answers /readyz 200 (`operator_pause` in the body says who, why,
since when): it is paused on purpose, not broken, and a 503 would stall a rolling update of
its Deployment for as long as the pause lasts. A dependency's pause stays 503."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from aiohttp import web

from shared.amqp.broker import BROKER, broker_ctx
from shared.amqp.topology import WorkQueue, build_topology
from shared.config import Settings
from shared.db import DB_POOL, pool_ctx, probe_writable
from shared.errors import Dependency
from shared.listen import listen_forever
from shared.metrics import WorkerControlMetrics, WorkerMetrics
from shared.process.tasks import background, keep_running
from shared.process.web import READINESS_CHECKS, READINESS_DETAILS, base_app
from shared.queries.worker_controls import CHANNEL as CONTROLS_CHANNEL
from shared.worker.batches import BatchHandler
from shared.worker.controls import REREAD_S, Controls
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
            database_url=settings.database_url,
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
    database_url: str | None = None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that consumes `queue` with the handler built from the app; with
    `database_url`, under its operator controls (listened for on a connection of its own)."""

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
        controls = Controls(name, pool, WorkerControlMetrics.create(metrics.registry))
        worker = Worker(
            name,
            broker,
            queue,
            make_handler(app),
            metrics,
            batch_size=batch_size,
            batchers=batchers,
            probes=probes,
            throttle=controls,
        )
        controls.attach(worker.pause)

        async def consumer() -> bool:
            # Paused is not ready from the moment it is decided, not only once the consumer
            # is cancelled (a /readyz between the two answered 200 with a pause in its body).
            if worker.pause.dependency_paused:
                return False
            if worker.pause.held is not None:  # on purpose: ready while it reaches both
                return broker.is_ready and controls.ready()
            return await worker.consuming()

        def paused() -> dict[str, object]:
            details: dict[str, object] = controls.describe() if database_url else {}
            if pauses := worker.pause.describe():
                details["paused"] = pauses
            return details

        app[READINESS_CHECKS].append(consumer)
        app[READINESS_DETAILS].append(paused)
        if database_url is None:  # no controls: run as before
            worker.start()
            try:
                yield
            finally:
                await worker.stop()
            return
        await controls.first_read()
        listener = listen_forever(
            database_url, CONTROLS_CHANNEL, controls.wake, "worker.controls_listen_failed"
        )
        rereads = keep_running(
            controls.refresh, REREAD_S, "worker.controls_read_failed", controls.wake
        )
        worker.start()
        try:
            async with (
                background(listener, f"{name}-controls-listener"),
                background(rereads, f"{name}-controls"),
            ):
                yield
        finally:
            await worker.stop()

    return ctx
