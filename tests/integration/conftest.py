"""Fixtures of the integration tests that run the services together."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.api.app import create_app
from shared.amqp.topology import Topology
from shared.config import Settings
from tests.conftest import SmtpSink, delete_strays
from tests.integration.provider import FakeProvider
from tests.integration.system import System, start_system, system_settings


@pytest.fixture(autouse=True)
async def _stray_queues() -> AsyncIterator[None]:
    """After each test, the queues of earlier tests that had no `amqp` fixture (an api or a
    worker started on its own declares its topology too), once a few wait."""
    yield
    await delete_strays()


@pytest.fixture
def system_env() -> dict[str, str]:
    """Variables `system` runs with besides the tests' own (a module overrides this: a
    provider's secrets, admin tokens, a long park)."""
    return {}


@pytest.fixture
def flow_settings(
    make_settings: Callable[..., Settings], smtp: tuple[SmtpSink, int], system_env: dict[str, str]
) -> Settings:
    """The settings of `system`: the tests', the SMTP sink's port and the module's system_env
    (for an api or a CLI run beside it)."""
    return system_settings(make_settings, smtp[1], **system_env)


@pytest.fixture
async def system(
    aiohttp_client: Any, flow_settings: Settings, amqp: Any, topology: Topology, db: Any
) -> System:
    """The services of the effect path (ingest, orders, bonuses, email), each its own app as in
    production, consuming before the test starts; a module may define its own."""
    return await start_system(aiohttp_client, flow_settings, amqp, topology)


@pytest.fixture
async def api_without_rabbitmq(
    aiohttp_client: Any, make_settings: Callable[..., Settings], db: Any
) -> TestClient:
    """The api with RabbitMQ's port closed (PostgreSQL up)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once the socket is closed
    settings = make_settings(AMQP_URL=f"amqp://guest:guest@127.0.0.1:{port}/")
    client: TestClient = await aiohttp_client(create_app(settings))
    return client


@pytest.fixture
async def provider() -> Any:
    fake = FakeProvider()
    app = web.Application()
    app.router.add_get("/payments/{payment_id}", fake.get)
    server = TestServer(app)
    await server.start_server()
    fake.url = str(server.make_url(""))
    yield fake
    await server.close()
