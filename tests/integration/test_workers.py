"""Ingest + orders + bonuses + email against real PostgreSQL, RabbitMQ and an SMTP server."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from services.bonuses.app import create_app as bonuses_app
from services.email.app import create_app as email_app
from services.ingest.app import create_app as ingest_app
from services.orders.app import create_app as orders_app
from shared import queries
from shared.broker import BROKER
from shared.config import Settings
from tests.conftest import TEST_SECRETS, SmtpSink
from tests.helpers import delivery, eventually, payment_event

SECRET = TEST_SECRETS[0]


@pytest.fixture
def system_settings(make_settings: Any, smtp: tuple[SmtpSink, int]) -> Settings:
    return make_settings(SMTP_PORT=str(smtp[1]), EMAIL_FROM="shop@example.test")


@pytest.fixture
async def system(
    aiohttp_client: Any, system_settings: Settings, amqp: Any, db: Any
) -> dict[str, TestClient]:
    """All four services of the effect path, each its own app as in production."""
    clients = {}
    for name, factory in (
        ("ingest", ingest_app),
        ("orders", orders_app),
        ("bonuses", bonuses_app),
        ("email", email_app),
    ):
        app: web.Application = factory(system_settings)
        clients[name] = await aiohttp_client(app)
        await app[BROKER].wait_connected(10)
    return clients


async def register(db: Any, payment_id: str, amount: str = "100.00") -> None:
    await queries.register_order(
        db,
        queries.NewOrder(
            order_id=f"ord_{payment_id}",
            payment_id=payment_id,
            user_id=f"user_{payment_id}",
            email=f"{payment_id}@customer.test",
            amount=Decimal(amount),
            currency="USD",
        ),
    )


async def post(client: TestClient, payload: dict[str, Any], event_id: str | None = None) -> Any:
    body, headers = delivery(payload, SECRET, event_id=event_id)
    response = await client.post("/webhooks/xhub", data=body, headers=headers)
    assert response.status == 200, await response.text()
    return await response.json()


async def effects(db: Any, payment_id: str) -> dict[str, Any]:
    order = await db.fetchrow("SELECT status FROM orders WHERE payment_id = $1", payment_id)
    ledger = await db.fetch(
        "SELECT kind, points FROM bonus_ledger WHERE payment_id = $1 ORDER BY id", payment_id
    )
    emails = await db.fetch(
        "SELECT template FROM emails_sent WHERE payment_id = $1 ORDER BY template", payment_id
    )
    return {
        "status": order["status"],
        "bonus": sum(r["points"] for r in ledger),
        "ledger": [r["kind"] for r in ledger],
        "emails": [r["template"] for r in emails],
    }


async def test_paid_webhook_makes_order_paid_grants_bonus_and_sends_one_email(
    system: dict[str, TestClient], db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    sink, _ = smtp
    await register(db, "pay_happy")

    await post(system["ingest"], payment_event("pay_happy", "paid"))

    state = await eventually(
        lambda: effects(db, "pay_happy"),
        lambda e: e["status"] == "PAID" and e["emails"] and e["bonus"],
    )
    assert state == {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant"],
        "emails": ["payment_succeeded"],
    }
    await eventually(lambda: asyncio.sleep(0, sink.messages), lambda m: len(m) == 1)
    message = sink.messages[0]
    assert message["To"] == "pay_happy@customer.test"
    assert message["X-Payhooks-Template"] == "payment_succeeded"
    assert message["Message-ID"] == "<payment_succeeded.pay_happy@example.test>"
