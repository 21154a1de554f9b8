"""Who a request is: its bearer token resolved to an actor (name, scope), and what the
`orders` scope (the shop's server) may reach; everything else needs `operator`."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Collection

from aiohttp import web
from aiohttp.typedefs import Middleware

from services.api.responses import problem
from shared.tokens import OPERATOR, Actor, AdminToken

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ACTOR = web.RequestKey("actor", Actor)
# (method, route) the `orders` scope may call; HEAD goes as GET. Any new route is operator-only.
ORDERS_ROUTES = frozenset(
    {
        ("POST", "/api/orders"),
        ("GET", "/api/orders/{order_id}"),
        ("GET", "/api/payments/{payment_id}"),
        ("GET", "/api/users/{user_id}/bonus"),
        ("GET", "/api/events"),
        ("GET", "/api/events/{event_id}"),
    }
)


def find_token(tokens: Collection[AdminToken], given: str) -> AdminToken | None:
    """The configured token `given` is; every token compared, each in constant time."""
    found = None
    given_bytes = given.encode("utf-8", "replace")
    for token in tokens:
        if hmac.compare_digest(given_bytes, token.token.encode()):
            found = token
    return found


def resolve(tokens: Collection[AdminToken], given: str) -> Actor | None:
    """The actor whose token this is."""
    token = find_token(tokens, given)
    return None if token is None else token.actor


def actor(request: web.Request) -> Actor:
    return request[ACTOR]  # admin_auth set it: every route with an actor is behind a token


def allowed(scope: str, method: str, route: str | None) -> bool:
    if scope == OPERATOR or route is None:  # no route: the 404 or 405 says it
        return True
    return ("GET" if method == "HEAD" else method, route) in ORDERS_ROUTES


def admin_auth(tokens: Collection[AdminToken], open_paths: Collection[str]) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        # The scheme is case-insensitive (RFC 7235).
        who = resolve(tokens, given.strip()) if scheme.lower() == "bearer" else None
        if who is None:
            return problem(401, "unauthorized", "missing or invalid admin token")
        resource = request.match_info.route.resource
        route = None if resource is None else resource.canonical
        if not allowed(who.scope, request.method, route):
            return problem(403, "forbidden", f"token {who.name} may not do this: needs operator")
        request[ACTOR] = who
        return await handler(request)

    return middleware
