"""The aiohttp base every service builds on: /healthz, /readyz, /metrics and HTTP limits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared import tracing
from shared.process import http_limits

ReadinessCheck = Callable[[], Awaitable[bool]]
# What /readyz adds to its answer beside the checks (a paused worker's why), by key.
ReadinessDetail = Callable[[], dict[str, object]]

REGISTRY = web.AppKey("registry", CollectorRegistry)
READINESS_CHECKS = web.AppKey("readiness_checks", list[ReadinessCheck])
# Which server of each dependency the service is on ("rabbitmq": "host:port", "postgresql":
# ...), each asked when shown (None: not known yet): /readyz shows them among its details and
# /metrics as payhooks_dependency_server_info (a cluster's node, the primary after a failover).
Serving = Callable[[], str | None]
SERVING = web.AppKey("serving", dict[str, Serving])
READINESS_DETAILS = web.AppKey("readiness_details", list[ReadinessDetail])

_READINESS_TIMEOUT_S = 2.0


def serving_now(serving: dict[str, Serving]) -> dict[str, str]:
    return {name: server for name, ask in sorted(serving.items()) if (server := ask()) is not None}


class ServingCollector(Collector):
    """payhooks_dependency_server_info{dependency,server} 1 for each server in use now."""

    def __init__(self, serving: dict[str, Serving]) -> None:
        self._serving = serving

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "payhooks_dependency_server_info",
            "The server of each dependency this process is on (host:port): the RabbitMQ node"
            " in use, the PostgreSQL server its connections reach",
            labels=["dependency", "server"],
        )
        for dependency, server in serving_now(self._serving).items():
            family.add_metric([dependency, server], 1)
        yield family


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
        middlewares=tracing.middlewares(),  # none unless tracing is on
    )
    app[REGISTRY] = registry
    app[READINESS_CHECKS] = []
    serving: dict[str, Serving] = {}
    app[SERVING] = serving
    registry.register(ServingCollector(serving))

    def serving_detail() -> dict[str, object]:
        return {"serving": serving_now(serving)}

    app[READINESS_DETAILS] = [serving_detail]
    http_limits.install(app, registry)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
