"""Ingest + orders + bonuses + email against real PostgreSQL, RabbitMQ and an SMTP server."""

from __future__ import annotations

from typing import Any

from tests.conftest import SmtpSink
from tests.helpers import payment_event
from tests.integration.system import (
    System,
    effects,
    post,
    quiescent,
    register,
)


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
