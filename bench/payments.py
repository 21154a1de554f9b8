"""The payments `bench.workers` sends: orders registered in bulk, one signed paid webhook per
payment, and what the database holds for them once the workers are done."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass
from decimal import Decimal

import asyncpg
import orjson

from bench.load import Delivery
from shared.providers.xhub.events import status_changed
from shared.providers.xhub.signatures import signed_headers

TEMPLATE = "payment_succeeded"


@dataclass(frozen=True, slots=True)
class Payment:
    order_id: str
    payment_id: str
    amount: str  # "12.34"

    @property
    def event_id(self) -> str:
        return f"evt_{self.payment_id}"


def make_payments(run_id: str, kind: str, n: int) -> list[Payment]:
    return [
        Payment(
            order_id=f"ord_{run_id}_{kind}{i:07d}",
            payment_id=f"pay_{run_id}_{kind}{i:07d}",
            amount=f"{(i * 7919) % 99_900 / 100 + 1:.2f}",
        )
        for i in range(n)
    ]


def make_deliveries(payments: list[Payment], secret: bytes) -> list[Delivery]:
    """One signed `payment.status_changed` paid webhook per payment, its order's money."""
    now_s = time.time()
    created_at = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
    deliveries: list[Delivery] = []
    for p in payments:
        payload = status_changed(
            p.payment_id, "paid", p.amount, "USD", created_at, external_id=p.order_id
        )
        body = orjson.dumps(payload)
        deliveries.append((signed_headers(secret, p.event_id, body, now_s), body))
    return deliveries


async def register(database_url: str, payments: list[Payment]) -> None:
    """The shop's orders, in bulk (COPY): the state PENDING, the money the webhooks carry."""
    records = [
        (
            p.order_id,
            p.payment_id,
            f"user_{i % 1000:04d}",
            f"buyer{i}@example.com",
            Decimal(p.amount),
            "USD",
        )
        for i, p in enumerate(payments)
    ]
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        await conn.copy_records_to_table(
            "orders",
            records=records,
            columns=["order_id", "payment_id", "user_id", "email", "amount", "currency"],
        )
        await conn.execute("ANALYZE orders")
    finally:
        await conn.close()


@dataclass(frozen=True, slots=True)
class Effects:
    """What the database holds for the measured payments."""

    paid_orders: int
    grants: int
    grant_points: int
    emails_sent: int
    last_grant_at: float | None  # unix time of the last measured grant's transaction


async def read_effects(database_url: str, measured_prefix: str) -> Effects:
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        ledger = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE payment_id LIKE $1) AS grants,"
            " coalesce(sum(points) FILTER (WHERE payment_id LIKE $1), 0) AS points,"
            " max(created_at) FILTER (WHERE payment_id LIKE $1) AS last_at"
            " FROM bonus_ledger WHERE kind = 'grant'",
            measured_prefix + "%",
        )
        emails = await conn.fetchrow(
            "SELECT count(*) AS sent FROM emails_sent WHERE payment_id LIKE $1 AND template = $2",
            measured_prefix + "%",
            TEMPLATE,
        )
        paid = await conn.fetchval(
            "SELECT count(*) FROM orders WHERE payment_id LIKE $1 AND status = 'PAID'",
            measured_prefix + "%",
        )
    finally:
        await conn.close()
    assert ledger is not None
    assert emails is not None
    last_at: dt.datetime | None = ledger["last_at"]
    return Effects(
        paid_orders=paid,
        grants=ledger["grants"],
        grant_points=ledger["points"],
        emails_sent=emails["sent"],
        last_grant_at=None if last_at is None else last_at.timestamp(),
    )


def settled_effects(database_url: str, measured_prefix: str, n: int, timeout_s: float) -> Effects:
    """The effects once `n` grants are in, or as they stand after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (
        effects := asyncio.run(read_effects(database_url, measured_prefix))
    ).grants < n and time.monotonic() < deadline:
        time.sleep(0.2)
    return effects
