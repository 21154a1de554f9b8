"""The console's one middleware: every page but sign-in and the stylesheet needs a session,
every POST a CSRF field matching its cookie; every answer is HTML with headers that keep it
out of frames, caches and other sites' scripts; failures are pages, not tracebacks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import quote

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from services.api.console import sessions
from services.api.console.render import render
from services.api.console.sessions import CSRF, CSRF_COOKIE, CSRF_FIELD, SIGNED_IN, Gate
from shared.db import DB_POOL, TRANSIENT_DB_ERRORS
from shared.errors import Dependency, UnavailableError
from shared.ops import dlq_lock
from shared.outages import outage_of

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SIGN_IN = sessions.PREFIX + "/sign-in"
OPEN = frozenset({SIGN_IN})
STATIC = sessions.PREFIX + "/static/"
RETRY_AFTER_S = 5
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    UnavailableError,
    dlq_lock.DlqBusyError,
    *TRANSIENT_DB_ERRORS,
)

HEADERS = {
    # No script at all; styles from our own stylesheet; forms post only to us; never framed.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self';"
    " form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def guard(gate: Gate) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(STATIC):
            return await handler(request)
        request[CSRF] = sessions.csrf_token(request)
        response = await _answer(gate, request, handler)
        response.headers.update(HEADERS)
        if request.cookies.get(CSRF_COOKIE) != request[CSRF]:
            sessions.set_cookie(request, response, CSRF_COOKIE, request[CSRF])
        return response

    return middleware


async def _answer(gate: Gate, request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        if request.method == "POST":
            form = await request.post()
            if not sessions.same_origin(request) or not sessions.csrf_matches(
                request, form.get(CSRF_FIELD)
            ):
                return error(
                    request,
                    403,
                    "This form has expired or did not come from this console."
                    " Reload the page and try again.",
                )
        if request.path not in OPEN:
            who = await gate.signed_in(request.config_dict[DB_POOL], request)
            if who is None:
                if request.method in ("GET", "HEAD"):
                    target = f"{SIGN_IN}?next={quote(request.path_qs, safe='/')}"
                    response = sessions.see_other(target)
                    if sessions.SESSION_COOKIE in request.cookies:
                        sessions.forget_session(response)  # it ended: the browser drops it
                    return response
                return error(request, 403, "You are not signed in (or your session ended).")
            request[SIGNED_IN] = who
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise  # a redirect
        return error(request, e.status, e.reason)
    except _UNAVAILABLE as e:
        log.warning("console.unavailable", path=request.path, error=repr(e))
        later = error(request, 503, f"Try again in a few seconds: {_why(e)}")
        later.headers["Retry-After"] = str(RETRY_AFTER_S)
        return later
    except Exception as e:
        if outage_of(e) is not None:  # the workers' classification: a blip, not a bug
            log.warning("console.unavailable", path=request.path, error=repr(e))
            later = error(request, 503, f"Try again in a few seconds: {_why(e)}")
            later.headers["Retry-After"] = str(RETRY_AFTER_S)
            return later
        log.exception("console.failed", method=request.method, path=request.path)
        return error(request, 500, "Something went wrong on our side (it is logged).")


def _why(e: BaseException) -> str:
    if isinstance(e, dlq_lock.DlqBusyError):
        return "another operator or command is reading this dead-letter queue."
    if isinstance(e, UnavailableError) or outage_of(e) is Dependency.RABBITMQ:
        return "RabbitMQ is not available."
    return "PostgreSQL is not available."


def error(request: web.Request, status: int, message: str) -> web.Response:
    return render(request, "error.html", status=status, status_code=status, message=message)
