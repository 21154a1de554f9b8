"""Fixtures of the integration tests that run the services together."""

from __future__ import annotations

from typing import Any

import pytest

from shared.topology import Topology
from tests.conftest import SmtpSink
from tests.integration.system import System, start_system, system_settings


@pytest.fixture
async def system(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> System:
    """The services of the effect path (ingest, orders, bonuses, email), each its own app as in
    production, consuming before the test starts; a module may define its own."""
    return await start_system(
        aiohttp_client, system_settings(make_settings, smtp[1]), amqp, topology
    )
