"""What one client can hold of a service's HTTP server: idle and slow connections, and how
many requests are handled at once. base_app installs these; shared/process/service.py runs with
them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypedDict

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

RETRY_AFTER_S = "5"
# Always answered: a liveness probe failing under load would get the process killed.
_UNLIMITED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class ServerOptions(TypedDict):
    keepalive_timeout: float
    lingering_time: float


@dataclass(frozen=True, slots=True)
class HttpLimits:
    # An idle keep-alive connection is closed after this. aiohttp arms the same timer when a
    # connection opens and after each answer, and does not rearm it for partial data, so it
    # also bounds how long a request's line and headers may trickle in (slowloris). A proxy
    # in front must close its idle upstream connections sooner than this.
    keepalive_timeout_s: float = 15.0
    # A request's body must have arrived this long after its headers (read_body).
    body_timeout_s: float = 5.0
    # After answering a request whose body was not read to its end, aiohttp reads and drops
    # the rest for at most this long (so the client sees the answer), then closes.
    lingering_s: float = 2.0
    # Requests handled at once; beyond it a request is answered 503 at once. Connections
    # without a request are bounded by keepalive_timeout_s (and the process's file limit).
    max_in_flight: int = 1024

    def server_options(self) -> ServerOptions:
        """Keyword arguments for web.run_app / AppRunner / TestServer."""
        return ServerOptions(
            keepalive_timeout=self.keepalive_timeout_s, lingering_time=self.lingering_s
        )


class _InFlight:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.count = 0
        self.shed = Counter(
            "payhooks_http_requests_shed",
            "Requests answered 503 at once because the server had its maximum in flight.",
            registry=registry,
        )


HTTP_LIMITS = web.AppKey("http_limits", HttpLimits)
_IN_FLIGHT = web.AppKey("http_in_flight", _InFlight)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SlowBodyError(Exception):
    """The request's body did not arrive within HttpLimits.body_timeout_s."""


def install(app: web.Application, registry: CollectorRegistry) -> None:
    """Default limits (an app may replace app[HTTP_LIMITS] before it starts) and the
    in-flight cap, outermost of the app's middlewares."""
    app[HTTP_LIMITS] = HttpLimits()
    app[_IN_FLIGHT] = _InFlight(registry)
    app.middlewares.insert(0, _limit_in_flight)


@web.middleware
async def _limit_in_flight(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in _UNLIMITED_PATHS:
        return await handler(request)
    in_flight = request.app[_IN_FLIGHT]
    if in_flight.count >= request.app[HTTP_LIMITS].max_in_flight:
        in_flight.shed.inc()
        return web.json_response(
            {"status": "unavailable", "error": "too many requests in flight, retry later"},
            status=503,
            headers={"Retry-After": RETRY_AFTER_S},
        )
    in_flight.count += 1
    try:
        return await handler(request)
    finally:
        in_flight.count -= 1


async def read_body(request: web.Request) -> bytes:
    """The request's body, whole, within the app's body timeout (SlowBodyError otherwise).
    aiohttp's own errors (over client_max_size, a broken chunked encoding) pass through."""
    if request.content.is_eof():  # all of it has arrived already: nothing to wait for
        return await request.read()
    deadline = asyncio.timeout(request.app[HTTP_LIMITS].body_timeout_s)
    try:
        async with deadline:
            return await request.read()
    except TimeoutError:
        if not deadline.expired():
            raise
        raise SlowBodyError("request body not received in time") from None
