"""The aiohttp base every service builds on: /healthz, /readyz, /metrics and HTTP limits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from shared.process import http_limits

ReadinessCheck = Callable[[], Awaitable[bool]]
# What /readyz adds to its answer beside the checks (a paused worker's why), by key.
ReadinessDetail = Callable[[], dict[str, object]]

REGISTRY = web.AppKey("registry", CollectorRegistry)
READINESS_CHECKS = web.AppKey("readiness_checks", list[ReadinessCheck])
# Which server of each dependency the service is on ("rabbitmq": "host:port", "postgresql":
# ...), written by the readiness checks as they run; /readyz shows it among its details (a
# cluster's node, the primary after a failover).
SERVING = web.AppKey("serving", dict[str, str])
READINESS_DETAILS = web.AppKey("readiness_details", list[ReadinessDetail])

_READINESS_TIMEOUT_S = 2.0


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    failing = []
    for check in request.app[READINESS_CHECKS]:
        try:
            async with asyncio.timeout(_READINESS_TIMEOUT_S):
                ok = await check()
        except Exception:  # any failure of a check means "not ready"
            ok = False
        if not ok:
            failing.append(getattr(check, "__name__", "check"))
    details: dict[str, object] = {}
    for detail in request.app[READINESS_DETAILS]:
        details.update(detail())
    if failing:
        return web.json_response(
            {"status": "unavailable", "failing": failing, **details}, status=503
        )
    return web.json_response({"status": "ready", **details})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def base_app(
    registry: CollectorRegistry, *, client_max_size: int = 1024**2, raw_bodies: bool = False
) -> web.Application:
    """An app with /healthz, /readyz, /metrics and shared/process/http_limits.py's limits.
    `raw_bodies`: request bodies are read as sent, never decompressed by `Content-Encoding` (what a
    signature covers)."""
    app = web.Application(
        client_max_size=client_max_size,
        handler_args={"auto_decompress": False} if raw_bodies else None,
    )
    app[REGISTRY] = registry
    app[READINESS_CHECKS] = []
    serving: dict[str, str] = {}
    app[SERVING] = serving

    def serving_detail() -> dict[str, object]:
        return {"serving": dict(sorted(serving.items()))}

    app[READINESS_DETAILS] = [serving_detail]
    http_limits.install(app, registry)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
