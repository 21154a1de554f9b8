"""Fixtures: settings with loopback defaults, a migrated test database, isolated queues."""

from __future__ import annotations

import asyncio
import email
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import asyncpg
import pytest
from aiosmtpd.controller import Controller

from shared.config import Settings
from shared.db import init_connection
from shared.migrate import migrate
from shared.topology import Topology, build_topology, delete

TEST_DATABASE_URL = os.environ.get(
    "TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/payhooks_test"
)
TEST_AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
TEST_SECRETS = ("test-secret-new", "test-secret-old")


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


@pytest.fixture(scope="session")
def migrated_database() -> str:
    _require_services()
    asyncio.run(migrate(TEST_DATABASE_URL))
    return TEST_DATABASE_URL


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture
def make_settings(migrated_database: str, prefix: str) -> Callable[..., Settings]:
    """Settings for a test; keyword arguments override environment variables by name."""

    def make(**overrides: str) -> Settings:
        env = {
            "DATABASE_URL": migrated_database,
            "AMQP_URL": TEST_AMQP_URL,
            "XHUB_WEBHOOK_SECRETS": ",".join(TEST_SECRETS),
            "AMQP_PREFIX": prefix,
            "RETRY_DELAYS": "0.2,0.4",
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
    conn: asyncpg.Connection[Any] = await asyncpg.connect(migrated_database)
    await init_connection(conn)
    await conn.execute(
        "TRUNCATE inbox, orders, order_transitions, processed_events, outbox, bonus_ledger,"
        " emails_sent RESTART IDENTITY"
    )
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def amqp(topology: Topology) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """A plain channel for reading queues; deletes the test's queues at teardown."""
    connection = await aio_pika.connect(TEST_AMQP_URL)
    channel = await connection.channel()
    try:
        yield channel
    finally:
        if channel.is_closed:
            channel = await connection.channel()
        await delete(channel, topology)
        await connection.close()


class SmtpSink:
    """aiosmtpd handler (it calls handle_<COMMAND>) keeping every message it accepts."""

    def __init__(self) -> None:
        self.messages: list[email.message.Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(email.message_from_bytes(envelope.content))
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp() -> Iterator[tuple[SmtpSink, int]]:
    sink = SmtpSink()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield sink, port
    finally:
        controller.stop()
