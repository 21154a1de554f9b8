"""The api service: operator and shop routes behind the admin token."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from services.api import handlers
from shared import service
from shared.config import Settings
from shared.db import pool_ctx
from shared.metrics import new_registry
from shared.web import base_app

REQUIRED_ENV = ("ADMIN_TOKEN",)

_OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def admin_auth(token: str) -> Middleware:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in _OPEN_PATHS:
            given = request.headers.get("Authorization", "").encode("utf-8", "replace")
            if not hmac.compare_digest(given, expected):
                return handlers.json_error(401, "missing or invalid admin token")
        return await handler(request)

    return middleware


def create_app(settings: Settings) -> web.Application:
    if not settings.admin_token:
        raise ValueError("ADMIN_TOKEN is required by the api")
    app = base_app(new_registry())
    app.middlewares.append(admin_auth(settings.admin_token))
    app.cleanup_ctx.append(pool_ctx(settings.database_url))
    app.router.add_post("/api/orders", handlers.register_order)
    app.router.add_get("/api/orders/{order_id}", handlers.get_order)
    return app


def main(settings: Settings) -> None:
    service.run(create_app(settings), settings.api_port)
