"""The operator console: server-rendered pages under /console/ for people on call, signed in
with an operator token (sessions.py), on the api's database pool and DLQ access."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from aiohttp import web

from services.api.console import (
    erase_pages,
    order_pages,
    pages,
    replay_pages,
    resolve_pages,
    worker_pages,
)
from services.api.console.guard import guard
from services.api.console.sessions import GATE, PREFIX, Gate
from shared.tokens import AdminToken

__all__ = ["PREFIX", "console_app"]


def console_app(tokens: Collection[AdminToken]) -> web.Application:
    """Mounted by the api at PREFIX (add_subapp): its pool and DLQ access come from there."""
    gate = Gate(tokens)
    app = web.Application(middlewares=[guard(gate)])
    app[GATE] = gate
    app.router.add_get("/", pages.overview)
    app.router.add_get("/sign-in", pages.sign_in_page)
    app.router.add_post("/sign-in", pages.sign_in)
    app.router.add_post("/sign-out", pages.sign_out)
    app.router.add_get("/search", pages.search)
    app.router.add_get("/payments/{payment_id:[^/]+}", pages.payment)
    app.router.add_get("/dlq", pages.dlqs)
    app.router.add_get("/dlq/{queue}", pages.dlq_page)
    app.router.add_post("/dlq/{queue}/requeue", pages.requeue_page)
    app.router.add_get("/unrouted", pages.unrouted_page)
    app.router.add_get("/audit", pages.audit_page)
    app.router.add_get("/replay", replay_pages.replay_form)
    app.router.add_post("/replay", replay_pages.replay_page)
    app.router.add_post("/payments/{payment_id:[^/]+}/resolve", resolve_pages.resolve_page)
    app.router.add_post("/payments/{payment_id:[^/]+}/order", order_pages.register_page)
    app.router.add_get("/missing", resolve_pages.missing_page)
    worker_pages.add_routes(app)
    app.router.add_post("/payments/{payment_id:[^/]+}/erase", erase_pages.erase_page)
    app.router.add_static("/static", Path(__file__).parent / "static")
    return app
