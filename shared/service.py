"""Running a service: one aiohttp app on uvloop, graceful on SIGTERM, with its HTTP limits."""

from __future__ import annotations

import ssl

import uvloop
from aiohttp import web

from shared.http_limits import HTTP_LIMITS

# In-flight requests get this long to finish after SIGTERM before connections are closed.
SHUTDOWN_TIMEOUT_S = 15.0


def run(app: web.Application, port: int, *, ssl_context: ssl.SSLContext | None = None) -> None:
    web.run_app(
        app,
        port=port,
        ssl_context=ssl_context,
        loop=uvloop.new_event_loop(),
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        access_log=None,
        print=None,
        backlog=1024,
        **app[HTTP_LIMITS].server_options(),
    )
