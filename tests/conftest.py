"""Fixtures: settings with loopback defaults, a migrated test database, isolated queues (in a
RabbitMQ vhost of the run's own where the broker is on this machine)."""

from __future__ import annotations

import asyncio
import contextlib
import email
import os
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest
from aiosmtpd.controller import Controller

from bench.processes import free_port
from shared.amqp.topology import Topology, build_topology, declare, delete
from shared.config import Settings
from shared.db import init_connection
from shared.migrate import migrate
from tests import dlx_guard, run_vhost

TEST_DATABASE_URL = os.environ.get(
    "TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/payhooks_test"
)
# Under pytest, pytest_configure below points this at the run's own vhost (test modules import
# it after that); `python -m tests.chaos` and other importers get the configured URL.
TEST_AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
TEST_SECRETS = ("test-secret-new", "test-secret-old")
# A broker or database that does not answer fails the test setup in this long, not at the
# 60 s pytest-timeout with a stack dump.
CONNECT_TIMEOUT_S = 30.0


# The most queues a run may hold at once. A test declares its topology with the tests' and
# the default retry delays (13 + 22 queues) and deletes them at teardown; a few run at once
# (a service still stopping, DLQ lock queues). Far below what wedged RabbitMQ 3.10 at its
# default 1,024 open files (309 quorum queues, docs/rabbitmq-limits.md), so a run gone wrong
# fails with PRECONDITION_FAILED instead.
RUN_MAX_QUEUES = 150
_RUN_VHOST: run_vhost.RunVhost | None = None
_DLX_GUARD: dlx_guard.Guard | None = None


# `make test` runs the suite on both cores (pytest-xdist), then these modules alone: each
# asserts a time budget or how work spreads over processes, which a neighbour test taking the
# other core turns into a failure that says nothing about payhooks.
SOLO = {
    "test_ingest_burst": "10,000 answers within the provider's 10 s budget",
    "test_ingest_overload": "the predicted wait of a burst",
    "test_ingest_transport": "the answer budget from the request's arrival",
    "test_ingest_outages": "answers within the budget while a dependency stalls",
    "test_ingest_processes": "the kernel spreads connections over two copies",
    "test_ingest_replicas": "copies publish within 2 s",
    "test_api_database_outage": "answers within a bound while PostgreSQL stalls",
    "test_reconcile_history": "a lost paid repaired in time behind 100,000 orders",
    "test_worker_pause": "a pause seen within a second, a rate cap held",
    "test_worker_controls": "replicas sharing one bucket's rate",
    "test_broker_restart": "a private RabbitMQ restarted under load",
    "test_broker_nodes": "a private 3-node cluster",
    "test_database_failover": "a private primary and standby",
    "test_alertmanager": "Prometheus and Alertmanager on their schedules",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SOLO:
            item.add_marker(pytest.mark.solo)


def pytest_configure(config: pytest.Config) -> None:
    """One RabbitMQ vhost per run (vhosts of killed runs deleted first), where rabbitmqctl
    reaches the broker of TEST_AMQP_URL; otherwise TEST_AMQP_URL as configured. Under
    pytest-xdist, one per worker process (the controller runs no test)."""
    global TEST_AMQP_URL, _RUN_VHOST, _DLX_GUARD
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        return
    if _DLX_GUARD is None and _RUN_VHOST is None and _local_rabbitmq():
        dlx_guard.ensure()  # a previous run's deletions may have killed it
        _DLX_GUARD = dlx_guard.Guard()
        _DLX_GUARD.start()
    if _RUN_VHOST is None and _reachable(TEST_AMQP_URL, 5672):
        _RUN_VHOST = run_vhost.create(TEST_AMQP_URL, "test", RUN_MAX_QUEUES)
        if _RUN_VHOST is not None:
            TEST_AMQP_URL = _RUN_VHOST.url


def pytest_unconfigure(config: pytest.Config) -> None:
    """Deleting the vhost deletes every queue and exchange of the run at once."""
    global _RUN_VHOST, _DLX_GUARD
    if _RUN_VHOST is not None:
        run_vhost.delete(_RUN_VHOST)
        _RUN_VHOST = None
    if _DLX_GUARD is not None:
        _DLX_GUARD.stop()
        dlx_guard.ensure()  # the vhost's deletion may have killed it
        _DLX_GUARD = None


def _local_rabbitmq() -> bool:
    host = urlsplit(TEST_AMQP_URL).hostname
    return dlx_guard.available() and host in ("127.0.0.1", "localhost", "::1")


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 1
        ):
            return True
    except OSError:
        return False


def _require_services() -> None:
    missing = [
        name
        for name, url, port in (
            ("PostgreSQL", TEST_DATABASE_URL, 5432),
            ("RabbitMQ", TEST_AMQP_URL, 5672),
        )
        if not _reachable(url, port)
    ]
    if missing:
        message = f"{' and '.join(missing)} not reachable"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must never silently skip the integration suite
        pytest.skip(message)


def database_url(name: str) -> str:
    """TEST_DATABASE_URL's server with another database."""
    return urlunsplit(urlsplit(TEST_DATABASE_URL)._replace(path=f"/{name}"))


async def _admin() -> asyncpg.Connection[Any]:
    return await asyncpg.connect(database_url("postgres"), timeout=CONNECT_TIMEOUT_S)


async def _drop_database(name: str) -> None:
    admin = await _admin()
    try:
        quoted = await admin.fetchval("SELECT quote_ident($1)", name)
        # FORCE: sessions of killed worker processes may linger.
        await admin.execute(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
    finally:
        await admin.close()


async def _drop_databases_of_dead_runs() -> None:
    """Databases that killed test runs on this machine left behind (their pid is gone)."""
    if urlsplit(TEST_DATABASE_URL).hostname not in ("127.0.0.1", "localhost", "::1"):
        return  # a shared server: another machine's run may own them
    admin = await _admin()
    try:
        names = await admin.fetch(
            "SELECT datname FROM pg_database WHERE datname ~ $1",
            rf"^{re.escape(_BASE_DATABASE)}_[0-9]+_",
        )
    finally:
        await admin.close()
    for (name,) in names:
        if not run_vhost.alive(int(name[len(_BASE_DATABASE) + 1 :].split("_")[0])):
            await _drop_database(name)


_BASE_DATABASE = urlsplit(TEST_DATABASE_URL).path.lstrip("/")


def run_database_name(purpose: str) -> str:
    """<TEST_DATABASE_URL's database>_<pid>_<purpose>: this run's, cleaned up if it dies."""
    return f"{_BASE_DATABASE}_{os.getpid()}_{purpose}"


@contextlib.contextmanager
def own_database(purpose: str) -> Iterator[str]:
    """A migrated database of this pytest run's own, dropped afterwards: its URL.

    Named <TEST_DATABASE_URL's database>_<pid>_<purpose>, so that two runs on one server never
    share rows, locks or sweepers, and a run killed half-way is cleaned up by the next one.
    """
    _require_services()
    name = run_database_name(purpose)
    url = database_url(name)
    asyncio.run(migrate(url))
    try:
        yield url
    finally:
        asyncio.run(_drop_database(name))


@pytest.fixture(scope="session")
def migrated_database() -> Iterator[str]:
    _require_services()
    asyncio.run(_drop_databases_of_dead_runs())
    with own_database("main") as url:
        yield url


# Every queue prefix this run handed out, for the sweep at the end of the session.
_PREFIXES: list[str] = []
_TEST_RETRY_DELAYS = "0.2,0.4"
# An event for a payment without an order is parked this long, then dead-lettered (about as
# soon as the short ladder above used to); the tests of parking itself set a long park.
_TEST_PARK_S = "1"
_MIN_QUEUE_AGE_S = 1.0
# Test topologies whose queues wait to be deleted until they are _MIN_QUEUE_AGE_S old, with
# when they were declared: by a later test's teardown (no test sleeps for its own), the rest
# by the session's end.
_UNDELETED: list[tuple[float, Topology]] = []
_MAX_UNDELETED = 3
# Prefixes of finished tests that had no `amqp` fixture (which deletes its test's queues),
# with when they were made: the queues their services declared (the api's, a worker's) are
# deleted by a later teardown (delete_strays), else they pile up to the vhost's cap.
_STRAYS: list[tuple[float, str]] = []
_WITH_AMQP: set[str] = set()


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:10]}."
    _PREFIXES.append(name)
    made_at = time.monotonic()
    yield name
    if name not in _WITH_AMQP:
        _STRAYS.append((made_at, name))


async def delete_strays(at_most_pending: int = _MAX_UNDELETED) -> None:
    """Delete the queues of finished tests' stray prefixes once more than `at_most_pending`
    wait, each once _MIN_QUEUE_AGE_S old (see _delete_old_topologies)."""
    if len(_STRAYS) <= at_most_pending:
        return
    try:
        connection = await aio_pika.connect(TEST_AMQP_URL, timeout=CONNECT_TIMEOUT_S)
    except Exception:  # RabbitMQ away (a test of that): a later teardown tries again
        return
    try:
        channel = await connection.channel()
        while _STRAYS:
            made_at, name = _STRAYS[0]
            await asyncio.sleep(max(0.0, _MIN_QUEUE_AGE_S - (time.monotonic() - made_at)))
            await _delete_everything(channel, name)
            _STRAYS.pop(0)
    finally:
        await connection.close()


def _topologies(prefix: str) -> list[Topology]:
    """The topologies a test's prefix can have been declared with: the tests' retry delays,
    and the defaults (services run as subprocesses without RETRY_DELAYS)."""
    delays = {Settings.from_env({"RETRY_DELAYS": _TEST_RETRY_DELAYS}).retry_delays_s}
    delays.add(Settings.from_env({}).retry_delays_s)
    return [build_topology(prefix, d) for d in sorted(delays)]


async def _delete_everything(channel: aio_pika.abc.AbstractChannel, prefix: str) -> None:
    for topology in _topologies(prefix):
        await delete(channel, topology)


@pytest.fixture(scope="session", autouse=True)
def _sweep_queues() -> Iterator[None]:
    """At the end, the last tests' queues once old enough; and without a vhost of the run's
    own (a broker on another machine), every queue of every prefix again: a service that was
    still shutting down when its test's queues were deleted may have declared some anew (left
    behind, hundreds of them once wedged this machine's RabbitMQ). With one, the vhost goes at
    the end with whatever is left in it."""
    yield
    if not _PREFIXES:
        return

    async def sweep() -> None:
        connection = await aio_pika.connect(TEST_AMQP_URL, timeout=CONNECT_TIMEOUT_S)
        try:
            channel = await connection.channel()
            if _UNDELETED:
                youngest = max(at for at, _ in _UNDELETED)
                await asyncio.sleep(max(0.0, _MIN_QUEUE_AGE_S - (time.monotonic() - youngest)))
                await _delete_old_topologies(channel)
            if _RUN_VHOST is None:
                for name in _PREFIXES:
                    await _delete_everything(channel, name)
        finally:
            await connection.close()

    with contextlib.suppress(Exception):  # RabbitMQ down: those tests failed already
        asyncio.run(sweep())


@pytest.fixture
def make_settings(migrated_database: str, prefix: str) -> Callable[..., Settings]:
    """Settings for a test; keyword arguments override environment variables by name."""

    def make(**overrides: str) -> Settings:
        env = {
            "DATABASE_URL": migrated_database,
            "AMQP_URL": TEST_AMQP_URL,
            "XHUB_WEBHOOK_SECRETS": ",".join(TEST_SECRETS),
            "AMQP_PREFIX": prefix,
            "RETRY_DELAYS": _TEST_RETRY_DELAYS,
            "UNKNOWN_PAYMENT_PARK_SECONDS": _TEST_PARK_S,
            "ADMIN_TOKEN": "test-admin-token",
        }
        env.update(overrides)
        return Settings.from_env(env)

    return make


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def topology(settings: Settings) -> Topology:
    return build_topology(settings.amqp_prefix, settings.retry_delays_s)


@pytest.fixture
async def db(migrated_database: str) -> AsyncIterator[asyncpg.Connection[Any]]:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(
        migrated_database, timeout=CONNECT_TIMEOUT_S
    )
    try:
        await init_connection(conn)
        # A previous test's service may have had a query cancelled at its shutdown that the
        # server is still finishing: the TRUNCATE can deadlock with it (seen once in CI, the
        # sweeper's join of inbox_unpublished and inbox). PostgreSQL ends one side; retry.
        for attempt in range(5):
            try:
                await conn.execute(
                    "TRUNCATE inbox, inbox_keys, inbox_archives, inbox_unpublished, orders,"
                    " order_transitions, processed_events, outbox, bonus_ledger, emails_sent,"
                    " operator_actions,"
                    " console_sessions, parked_events, refused_webhooks RESTART IDENTITY"
                )
                break
            except asyncpg.DeadlockDetectedError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.1)
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def amqp(topology: Topology) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """A plain channel for reading queues; deletes the test's queues at teardown."""
    _WITH_AMQP.add(topology.prefix)
    connection = await aio_pika.connect(TEST_AMQP_URL, timeout=CONNECT_TIMEOUT_S)
    channel = await connection.channel()
    started = time.monotonic()
    try:
        yield channel
    finally:
        if channel.is_closed:
            try:
                channel = await connection.channel()
            except (RuntimeError, aio_pika.exceptions.AMQPError):  # RabbitMQ was restarted
                with contextlib.suppress(Exception):
                    await connection.close()
                connection = await aio_pika.connect(TEST_AMQP_URL, timeout=CONNECT_TIMEOUT_S)
                channel = await connection.channel()
        _UNDELETED.append((started, topology))
        await _delete_old_topologies(channel)
        await connection.close()


async def _delete_old_topologies(channel: aio_pika.abc.AbstractChannel) -> None:
    """Delete the queues of finished tests once they are _MIN_QUEUE_AGE_S old. A quorum queue
    deleted while its dead-letter worker still starts crashes that worker, and two such
    crashes in 5 s kill RabbitMQ 3.10's dead-letter supervisor (tests/dlx_guard.py): younger
    ones wait for a later teardown rather than this test sleeping for them, unless more than
    _MAX_UNDELETED wait (the run's vhost caps its queues)."""
    while _UNDELETED:
        declared_at, topology = _UNDELETED[0]
        young_for_s = _MIN_QUEUE_AGE_S - (time.monotonic() - declared_at)
        if young_for_s > 0:
            if len(_UNDELETED) <= _MAX_UNDELETED:
                return
            await asyncio.sleep(young_for_s)
        _UNDELETED.pop(0)
        await delete(channel, topology)
        await _delete_everything(channel, topology.prefix)


@pytest.fixture
async def channel(
    amqp: aio_pika.abc.AbstractChannel, topology: Topology
) -> aio_pika.abc.AbstractChannel:
    """The test's channel (publisher confirms on) with the test topology declared."""
    await declare(amqp, topology)
    return amqp


class SmtpSink:
    """aiosmtpd handler (it calls handle_<COMMAND>) keeping every message it accepts."""

    def __init__(self) -> None:
        self.messages: list[email.message.Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(email.message_from_bytes(envelope.content))
        return "250 Message accepted for delivery"


class RefusingSink(SmtpSink):
    """An SMTP server that refuses one recipient for good (550) and keeps what it accepts."""

    def __init__(self, refused: str) -> None:
        super().__init__()
        self.refused = refused

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address == self.refused:
            return "550 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"


@contextlib.contextmanager
def smtp_server(handler: Any) -> Iterator[int]:
    """A real SMTP server (aiosmtpd, its own thread) on a free loopback port: yields the port."""
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


@pytest.fixture
def smtp() -> Iterator[tuple[SmtpSink, int]]:
    sink = SmtpSink()
    with smtp_server(sink) as port:
        yield sink, port
