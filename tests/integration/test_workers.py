"""Ingest + orders + bonuses + email against real PostgreSQL, RabbitMQ and an SMTP server."""

from __future__ import annotations

from typing import Any

import pytest

from shared.config import Settings
from shared.topology import Topology
from tests.conftest import SmtpSink
from tests.helpers import payment_event
from tests.integration.system import (
    System,
    effects,
    post,
    quiescent,
    register,
    start_system,
    system_settings,
)


@pytest.fixture
async def system(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> System:
    """All four services of the effect path, each its own app as in production."""
    settings: Settings = system_settings(make_settings, smtp[1])
    return await start_system(aiohttp_client, settings, amqp, topology)


async def test_paid_webhook_makes_order_paid_grants_bonus_and_sends_one_email(
    system: System, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    sink, _ = smtp
    await register(db, "pay_happy")

    await post(system.ingest, payment_event("pay_happy", "paid"))

    await quiescent(db, system)
    assert await effects(db, "pay_happy") == {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant"],
        "emails": ["payment_succeeded"],
    }
    assert len(sink.messages) == 1
    message = sink.messages[0]
    assert message["To"] == "pay_happy@customer.test"
    assert message["X-Payhooks-Template"] == "payment_succeeded"
    assert message["Message-ID"] == "<payment_succeeded.pay_happy@example.test>"
