"""PostgreSQL: pool creation (jsonb via orjson, bounded timeouts) and transient-error mapping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeAlias, TypeVar

import asyncpg
import orjson
import structlog
from aiohttp import web
from asyncpg.pool import PoolConnectionProxy

from shared.config_values import several_hosts
from shared.errors import Dependency, TransientError
from shared.migrate import load_migrations
from shared.process.tasks import cancel_and_wait
from shared.process.web import READINESS_CHECKS, SERVING

# Every statement on the request path must finish well inside the provider's 10 s budget.
CONNECT_TIMEOUT_S = 3.0
COMMAND_TIMEOUT_S = 5.0
POOL_CLOSE_S = 5.0
# How often a pool over several hosts asks whether its server still takes writes: one query a
# second, and a service is on the new primary within about a second of the old one turning
# read-only.
FOLLOW_PRIMARY_EVERY_S = 1.0

log = structlog.get_logger(__name__)

T = TypeVar("T")

DB_POOL = web.AppKey("db_pool", asyncpg.Pool)

# asyncpg's Pool, Connection and pooled connection all offer fetch/execute; the functions in
# shared/queries/ take any of them.
Executor: TypeAlias = "asyncpg.Pool[Any] | asyncpg.Connection[Any] | PoolConnectionProxy[Any]"

# Errors that mean "the database is unreachable or overloaded right now", worth a retry.
TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.QueryCanceledError,
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
    asyncpg.InsufficientResourcesError,
    asyncpg.OperatorInterventionError,
)


def columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """The rows' values column by column, one list each: what `unnest($1::t[], $2::u[], ...)`
    takes to write many rows in one statement."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


async def init_connection(conn: asyncpg.Connection[Any]) -> None:
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda value: orjson.dumps(value).decode(),
        decoder=orjson.loads,
        schema="pg_catalog",
    )


async def _no_session_reset(conn: asyncpg.Connection[Any]) -> None:
    """Skip asyncpg's reset query (RESET ALL, UNLISTEN, advisory unlock...) on release: one
    round trip per release, and payhooks keeps no session state on pooled connections (no
    SET, LISTEN or advisory locks). asyncpg still rolls back an open transaction."""


ConnectionInit = Callable[["asyncpg.Connection[Any]"], Coroutine[Any, Any, None]]


async def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, init: ConnectionInit = init_connection
) -> asyncpg.Pool[Any]:
    pool: asyncpg.Pool[Any] = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        timeout=CONNECT_TIMEOUT_S,
        command_timeout=COMMAND_TIMEOUT_S,
        init=init,
        reset=_no_session_reset,
    )
    return pool


async def probe(conn: Executor) -> None:
    """One round trip; raises if the connection is gone (also one lost without a word)."""
    await conn.fetchval("SELECT 1", timeout=CONNECT_TIMEOUT_S)


class ReadOnlyDatabaseError(TransientError):
    """The server answers but takes no writes (a standby, or a primary demoted in a failover)."""

    dependency = Dependency.POSTGRESQL


_READ_ONLY = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool"


async def probe_writable(conn: Executor) -> None:
    """Raises unless the server answers and takes writes: what a worker paused for
    PostgreSQL asks before it takes work again. A pool on a read-only server drops its
    connections, so the next probe connects afresh (to the read-write host of a DATABASE_URL
    naming several, target_session_attrs=read-write)."""
    read_only = await conn.fetchval(_READ_ONLY, timeout=CONNECT_TIMEOUT_S)
    if read_only:
        if isinstance(conn, asyncpg.Pool):
            await conn.expire_connections()
        raise ReadOnlyDatabaseError("PostgreSQL takes no writes (read-only or a standby)")


async def follow_primary(pool: asyncpg.Pool[Any], every_s: float = FOLLOW_PRIMARY_EVERY_S) -> None:
    """Until cancelled: whether the server the pool is on still takes writes; once it does
    not (a primary fenced or demoted in a failover while its connections live on), the pool
    drops its connections and its next ones go to the host that does. A primary that died
    needs none of this: its connections break and the next ones skip it."""
    while True:
        await asyncio.sleep(every_s)
        try:
            read_only = await pool.fetchval(_READ_ONLY, timeout=CONNECT_TIMEOUT_S)
        except Exception:  # down or being replaced: the pool's next connection says
            continue
        if read_only:
            log.warning("db.server_read_only", action="reconnecting")
            await pool.expire_connections()


@asynccontextmanager
async def open_pool(
    dsn: str, *, max_size: int = 10, init: ConnectionInit = init_connection
) -> AsyncIterator[asyncpg.Pool[Any]]:
    """A pool for the lifetime of a service.

    min_size=0: the service starts even when PostgreSQL is down (it answers 503 until the
    database is back) instead of crashing at boot.
    """
    pool = await create_pool(dsn, min_size=0, max_size=max_size, init=init)
    try:
        yield pool
    finally:
        # close() waits for every connection to be released: a task that never gives one back
        # would hold the shutdown forever. Past the bound, the pool is terminated instead.
        try:
            await asyncio.wait_for(pool.close(), POOL_CLOSE_S)
        except TimeoutError:
            log.warning("db.pool_close_timed_out", seconds=POOL_CLOSE_S)


_SERVER = "SELECT coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'local socket')"


def pool_ctx(dsn: str, *, max_size: int = 10) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that opens the pool at startup and closes it at shutdown."""

    needed = max(m.version for m in load_migrations())

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        # The server the newest connection reached: all of them, but during a failover.
        serving: list[str] = []

        async def init(conn: asyncpg.Connection[Any]) -> None:
            await init_connection(conn)
            serving[:] = [await conn.fetchval(_SERVER)]

        app[SERVING]["postgresql"] = lambda: serving[0] if serving else None
        async with open_pool(dsn, max_size=max_size, init=init) as pool:
            app[DB_POOL] = pool

            async def database() -> bool:
                serving[:] = [await pool.fetchval(_SERVER)]
                return bool(serving[0])

            async def schema() -> bool:
                # Not ready on an older schema: a pod started (or upgraded) before its
                # migrate job finished must not take traffic it would fail.
                applied = await pool.fetchval("SELECT max(version) FROM schema_migrations")
                return applied is not None and applied >= needed

            app[READINESS_CHECKS].extend([database, schema])
            if not several_hosts(dsn):
                yield
                return
            follower = asyncio.create_task(follow_primary(pool), name="db-follow-primary")
            try:
                yield
            finally:
                await cancel_and_wait(follower)

    return ctx


async def retry_deadlock(statement: Callable[[], Awaitable[T]], attempts: int = 3) -> T:
    """Run a statement again when PostgreSQL broke a deadlock by aborting it (it was rolled
    back as a whole, so running it again is safe)."""
    for attempt in range(1, attempts + 1):
        try:
            return await statement()
        except asyncpg.DeadlockDetectedError:
            if attempt == attempts:
                raise
            log.info("db.deadlock_retried", attempt=attempt)
    raise AssertionError("unreachable")  # the loop either returns or raises
