"""Running a service: one aiohttp app on uvloop, graceful on SIGTERM, with its HTTP limits."""

from __future__ import annotations

import gc
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass

import uvloop
from aiohttp import web

from shared.config import ConfigError, Settings
from shared.console import EXIT_USAGE
from shared.http_limits import HTTP_LIMITS
from shared.logs import configure_logging

# In-flight requests get this long to finish after SIGTERM before connections are closed.
SHUTDOWN_TIMEOUT_S = 15.0


async def _freeze_startup_objects(app: web.Application) -> None:
    # Modules, the app and its connections live as long as the process: out of the garbage
    # collector's sight, its full collections only walk what requests leave behind (they
    # walked every live object; at ingest's rates that showed as the latency tail: p99 at
    # c=64 went from 34-57 ms to 22-28 ms with this).
    gc.freeze()


def run(app: web.Application, port: int, *, ssl_context: ssl.SSLContext | None = None) -> None:
    app.on_startup.append(_freeze_startup_objects)
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


@dataclass(frozen=True, slots=True)
class Service:
    """What running one service takes: its app, its port, the variables it cannot do without."""

    name: str
    create_app: Callable[[Settings], web.Application]
    port: Callable[[Settings], int]
    required_env: tuple[str, ...] = ()
    tls: Callable[[Settings], ssl.SSLContext | None] = lambda settings: None


def serve(service: Service) -> None:
    """Settings from the environment (a clear message and exit 2 when wrong), then run."""
    try:
        settings = Settings.from_env(required=service.required_env)
    except ConfigError as e:
        sys.stderr.write(f"payhooks: {e}\n")
        raise SystemExit(EXIT_USAGE) from None
    configure_logging(settings.log_level, settings.log_format)
    try:
        app = service.create_app(settings)  # may read more than the environment (templates)
    except ConfigError as e:
        sys.stderr.write(f"payhooks: {e}\n")
        raise SystemExit(EXIT_USAGE) from None
    run(app, service.port(settings), ssl_context=service.tls(settings))
