"""Parked early webhooks (SPEC section 5): an event for a payment without an order waits in
parked_events, not on the retry ladder; the order's registration releases it and it takes
effect once; a park that runs out dead-letters it with reason unknown_payment.

Real PostgreSQL, RabbitMQ and an aiosmtpd server; the services run as their own aiohttp apps.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import orjson
import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from services.api.app import create_app as api_app
from services.ingest.accept import outgoing
from shared.amqp.broker import BROKER
from shared.amqp.outgoing import to_message
from shared.amqp.topology import Topology
from shared.db import create_pool
from shared.ops import dlq, dlq_moves
from shared.process.web import REGISTRY
from shared.queries import orders as orders_sql
from shared.queries import parked as parked_sql
from tests.conftest import SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    System,
    depths,
    dlqs,
    paid_once,
    post,
    quiescent,
    register,
    start_system,
    system_settings,
)
from tests.integration.test_dlq import new_id

AUTH = {"Authorization": "Bearer test-admin-token"}
LONG_PARK = "3600"  # nothing runs out during a test


@pytest.fixture
async def parking(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> System:
    """The effect path with two orders workers and a park no test outlives."""
    settings = system_settings(make_settings, smtp[1], UNKNOWN_PAYMENT_PARK_SECONDS=LONG_PARK)
    return await start_system(
        aiohttp_client,
        settings,
        amqp,
        topology,
        instances={"ingest": 1, "orders": 2, "bonuses": 1, "email": 1},
    )


@pytest.fixture
async def api(aiohttp_client: Any, make_settings: Any, smtp: tuple[SmtpSink, int]) -> TestClient:
    settings = system_settings(make_settings, smtp[1], UNKNOWN_PAYMENT_PARK_SECONDS=LONG_PARK)
    app = api_app(settings, monitor_interval_s=3600)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


@pytest.fixture
async def pool(migrated_database: str) -> AsyncIterator[Any]:
    pool = await create_pool(migrated_database, max_size=10)
    try:
        yield pool
    finally:
        await pool.close()


async def parked_rows(db: Any, payment_id: str) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT event_id, released_at IS NOT NULL AS released, published_at IS NOT NULL AS"
        " published, dead_lettered_at IS NOT NULL AS dead FROM parked_events"
        " WHERE payment_id = $1 ORDER BY id",
        payment_id,
    )
    return [dict(r) for r in rows]


def outcomes(system: System, outcome: str) -> int:
    return sum(
        int(
            client.app[REGISTRY].get_sample_value(
                "payhooks_messages_processed_total", {"worker": "orders", "outcome": outcome}
            )
            or 0
        )
        for client in system.clients["orders"]
    )


async def test_early_event_is_parked_then_released_by_registration_and_takes_effect_once(
    parking: System,
    api: TestClient,
    db: Any,
    amqp: AbstractChannel,
    topology: Topology,
    smtp: tuple[SmtpSink, int],
) -> None:
    payment_id, event_id = new_id("pay"), new_id("evt")
    await post(parking.ingest, payment_event(payment_id, "paid"), event_id)

    await eventually(lambda: parked_rows(db, payment_id), lambda rows: len(rows) == 1)
    assert outcomes(parking, "parked") == 1
    assert outcomes(parking, "retried") == outcomes(parking, "dead_lettered") == 0
    waiting, oldest_s = await parked_sql.waiting(db)
    assert waiting == 1
    assert 0 < oldest_s < 30
    view = await (await api.get(f"/api/payments/{payment_id}", headers=AUTH)).json()
    assert view["order"] is None
    assert [(p["event_id"], p["state"]) for p in view["parked"]] == [(event_id, "parked")]

    order = {
        "order_id": f"ord_{payment_id}",
        "payment_id": payment_id,
        "user_id": f"user_{payment_id}",
        "email": f"{payment_id}@customer.test",
        "amount": "100.00",
        "currency": "USD",
    }
    assert (await api.post("/api/orders", json=order, headers=AUTH)).status == 201

    await quiescent(db, parking, extra_orders_deliveries=1)  # parked, then the released copy
    await paid_once(db, smtp[0], payment_id, event_id)
    assert await parked_rows(db, payment_id) == [
        {"event_id": event_id, "released": True, "published": True, "dead": False}
    ]
    assert outcomes(parking, "retried") == outcomes(parking, "dead_lettered") == 0
    assert await depths(amqp, dlqs(topology)) == dict.fromkeys(dlqs(topology), 0)
    view = await (await api.get(f"/api/payments/{payment_id}", headers=AUTH)).json()
    assert [(p["event_id"], p["state"]) for p in view["parked"]] == [(event_id, "released")]
    assert view["parked"][0]["released_at"] is not None
    assert await parked_sql.waiting(db) == (0, 0.0)


async def test_copies_of_an_early_event_park_once_and_take_effect_once(
    parking: System,
    db: Any,
    amqp: AbstractChannel,
    topology: Topology,
    smtp: tuple[SmtpSink, int],
) -> None:
    """Redeliveries of one event (same message id) before the order: one parked row."""
    payment_id, event_id = new_id("pay"), new_id("evt")
    payload = payment_event(payment_id, "paid")
    await post(parking.ingest, payload, event_id)
    copy = outgoing("xhub", event_id, "payment.status_changed", orjson.dumps(payload))
    for _ in range(3):  # what RabbitMQ redelivers after a lost ack, say
        await amqp.default_exchange.publish(
            to_message(copy), routing_key=topology.work["orders"].name
        )

    await eventually(lambda: _finished(parking), lambda n: n == 4)
    assert outcomes(parking, "parked") + outcomes(parking, "skipped_duplicate") == 4
    assert [r["event_id"] for r in await parked_rows(db, payment_id)] == [event_id]

    await register(db, payment_id)

    await quiescent(db, parking, extra_orders_deliveries=4)
    await paid_once(db, smtp[0], payment_id, event_id)
    assert outcomes(parking, "retried") == outcomes(parking, "dead_lettered") == 0


async def _finished(system: System) -> int:
    return system.finished("orders")


async def test_registration_racing_the_early_events_never_strands_one(
    parking: System,
    pool: Any,
    db: Any,
    amqp: AbstractChannel,
    topology: Topology,
) -> None:
    """Each payment's webhooks and its order's registration at the same moment, two orders
    workers: whichever commits second sees the other (the payment's lock), so every event
    takes effect once and none is left parked."""
    payments = [new_id("pay") for _ in range(30)]
    events = {p: (new_id("evt"), new_id("evt")) for p in payments}
    rng = random.Random(34)

    async def webhooks(payment_id: str) -> None:
        await asyncio.sleep(rng.uniform(0, 0.05))
        paid, settled = events[payment_id]
        await post(parking.ingest, payment_event(payment_id, "paid"), paid)
        await post(parking.ingest, payment_event(payment_id, "settled"), settled)

    async def registration(payment_id: str) -> None:
        await asyncio.sleep(rng.uniform(0, 0.05))
        await orders_sql.register_order(
            pool,
            orders_sql.NewOrder(
                f"ord_{payment_id}",
                payment_id,
                f"user_{payment_id}",
                f"{payment_id}@customer.test",
                Decimal("100.00"),
                "USD",
            ),
        )

    await asyncio.gather(*(f(p) for p in payments for f in (webhooks, registration)))

    async def settled() -> dict[str, str]:
        return await orders_sql.statuses(db, payments)

    await eventually(
        settled, lambda s: list(s.values()).count("SETTLED") == len(payments), timeout_s=30
    )
    processed = await db.fetchval(
        "SELECT count(*) FROM processed_events WHERE worker = 'orders'"
        " AND event_id = ANY($1::text[])",
        [e for pair in events.values() for e in pair],
    )
    assert processed == 2 * len(payments)

    async def stranded() -> int:  # a relay marks its rows once their copies are confirmed
        return int(
            await db.fetchval(
                "SELECT count(*) FROM parked_events WHERE published_at IS NULL"
                " OR dead_lettered_at IS NOT NULL"
            )
        )

    await eventually(stranded, lambda n: n == 0)
    transitions = await orders_sql.transition_statuses(db, payments)
    assert all(t[-1] == "SETTLED" for t in transitions.values()), transitions
    assert await depths(amqp, dlqs(topology)) == dict.fromkeys(dlqs(topology), 0)


async def test_a_park_that_runs_out_dead_letters_and_a_requeue_after_registering_applies_once(
    system: System,
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
    smtp: tuple[SmtpSink, int],
) -> None:
    """The tests' park is 1 s: the event goes to orders.dlq as the worker runtime would put it
    there (reason unknown_payment), and `payhooks dlq requeue`'s function brings it back."""
    payment_id, event_id = new_id("pay"), new_id("evt")
    work = topology.work["orders"]
    await post(system.ingest, payment_event(payment_id, "paid"), event_id)

    await eventually(lambda: depths(channel, [work.dlq]), lambda d: d[work.dlq] == 1)
    [letter] = await dlq.show(channel, work.dlq)
    assert (letter.id, letter.payment_id, letter.reason, letter.attempts) == (
        event_id,
        payment_id,
        "unknown_payment",
        1,
    )
    assert letter.original_queue == work.name
    assert "UNKNOWN_PAYMENT_PARK_SECONDS" in (letter.error or "")
    # The row is marked in the transaction that held it while its copy went to the DLQ: the
    # copy can be counted there a moment before that transaction commits.
    await eventually(
        lambda: parked_rows(db, payment_id),
        lambda rows: (
            rows == [{"event_id": event_id, "released": False, "published": False, "dead": True}]
        ),
    )

    await register(db, payment_id)  # releases nothing: the event is in the DLQ now
    assert (await parked_rows(db, payment_id))[0]["released"] is False
    moved = await dlq_moves.requeue(channel, work.dlq, dlq_moves.Selection(payment_id=payment_id))

    assert [m.id for m in moved.requeued] == [event_id]
    await quiescent(db, system, extra_orders_deliveries=1)
    await paid_once(db, smtp[0], payment_id, event_id)
    assert await depths(channel, [work.dlq]) == {work.dlq: 0}


async def test_an_event_requeued_while_its_order_is_still_missing_is_parked_again(
    db: Any,
) -> None:
    """Not lost: the dead-lettered row is parked again for a new term; a copy of a parked one
    changes nothing."""
    event = parked_sql.ParkedEvent(
        new_id("evt"), "xhub", new_id("pay"), "payment.status_changed", "k", b"{}", {"a": 1}
    )
    assert await parked_sql.park(db, event) is True
    assert await parked_sql.park(db, event) is False
    await db.execute("UPDATE parked_events SET parked_at = now() - interval '1 hour'")
    async with db.transaction():
        [row] = await parked_sql.lock_expired(db, 60, 10)
        await parked_sql.mark_dead_lettered(db, [row.id])

    assert await parked_sql.park(db, event) is True
    assert await parked_rows(db, event.payment_id) == [
        {"event_id": event.event_id, "released": False, "published": False, "dead": False}
    ]
    assert (await parked_sql.waiting(db))[0] == 1
