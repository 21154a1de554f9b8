"""Running a service: one aiohttp app on uvloop, graceful on SIGTERM, with its HTTP limits;
or, where the service allows it, several copies of it on one port (shared/process/supervisor.py)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import structlog
import uvloop
from aiohttp import web

from shared import tracing
from shared.config import ConfigError, Settings
from shared.errors import EXIT_USAGE
from shared.metrics import multiprocess_registry
from shared.process.file_limit import raise_to_hard_limit
from shared.process.http_limits import HTTP_LIMITS
from shared.process.logs import configure_logging
from shared.process.supervisor import METRICS_DIR_ENV, supervise, supervised_by
from shared.process.tasks import background
from shared.process.web import REGISTRY

log = structlog.get_logger(__name__)

# In-flight requests get this long to finish after SIGTERM before connections are closed.
SHUTDOWN_TIMEOUT_S = 15.0
# Connections the kernel completes before the service accepts them (capped by
# net.core.somaxconn, 4,096 by default since Linux 5.4): X-Hub's breaker-release burst opens
# thousands at once, and an overflow is a handshake retransmitted a second later
# (docs/performance.md).
LISTEN_BACKLOG = 4096


async def _freeze_startup_objects(app: web.Application) -> None:
    # Modules, the app and its connections live as long as the process: out of the garbage
    # collector's sight, its full collections only walk what requests leave behind, which
    # shortens the latency tail (docs/performance.md).
    gc.freeze()


async def _exit_when_orphaned(supervisor_pid: int) -> None:
    try:
        handle = os.pidfd_open(supervisor_pid)  # readable once that process has exited
    except ProcessLookupError:
        handle = None
    if handle is not None:
        loop = asyncio.get_running_loop()
        gone = asyncio.Event()
        loop.add_reader(handle, gone.set)
        try:
            if os.getppid() == supervisor_pid:  # it may have died before the pidfd opened
                await gone.wait()
        finally:
            loop.remove_reader(handle)
            os.close(handle)
    log.error("service.supervisor_gone", supervisor_pid=supervisor_pid)
    os.kill(os.getpid(), signal.SIGTERM)  # the graceful stop, as if the supervisor had asked


def _supervised(app: web.Application, supervisor_pid: int) -> None:
    """One of several copies: /metrics answers for all of them; a copy whose supervisor died
    (SIGKILL leaves no time to ask it) stops instead of serving on, unseen."""
    app[REGISTRY] = multiprocess_registry(os.environ[METRICS_DIR_ENV])

    async def watch(app: web.Application) -> AsyncIterator[None]:
        async with background(_exit_when_orphaned(supervisor_pid), "supervisor-watch"):
            yield

    app.cleanup_ctx.append(watch)


def run(app: web.Application, port: int, *, ssl_context: ssl.SSLContext | None = None) -> None:
    app.on_startup.append(_freeze_startup_objects)
    if (supervisor_pid := supervised_by()) is not None:
        _supervised(app, supervisor_pid)
    web.run_app(
        app,
        port=port,
        ssl_context=ssl_context,
        loop=uvloop.new_event_loop(),
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        access_log=None,
        print=None,
        backlog=LISTEN_BACKLOG,
        reuse_port=supervisor_pid is not None,
        **app[HTTP_LIMITS].server_options(),
    )


def always(*names: str) -> Callable[[Mapping[str, str]], tuple[str, ...]]:
    """A service's required variables whatever the environment (Service.required_env)."""
    return lambda env: names


@dataclass(frozen=True, slots=True)
class Service:
    """What running one service takes: its app, its port, the variables it cannot do without."""

    name: str
    create_app: Callable[[Settings], web.Application]
    port: Callable[[Settings], int]
    # The variables it cannot start without, given the environment (the reconciler's depend on
    # which providers' webhooks it accepts).
    required_env: Callable[[Mapping[str, str]], tuple[str, ...]] = lambda env: ()
    tls: Callable[[Settings], ssl.SSLContext | None] = lambda settings: None
    # How many copies to run on the one port (INGEST_PROCESSES for ingest).
    processes: Callable[[Settings], int] = lambda settings: 1


def serve(service: Service) -> None:
    """Settings from the environment (a clear message and exit 2 when wrong), then run."""
    try:
        settings = Settings.from_env(required=service.required_env(os.environ))
    except ConfigError as e:
        sys.stderr.write(f"payhooks: {e}\n")
        raise SystemExit(EXIT_USAGE) from None
    configure_logging(settings.log_level, settings.log_format)
    raise_to_hard_limit()  # before the app: ingest sizes its in-flight cap by it
    # Traces only where OTEL_EXPORTER_OTLP_ENDPOINT asks (docs/observability.md); before the
    # app is made (base_app adds the server-span middleware then).
    tracing.configure(f"payhooks-{service.name}")
    if (copies := service.processes(settings)) > 1 and supervised_by() is None:
        raise SystemExit(supervise(service.name, copies))
    try:
        app = service.create_app(settings)  # may read more than the environment (templates)
    except ConfigError as e:
        sys.stderr.write(f"payhooks: {e}\n")
        raise SystemExit(EXIT_USAGE) from None
    run(app, service.port(settings), ssl_context=service.tls(settings))
