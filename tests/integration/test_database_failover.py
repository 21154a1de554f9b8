"""DATABASE_URL naming a primary and its standby with target_session_attrs=read-write (SPEC 2):
every service writes only to the read-write host and is on a newly promoted primary within
seconds, without a restart. A real pair (tests/cluster.py: a private primary and a synchronous
hot standby on ports of their own, never the machine's shared server), failed over by kill -9 of
the primary and promotion of the standby, as an operator would."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from shared.amqp.topology import Topology
from shared.db import ReadOnlyDatabaseError, open_pool, probe_writable
from shared.migrate import migrate
from tests import cluster, faults
from tests.conftest import SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.system import effects, post, register, start_system, system_settings

# The seconds a service may take to write to the new primary once it takes writes.
FOLLOW_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def made_pair() -> Iterator[cluster.PgPair]:
    if os.geteuid() != 0:
        pytest.skip("making PostgreSQL clusters needs root (pg_createcluster, runuser)")
    try:
        with cluster.pg_pair_for_run("hatest") as made:
            asyncio.run(migrate(made.database_url()))
            yield made
    except faults.FaultUnavailableError as e:
        pytest.skip(str(e))


@pytest.fixture
def pair(made_pair: cluster.PgPair) -> cluster.PgPair:
    """The pair with a synchronous standby streaming (rebuilt after a test's failover)."""
    primary = cluster.primary_of(made_pair)
    standby = made_pair.second if primary == made_pair.first else made_pair.first
    if cluster.replication(primary).get(standby.name) != ("streaming", "sync"):
        cluster.rebuild_standby(made_pair)
    return made_pair


@pytest.fixture
async def primary_db(pair: cluster.PgPair) -> AsyncIterator[asyncpg.Connection[Any]]:
    """A connection to whichever host takes writes now."""
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pair.database_url(), timeout=5)
    try:
        yield conn
    finally:
        await conn.close()


async def _fail_over(pair: cluster.PgPair) -> faults.PgCluster:
    new, _ = await asyncio.to_thread(cluster.fail_over, pair)
    return new


async def _server_port(pool: Any) -> int:
    return int(await pool.fetchval("SELECT inet_server_port()"))


async def test_a_two_host_dsn_writes_to_the_promoted_standby_within_seconds(
    pair: cluster.PgPair,
) -> None:
    """The standby listed first (read-only, skipped), the primary second; then the primary is
    killed and the standby promoted: the same pool writes there, the row committed before the
    kill is there too (synchronous replication), no restart."""
    primary = await asyncio.to_thread(cluster.primary_of, pair)
    standby = await asyncio.to_thread(cluster.standby_of, pair)
    hosts = f"127.0.0.1:{standby.port},127.0.0.1:{primary.port}"
    dsn = f"postgresql://postgres@{hosts}/payhooks?target_session_attrs=read-write"
    async with open_pool(dsn) as pool:
        assert await _server_port(pool) == primary.port
        await pool.execute("CREATE TABLE IF NOT EXISTS failover_probe (n int)")
        await pool.execute("INSERT INTO failover_probe VALUES (1)")
        new = await _fail_over(pair)
        assert new == standby
        started = time.monotonic()

        async def write() -> bool:
            try:
                await pool.execute("INSERT INTO failover_probe VALUES (2)")
            except Exception:
                return False
            return True

        await eventually(write, bool, timeout_s=FOLLOW_WITHIN_S, interval_s=0.1)
        assert time.monotonic() - started < FOLLOW_WITHIN_S
        assert await _server_port(pool) == standby.port
        assert sorted(await pool.fetch("SELECT n FROM failover_probe")) == [(1,), (2,)]


async def test_a_pool_on_a_primary_turned_read_only_moves_to_the_one_promoted(
    pair: cluster.PgPair,
) -> None:
    """The old primary fenced (read-only, its connections alive) and the standby promoted: a
    worker's probe says read-only once, its pool drops those connections, and the next probe
    is on the new primary."""
    old = await asyncio.to_thread(cluster.primary_of, pair)
    new = await asyncio.to_thread(cluster.standby_of, pair)
    async with open_pool(pair.database_url()) as pool:
        await probe_writable(pool)
        assert await _server_port(pool) == old.port
        cluster.psql(old, "ALTER SYSTEM SET default_transaction_read_only = on")
        cluster.psql(old, "SELECT pg_reload_conf()")
        # Promoted at once: the old primary waits for no synchronous standby any more.
        cluster.psql(old, "ALTER SYSTEM SET synchronous_standby_names = ''")
        cluster.psql(old, "SELECT pg_reload_conf()")
        await asyncio.to_thread(cluster.promote, new)
        with pytest.raises(ReadOnlyDatabaseError):
            await probe_writable(pool)
        await probe_writable(pool)
        assert await _server_port(pool) == new.port


async def test_services_write_to_the_new_primary_after_a_failover_without_a_restart(
    pair: cluster.PgPair,
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    primary_db: asyncpg.Connection[Any],
) -> None:
    """Ingest, orders, bonuses and email on the pair; a payment before the failover, the
    primary killed and the standby promoted, a payment after it: each gets its effects once,
    and /readyz names the new primary."""
    settings = system_settings(make_settings, smtp[1], DATABASE_URL=pair.database_url())
    system = await start_system(aiohttp_client, settings, amqp, topology)
    done = {"status": "PAID", "bonus": 500, "ledger": ["grant"], "emails": ["payment_succeeded"]}
    await register(primary_db, "pay_before_failover")
    await post(system.ingest, payment_event("pay_before_failover"))
    await eventually(lambda: effects(primary_db, "pay_before_failover"), lambda e: e == done)
    await primary_db.close()

    new = await _fail_over(pair)
    started = time.monotonic()
    db: asyncpg.Connection[Any] = await asyncpg.connect(pair.database_url(), timeout=5)
    try:
        await register(db, "pay_after_failover")
        # X-Hub's retries: ingest answers 503 until its pool is on the new primary.
        await post(system.ingest, payment_event("pay_after_failover"))
        await eventually(
            lambda: effects(db, "pay_after_failover"),
            lambda e: e == done,
            timeout_s=FOLLOW_WITHIN_S,
        )
        assert await effects(db, "pay_before_failover") == done
        for name, clients in system.clients.items():
            ready = await clients[0].get("/readyz")
            assert ready.status == 200, name
            body = await ready.json()
            assert body["serving"]["postgresql"] == f"127.0.0.1:{new.port}", name
            metrics = await (await clients[0].get("/metrics")).text()
            info = 'payhooks_dependency_server_info{dependency="postgresql"'
            assert f'{info},server="127.0.0.1:{new.port}"}} 1.0' in metrics, name
            assert metrics.count(info) == 1, name
    finally:
        await db.close()
    followed_s = time.monotonic() - started
    assert followed_s < FOLLOW_WITHIN_S


async def test_migrate_creates_a_database_through_a_dsn_listing_the_standby_first(
    pair: cluster.PgPair,
) -> None:
    """The new database exists on the standby only once replayed; asyncpg does not skip a host
    that lacks it, so migrate waits for it instead of failing."""
    primary = await asyncio.to_thread(cluster.primary_of, pair)
    standby = await asyncio.to_thread(cluster.standby_of, pair)
    name = f"fresh_{os.getpid()}"
    hosts = f"127.0.0.1:{standby.port},127.0.0.1:{primary.port}"
    dsn = f"postgresql://postgres@{hosts}/{name}?target_session_attrs=read-write"
    try:
        applied = await migrate(dsn)
        assert applied
    finally:
        cluster.psql(primary, f"DROP DATABASE IF EXISTS {name}")
