"""Who is signed in to the console, and that a form came from the console itself.

A session is a random cookie value (HttpOnly, SameSite=Strict, Path=/console, Secure over
HTTPS) whose SHA-256 is a row of console_sessions; it lasts 8 hours from sign-in and holds only
while an operator token with the fingerprint it was opened with is still configured (rotating a
token ends its sessions). Every POST carries the CSRF cookie's value in a hidden `csrf` field
(double submit, compared in constant time) and, when the browser says where it comes from, an
Origin of this host.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Collection
from urllib.parse import urlsplit

from aiohttp import web

from services.api.auth import find_token
from shared.db import Executor
from shared.queries import console_sessions as sessions_sql
from shared.tokens import OPERATOR, Actor, AdminToken

PREFIX = "/console"
SESSION_COOKIE = "payhooks_session"
CSRF_COOKIE = "payhooks_console_csrf"
CSRF_FIELD = "csrf"
LIFETIME = dt.timedelta(hours=8)

CSRF = web.RequestKey("console_csrf", str)
SIGNED_IN = web.RequestKey("console_actor", Actor)


def _sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "replace")).digest()


class Gate:
    """The configured tokens as the console sees them: by fingerprint, operators only."""

    def __init__(self, tokens: Collection[AdminToken]) -> None:
        self._tokens = tuple(tokens)
        self._operators = {_sha256(t.token): t.actor for t in tokens if t.scope == OPERATOR}

    def token_for(self, given: str) -> AdminToken | None:
        return find_token(self._tokens, given)

    async def sign_in(self, db: Executor, token: AdminToken) -> str:
        """A new session for an operator token; the cookie value to give the browser."""
        value = secrets.token_urlsafe(32)
        await sessions_sql.open_session(
            db, _sha256(value), token.name, _sha256(token.token), LIFETIME
        )
        return value

    async def signed_in(self, db: Executor, request: web.Request) -> Actor | None:
        """The operator whose live session the request's cookie is; None if it is none."""
        value = request.cookies.get(SESSION_COOKIE)
        if not value:
            return None
        found = await sessions_sql.live_session(db, _sha256(value))
        if found is None:
            return None
        return self._operators.get(found[1])  # None once that token is no longer configured

    @staticmethod
    async def sign_out(db: Executor, request: web.Request) -> None:
        if value := request.cookies.get(SESSION_COOKIE):
            await sessions_sql.close_session(db, _sha256(value))


GATE = web.AppKey("console_gate", Gate)


def _secure(request: web.Request) -> bool:
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def set_cookie(request: web.Request, response: web.StreamResponse, name: str, value: str) -> None:
    response.set_cookie(
        name,
        value,
        path=PREFIX,
        httponly=True,
        samesite="Strict",
        secure=_secure(request),
        max_age=int(LIFETIME.total_seconds()) if name == SESSION_COOKIE else None,
    )


def see_other(location: str) -> web.Response:
    """A 303 to `location`: after a form, the browser GETs it (aiohttp's HTTPSeeOther is for
    raising, not returning)."""
    return web.Response(status=303, headers={"Location": location})


def forget_session(response: web.StreamResponse) -> None:
    response.del_cookie(SESSION_COOKIE, path=PREFIX)


def csrf_token(request: web.Request) -> str:
    """The request's CSRF cookie value, or a new one that the response will set."""
    return request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)


def same_origin(request: web.Request) -> bool:
    """No Origin (an older browser, a form tool) passes: the CSRF field still has to match."""
    origin = request.headers.get("Origin")
    return origin is None or urlsplit(origin).netloc == request.host


def csrf_matches(request: web.Request, sent: object) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not isinstance(sent, str) or not sent:
        return False
    return hmac.compare_digest(cookie.encode(), sent.encode("utf-8", "replace"))


def safe_next(target: str | None) -> str:
    """Where to go after sign-in: a console page of this host, never elsewhere."""
    if target and target.startswith(PREFIX + "/") and not any(c in target for c in "\\\r\n"):
        return target
    return PREFIX + "/"
