"""The worker runtime takes messages in batches: one transaction per batch, a savepoint per
message, the failures routed alone. Real RabbitMQ, real PostgreSQL, the real orders handler."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import orjson
import pytest

from shared.amqp.topology import Topology, declare
from shared.config import Settings
from shared.queries import emails as emails_sql
from shared.worker.batches import Delivery, Step, apply_batch
from tests.helpers import drain, eventually, payment_event
from tests.integration.system import depths, header, register
from tests.integration.test_worker_message_id import orders_worker, publish


async def test_a_batch_commits_together_and_its_poison_messages_are_routed_alone(
    settings: Settings, topology: Topology, amqp: Any, db: Any
) -> None:
    await declare(amqp, topology)
    work = topology.work["orders"]
    payments = [f"pay_{uuid.uuid4().hex[:12]}" for _ in range(8)]
    for payment_id in payments:
        await register(db, payment_id)
    unknown = f"pay_unknown_{uuid.uuid4().hex[:8]}"
    # All in the queue before the worker starts: one batch takes the twelve of them.
    events = [(f"evt_{uuid.uuid4().hex}", orjson.dumps(payment_event(p, "paid"))) for p in payments]
    for event_id, body in events[:4]:
        await publish(amqp, work.name, body, event_id)
    await publish(amqp, work.name, b"{not json", "evt_broken")
    await publish(amqp, work.name, orjson.dumps(payment_event(unknown, "paid")), "evt_unknown")
    for event_id, body in events[4:]:
        await publish(amqp, work.name, body, event_id)
    await publish(amqp, work.name, events[0][1], events[0][0])  # a redelivered copy

    # One batcher with a long linger: the twelve messages put in the queue before arrive as
    # one batch.
    async with orders_worker(settings, topology, amqp, batch_size=20, batchers=1, linger_s=0.2):
        await eventually(
            lambda: db.fetchval("SELECT count(*) FROM processed_events WHERE worker = 'orders'"),
            lambda n: n == len(payments),
        )
        await eventually(lambda: depths(amqp, [work.name]), lambda d: d == {work.name: 0})

    rows = await db.fetch(
        "SELECT status, updated_at FROM orders WHERE payment_id = ANY($1::text[])", payments
    )
    assert [r["status"] for r in rows] == ["PAID"] * len(payments)
    # now() is the transaction's start: one value for all eight means one transaction.
    assert len({r["updated_at"] for r in rows}) == 1
    transitions = await db.fetchval("SELECT count(*) FROM order_transitions")
    assert transitions == len(payments)  # the copy changed nothing
    # The broken body went to the DLQ at once; the unknown payment's event was parked in the
    # batch's transaction (the tests' 1 s park may have dead-lettered it since).
    parked = await db.fetch("SELECT event_id, payment_id FROM parked_events")
    assert [(r["event_id"], r["payment_id"]) for r in parked] == [("evt_unknown", unknown)]
    queues = (work.name, work.dlq, *work.retry_queues)
    elsewhere = [m for q in queues for m in await drain(amqp, q)]
    broken = [m for m in elsewhere if m.message_id == "evt_broken"]
    assert [header(m, "reason") for m in broken] == ["invalid_message"]
    assert {m.message_id for m in elsewhere} <= {"evt_broken", "evt_unknown"}
    assert all(int(header(m, "attempts")) == 1 for m in elsewhere)


async def test_events_of_one_order_in_one_batch_each_see_the_state_the_previous_left(
    settings: Settings, topology: Topology, amqp: Any, db: Any
) -> None:
    """The orders worker reads a batch's orders once and writes them once: paid, settled and
    refunded for one payment in one batch (with a copy of the first) move the order through
    each state in turn, one transition and one outbox message per move, in arrival order."""
    await declare(amqp, topology)
    work = topology.work["orders"]
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    await register(db, payment_id)
    events = [
        (f"evt_{status}_{payment_id}", orjson.dumps(payment_event(payment_id, status)))
        for status in ("paid", "settled", "refunded")
    ]
    for event_id, body in [*events, events[0]]:
        await publish(amqp, work.name, body, event_id)

    async with orders_worker(settings, topology, amqp, batch_size=20, batchers=1, linger_s=0.2):
        await eventually(
            lambda: db.fetchval("SELECT count(*) FROM processed_events WHERE worker = 'orders'"),
            lambda n: n == len(events),
        )
        await eventually(lambda: depths(amqp, [work.name]), lambda d: d == {work.name: 0})

    assert (
        await db.fetchval("SELECT status FROM orders WHERE payment_id = $1", payment_id)
        == "REFUNDED"
    )
    transitions = await db.fetch(
        "SELECT from_status, to_status, event_id FROM order_transitions ORDER BY id"
    )
    assert [tuple(t) for t in transitions] == [
        ("PENDING", "PAID", events[0][0]),
        ("PAID", "SETTLED", events[1][0]),
        ("SETTLED", "REFUNDED", events[2][0]),
    ]
    outbox = await db.fetch("SELECT routing_key FROM outbox ORDER BY id")
    assert [r["routing_key"] for r in outbox] == ["order.paid", "order.settled", "order.refunded"]
    retried = [m for q in (work.dlq, *work.retry_queues) for m in await drain(amqp, q)]
    assert retried == []  # the copy was a duplicate, not a failure


async def test_an_email_batch_holds_its_payments_locked_until_it_ends(
    migrated_database: str,
) -> None:
    """The email worker locks its batch's payments in one statement: another batch sharing a
    payment waits for the commit, and goes on once it has."""
    first = await asyncpg.connect(migrated_database)
    second = await asyncpg.connect(migrated_database)
    try:
        async with first.transaction():
            await emails_sql.lock_payment_emails(first, ["pay_b", "pay_a", "pay_b"])
            async with second.transaction():
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.3):
                        await emails_sql.lock_payment_emails(second, ["pay_c", "pay_a"])
            waiting = asyncio.create_task(
                _locked_in(migrated_database, ["pay_a", "pay_b", "pay_c"])
            )
            await asyncio.sleep(0.2)
            assert not waiting.done()
        await asyncio.wait_for(waiting, 5)  # the first one's commit let it through
    finally:
        await first.close()
        await second.close()


async def _locked_in(database_url: str, payment_ids: list[str]) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            await emails_sql.lock_payment_emails(conn, payment_ids)
    finally:
        await conn.close()


async def test_a_batch_whose_event_a_concurrent_copy_commits_first_is_applied_again_without_it(
    settings: Settings, db: Any
) -> None:
    """The processed marks are read first and written last: a copy of one event handled by
    another batch meanwhile (here: a connection holding its uncommitted mark) makes this
    batch's insert of the mark wait, then find the row. The batch is rolled back and applied
    again: the copy is a duplicate now, and the other event's effect is written once."""
    worker = "race_test"
    copied, other = f"evt_1_{uuid.uuid4().hex}", f"evt_2_{uuid.uuid4().hex}"  # in this order
    await db.execute("CREATE TABLE IF NOT EXISTS race_effects (event_id text NOT NULL)")
    await db.execute("TRUNCATE race_effects")
    calls: list[str] = []

    async def handle(step: Step, delivery: Delivery) -> str:
        calls.append(delivery.message_id)
        await step.conn.execute("INSERT INTO race_effects VALUES ($1)", delivery.message_id)
        return "ok"

    deliveries = [Delivery(event_id, "order.paid", b"{}", 0) for event_id in (copied, other)]
    holder: asyncpg.Connection[Any] = await asyncpg.connect(settings.database_url)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        held = holder.transaction()
        await held.start()
        await holder.execute(
            "INSERT INTO processed_events (worker, event_id, outcome) VALUES ($1, $2, 'ok')",
            worker,
            copied,
        )
        batch = asyncio.create_task(
            apply_batch(pool, deliveries, handle, lambda d: d.message_id, marks=worker)
        )
        await eventually(lambda: _waiting_on_a_lock(db), bool)
        assert not batch.done()
        await held.commit()  # the other copy's effect and mark are in
        results, steps = await asyncio.wait_for(batch, 10)
    finally:
        await pool.close()
        await holder.close()

    assert results == ["skipped_duplicate", "ok"]
    assert [s.index for s in steps] == [1]
    assert calls == [copied, other, other]  # the second attempt skipped the copy
    assert await db.fetch("SELECT event_id FROM race_effects") == [(other,)]
    marks = await db.fetch(
        "SELECT event_id FROM processed_events WHERE worker = $1 ORDER BY event_id", worker
    )
    assert [r["event_id"] for r in marks] == sorted([copied, other])
    await db.execute("DROP TABLE race_effects")


async def _waiting_on_a_lock(db: Any) -> bool:
    waiting = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return bool(waiting)


async def test_emails_claimed_in_one_statement_answer_as_claimed_one_after_the_other(
    db: Any,
) -> None:
    """claim_emails: an earlier claim of the same key makes a duplicate, an earlier refund
    email (in the list or recorded before) makes the success email a skipped record, and a
    payment's emails claimed together are stamped in the order given."""

    def claim(payment_id: str, template: str, event_id: str) -> emails_sql.EmailClaim:
        skip = "payment_refunded" if template == "payment_succeeded" else None
        mid = f"<{template}.{payment_id}@example.test>"
        return emails_sql.EmailClaim(
            payment_id, template, mid, "buyer@example.test", event_id, skip_if_recorded=skip
        )

    async with db.transaction():
        assert await emails_sql.claim_email(db, claim("p3", "payment_refunded", "e0")) is True
        answers = await emails_sql.claim_emails(
            db,
            [
                claim("p1", "payment_succeeded", "e1"),  # sent
                claim("p1", "payment_refunded", "e2"),  # sent, after it
                claim("p1", "payment_succeeded", "e3"),  # a copy of e1
                claim("p2", "payment_refunded", "e4"),  # sent
                claim("p2", "payment_succeeded", "e5"),  # overtaken by e4 in this list
                claim("p3", "payment_succeeded", "e6"),  # overtaken by e0, recorded before
                claim("p3", "payment_refunded", "e7"),  # a copy of e0
            ],
        )
    assert answers == [True, True, None, True, False, False, None]
    rows = await db.fetch(
        "SELECT payment_id, template, event_id, skipped FROM emails_sent"
        " ORDER BY payment_id, sent_at NULLS LAST"
    )
    assert [tuple(r) for r in rows] == [
        ("p1", "payment_succeeded", "e1", False),
        ("p1", "payment_refunded", "e2", False),
        ("p2", "payment_refunded", "e4", False),
        ("p2", "payment_succeeded", "e5", True),
        ("p3", "payment_refunded", "e0", False),
        ("p3", "payment_succeeded", "e6", True),
    ]
    assert await emails_sql.templates_sent(db, ["p1"]) == {
        "p1": ["payment_succeeded", "payment_refunded"]
    }
