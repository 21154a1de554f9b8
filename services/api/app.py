"""The api service: operator and shop routes behind the admin tokens (services/api/auth.py),
and the operator console under /console/ (services/api/console/), which signs people in
with those tokens and answers in HTML."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from services.api import (
    audit_routes,
    dlq_routes,
    erasure_routes,
    errors,
    event_routes,
    monitor,
    openapi,
    order_routes,
    replay_routes,
    resolve_routes,
    worker_routes,
)
from services.api.auth import admin_auth
from services.api.console import PREFIX as CONSOLE
from services.api.console import console_app
from services.api.dlq_access import DLQ_ACCESS, DlqAccess
from services.api.responses import json_response, problem
from shared.amqp.broker import BROKER, broker_ctx
from shared.amqp.topology import build_topology
from shared.config import Settings
from shared.db import DB_POOL, pool_ctx
from shared.metrics import QueueMetrics, new_registry
from shared.ops.order_input import text_problem
from shared.process.service import Service, always
from shared.process.tasks import background
from shared.process.web import base_app

# The OpenAPI document is a contract and holds no data: clients and tools read it without the
# token, like the probes and the scrape.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", openapi.PATH})
# Path parameters that reach PostgreSQL, checked here once for every route that takes one.
_PATH_IDS = ("order_id", "payment_id", "user_id", "event_id")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def path_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    for name in _PATH_IDS:
        value = request.match_info.get(name)
        if value is not None and (why := text_problem(value)):
            return problem(400, "invalid_request", f"{name} {why}")
    return await handler(request)


def api_only(middleware: Middleware) -> Middleware:
    """The JSON api's middlewares (bearer tokens, problem+json) leave the console alone."""

    @web.middleware
    async def wrapped(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == CONSOLE or request.path.startswith(CONSOLE + "/"):
            return await handler(request)
        return await middleware(request, handler)

    return wrapped


async def to_console(request: web.Request) -> web.Response:
    raise web.HTTPPermanentRedirect(CONSOLE + "/")


async def openapi_document(request: web.Request) -> web.Response:
    return json_response(openapi.DOCUMENT)


def create_app(
    settings: Settings, *, monitor_interval_s: float = monitor.INTERVAL_S
) -> web.Application:
    if not settings.admin_tokens:
        raise ValueError("ADMIN_TOKEN or ADMIN_TOKENS is required by the api")
    registry = new_registry()
    queue_metrics = QueueMetrics.create(registry)
    app = base_app(registry)
    app[monitor.PASSES] = passes = monitor.Passes()
    app[erasure_routes.ARCHIVE_DIR] = settings.archive_dir
    app.middlewares.append(api_only(errors.json_errors))  # first: outside every other
    app.middlewares.append(api_only(admin_auth(settings.admin_tokens, OPEN_PATHS)))
    app.middlewares.append(api_only(path_ids))
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    app.cleanup_ctx.append(pool_ctx(settings.database_url))
    app.cleanup_ctx.append(broker_ctx(settings.amqp_url, topology))

    async def monitor_ctx(app: web.Application) -> AsyncIterator[None]:
        access = DlqAccess(app[BROKER])
        app[DLQ_ACCESS] = access

        async def run() -> None:
            await app[BROKER].wait_connected(float("inf"))
            await monitor.run_forever(
                app[DB_POOL], access, queue_metrics, passes, monitor_interval_s
            )

        async with background(run(), "queue-monitor"):
            yield

    app.cleanup_ctx.append(monitor_ctx)
    app.router.add_post("/api/orders", order_routes.register_order)
    # Any id up to the next "/" (sent as %2F when it holds one): aiohttp's default pattern
    # leaves out "{" and "}", which ids may hold.
    app.router.add_get("/api/orders/{order_id:[^/]+}", order_routes.get_order)
    app.router.add_get("/api/payments/{payment_id:[^/]+}", order_routes.get_payment)
    app.router.add_get("/api/users/{user_id:[^/]+}/bonus", order_routes.get_user_bonus)
    app.router.add_get("/api/events", event_routes.list_events)
    app.router.add_get("/api/events/{event_id:[^/]+}", event_routes.get_event)
    app.router.add_get("/api/dlq", dlq_routes.list_dlqs)
    app.router.add_get("/api/dlq/{queue}", dlq_routes.show_dlq)
    app.router.add_post("/api/dlq/{queue}/requeue", dlq_routes.requeue_dlq)
    app.router.add_get("/api/unrouted", dlq_routes.show_unrouted)
    app.router.add_get("/api/audit", audit_routes.list_actions)
    app.router.add_post("/api/replay", replay_routes.replay)
    app.router.add_post("/api/payments/{payment_id:[^/]+}/resolve", resolve_routes.resolve_order)
    app.router.add_get("/api/missing", resolve_routes.get_missing)
    app.router.add_get("/api/workers", worker_routes.list_workers)
    app.router.add_post("/api/workers/{worker}/pause", worker_routes.pause_worker)
    app.router.add_post("/api/workers/{worker}/resume", worker_routes.resume_worker)
    app.router.add_post("/api/workers/{worker}/throttle", worker_routes.throttle_worker)
    app.router.add_delete("/api/workers/{worker}/throttle", worker_routes.unthrottle_worker)
    app.router.add_post("/api/erasures", erasure_routes.erase_person)
    app.router.add_get(openapi.PATH, openapi_document)
    app.router.add_get(CONSOLE, to_console)
    app.add_subapp(CONSOLE, console_app(settings.admin_tokens))
    return app


SERVICE = Service("api", create_app, lambda s: s.api_port, always("ADMIN_TOKEN|ADMIN_TOKENS"))
