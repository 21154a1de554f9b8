"""The api's error middleware: every failure answers problem+json (SPEC section 7). HTTP errors
keep their status (and Allow); a dependency down or a DLQ another reader holds is 503 with
Retry-After (also any error shared/outages.py calls an outage); a body that does not arrive in
time is 408; anything unexpected a logged 500."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from services.api.responses import problem
from shared.db import TRANSIENT_DB_ERRORS
from shared.errors import Dependency, UnavailableError
from shared.ops import dlq_lock
from shared.outages import outage_of
from shared.process.http_limits import SlowBodyError

log = structlog.get_logger(__name__)

RETRY_AFTER_S = 5
_NAMES = {
    Dependency.POSTGRESQL: "PostgreSQL",
    Dependency.RABBITMQ: "RabbitMQ",
    Dependency.SMTP: "SMTP",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The codes of the HTTP errors aiohttp raises itself (unknown route, body over the limit, ...).
_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
}


def unavailable(code: str, message: str) -> web.Response:
    response = problem(503, code, message)
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise  # a redirect is not an error
        response = problem(e.status, _HTTP_CODES.get(e.status, "http_error"), e.reason.lower())
        if "Allow" in e.headers:
            response.headers["Allow"] = e.headers["Allow"]
        return response
    except UnavailableError as e:
        return unavailable("unavailable", str(e))
    except dlq_lock.DlqBusyError as e:
        return unavailable("dlq_busy", str(e))
    except SlowBodyError as e:
        response = problem(408, "request_timeout", str(e))
        response.force_close()
        return response
    except TRANSIENT_DB_ERRORS as e:
        # Refused or reset connections, pool and statement timeouts, a server starting up or
        # out of connections: the same request may well succeed in a moment.
        log.warning("request.database_unavailable", path=request.path, error=repr(e))
        return unavailable("unavailable", "PostgreSQL unavailable")
    except Exception as e:
        if (dependency := outage_of(e)) is not None:  # the workers' classification
            log.warning("request.dependency_unavailable", path=request.path, error=repr(e))
            return unavailable("unavailable", f"{_NAMES[dependency]} unavailable")
        log.exception("request.failed", method=request.method, path=request.path)
        return problem(500, "internal_error", "internal error (logged)")
