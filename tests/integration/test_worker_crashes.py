"""Worker processes killed (SIGKILL) or stopped (SIGTERM) while they hold a message.

Real `payhooks run <worker>` processes against real PostgreSQL, RabbitMQ and an aiosmtpd
server. A worker is caught "holding a message" deterministically: the email worker by an SMTP
server that never answers its DATA, the orders and bonuses workers by an order row the test
keeps locked (`SELECT ... FOR UPDATE`), observed as that process's session waiting on a lock
in pg_stat_activity.
"""

from __future__ import annotations

import asyncio
import email
import email.message
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aio_pika
import asyncpg
import orjson
import pytest
from aio_pika.abc import AbstractChannel, DeliveryMode

from shared.amqp.topology import DELIVERY_LIMIT, Topology, declare
from shared.config import Settings
from shared.messages import OrderTransition
from shared.process.service import SHUTDOWN_TIMEOUT_S
from shared.queries import orders as orders_sql
from shared.queries import processed as processed_sql
from tests.conftest import own_database, smtp_server
from tests.helpers import drain, eventually, payment_event
from tests.integration.system import register
from tests.processes import ServiceProcess, ServiceProcesses

# Every wait below is a poll; this bounds one (a worker restart is ~0.5 s on this machine).
WAIT_S = 15.0


@pytest.fixture(scope="module")
def migrated_database() -> Iterator[str]:
    """A database of this module's own (overrides conftest's).

    These tests hold order row locks for seconds and leave killed workers' sessions behind
    until the lock goes; a TRUNCATE by another module's `db` fixture would queue behind those
    locks and then wipe the orders mid-test.
    """
    with own_database("crashes") as url:
        yield url


class StallingSmtp:
    """aiosmtpd handler: never answers the first DATA, accepts (250) and keeps the rest."""

    def __init__(self) -> None:
        self.data_commands = 0
        self.stalled = threading.Event()
        self.accepted: list[email.message.Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.data_commands += 1
        if self.data_commands == 1:
            self.stalled.set()
            # No answer, ever: the client sits in DATA until it dies (aiosmtpd cancels this
            # coroutine when the connection is lost).
            await asyncio.get_running_loop().create_future()
        self.accepted.append(email.message_from_bytes(envelope.content))
        return "250 Message accepted for delivery"


@pytest.fixture
def stalling_smtp() -> Iterator[tuple[StallingSmtp, int]]:
    handler = StallingSmtp()
    with smtp_server(handler) as port:
        yield handler, port


@pytest.fixture
async def processes(
    settings: Settings, topology: Topology, amqp: AbstractChannel, db: Any, tmp_path: Any
) -> AsyncIterator[ServiceProcesses]:
    """Worker processes on the test's database and queue prefix, all killed at teardown.

    Depends on `amqp` and `db`, so the processes die before the queues are deleted.
    """
    await declare(amqp, topology)
    env = {
        "DATABASE_URL": settings.database_url,
        "AMQP_URL": settings.amqp_url,
        "AMQP_PREFIX": settings.amqp_prefix,
        "RETRY_DELAYS": ",".join(str(d) for d in settings.retry_delays_s),
        "EMAIL_FROM": "shop@example.test",
    }
    started = ServiceProcesses(env, tmp_path, tag=settings.amqp_prefix)
    try:
        yield started
    finally:
        started.close()


# --- helpers -------------------------------------------------------------------------------


async def publish(
    channel: AbstractChannel, topology: Topology, routing_key: str, body: bytes, message_id: str
) -> None:
    """Publish on the events exchange as ingest and the outbox relay do (confirmed)."""
    exchange = await channel.get_exchange(topology.exchange, ensure=False)
    message = aio_pika.Message(
        body,
        message_id=message_id,
        type=routing_key,
        content_type="application/json",
        delivery_mode=DeliveryMode.PERSISTENT,
    )
    await exchange.publish(message, routing_key, mandatory=True)


async def publish_paid_event(
    channel: AbstractChannel, topology: Topology, payment_id: str
) -> tuple[str, bytes]:
    event_id = f"evt_{uuid.uuid4().hex}"
    body = orjson.dumps(payment_event(payment_id, "paid"))
    await publish(channel, topology, "payment.status_changed", body, event_id)
    return event_id, body


async def paid_transition(db: Any, payment_id: str) -> OrderTransition:
    """A PAID order whose PENDING -> PAID transition is committed, as the orders worker
    leaves it; returns the order.paid message that transition publishes."""
    await register(db, payment_id, status="PAID")
    transition = OrderTransition(
        event="order.paid",
        payment_id=payment_id,
        order_id=f"ord_{payment_id}",
        user_id=f"user_{payment_id}",
        from_status="PENDING",
        to_status="PAID",
        source_event_id=f"evt_{uuid.uuid4().hex}",
    )
    await orders_sql.add_transitions(
        db, [orders_sql.TransitionRow(payment_id, "PENDING", "PAID", transition.source_event_id)]
    )
    return transition


async def publish_order_paid(
    channel: AbstractChannel, topology: Topology, transition: OrderTransition
) -> None:
    await publish(channel, topology, transition.event, transition.encode(), transition.message_id)


@asynccontextmanager
async def bonus_mark_held(database_url: str, message_id: str) -> AsyncIterator[None]:
    """Hold an uncommitted processed_events row of the bonuses worker for `message_id` until
    the block ends (then roll it back): the worker's own insert of that key waits for it,
    mid-transaction."""
    conn: asyncpg.Connection[Any] = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            await processed_sql.mark_processed(conn, "bonuses", message_id, "held by the test")
            yield
            raise _RollBack
    except _RollBack:
        pass
    finally:
        await conn.close()


class _RollBack(Exception):
    pass


@asynccontextmanager
async def order_row_locked(database_url: str, payment_id: str) -> AsyncIterator[None]:
    """Hold the order's row lock in an open transaction until the block ends."""
    conn: asyncpg.Connection[Any] = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            locked = await conn.fetchval(
                "SELECT true FROM orders WHERE payment_id = $1 FOR UPDATE", payment_id
            )
            assert locked, f"no order {payment_id} to lock"
            yield
    finally:
        await conn.close()


async def waiting_on_lock(db: Any, process: ServiceProcess) -> bool:
    """Whether a PostgreSQL session of this very process is blocked waiting for a lock."""
    waiting = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = $1 AND wait_event_type = 'Lock'",
        process.label,
    )
    return bool(waiting)


async def wait_until_blocked(db: Any, process: ServiceProcess) -> None:
    async def probe() -> bool:
        assert process.running, process.describe()
        return await waiting_on_lock(db, process)

    await eventually(probe, bool, timeout_s=WAIT_S)


async def wait_processed(process: ServiceProcess, outcome: str, count: int) -> None:
    try:
        await eventually(lambda: process.processed(outcome), lambda n: n >= count, timeout_s=WAIT_S)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{process.describe()}") from None


async def depth(channel: AbstractChannel, queue: str) -> int:
    """Ready messages in `queue` (all of them when no consumer holds any)."""
    declared = await channel.declare_queue(queue, passive=True)
    count = declared.declaration_result.message_count
    assert count is not None
    return count


async def ledger(db: Any, payment_id: str) -> list[tuple[str, int]]:
    rows = await db.fetch(
        "SELECT kind, points FROM bonus_ledger WHERE payment_id = $1 ORDER BY id", payment_id
    )
    return [(r["kind"], r["points"]) for r in rows]


async def processed_rows(db: Any, worker: str) -> int:
    count: int = await db.fetchval(
        "SELECT count(*) FROM processed_events WHERE worker = $1", worker
    )
    return count


# --- kill -9 while holding a message --------------------------------------------------------


async def test_email_worker_killed_during_smtp_send_sends_exactly_one_email_after_restart(
    processes: ServiceProcesses,
    stalling_smtp: tuple[StallingSmtp, int],
    amqp: AbstractChannel,
    topology: Topology,
    db: Any,
) -> None:
    smtp, smtp_port = stalling_smtp
    transition = await paid_transition(db, "pay_mail_kill")
    first = await processes.start_ready("email", SMTP_PORT=str(smtp_port))

    await publish_order_paid(amqp, topology, transition)
    await eventually(lambda: asyncio.sleep(0, smtp.stalled.is_set()), bool, timeout_s=WAIT_S)
    first.kill()

    second = await processes.start_ready("email", SMTP_PORT=str(smtp_port))
    await wait_processed(second, "ok", 1)

    assert smtp.data_commands == 2, "expected the stalled DATA, then one resend after restart"
    assert [m["Message-ID"] for m in smtp.accepted] == [
        "<payment_succeeded.pay_mail_kill@example.test>"
    ]
    assert smtp.accepted[0]["X-Payhooks-Template"] == "payment_succeeded"
    sent = await db.fetch(
        "SELECT template, message_id FROM emails_sent WHERE payment_id = $1", "pay_mail_kill"
    )
    assert [tuple(r) for r in sent] == [
        ("payment_succeeded", "<payment_succeeded.pay_mail_kill@example.test>")
    ]
    emails = topology.work_queue("emails")
    assert await depth(amqp, emails.name) == 0
    assert await depth(amqp, emails.dlq) == 0


async def test_orders_worker_killed_while_blocked_mid_transaction_applies_event_once_after_restart(
    processes: ServiceProcesses,
    amqp: AbstractChannel,
    topology: Topology,
    db: Any,
    settings: Settings,
) -> None:
    await register(db, "pay_orders_kill")
    first = await processes.start_ready("orders")

    async with order_row_locked(settings.database_url, "pay_orders_kill"):
        event_id, _ = await publish_paid_event(amqp, topology, "pay_orders_kill")
        await wait_until_blocked(db, first)
        first.kill()

    second = await processes.start_ready("orders")
    await wait_processed(second, "ok", 1)

    status = await db.fetchval("SELECT status FROM orders WHERE payment_id = $1", "pay_orders_kill")
    assert status == "PAID"
    transitions = await db.fetch(
        "SELECT from_status, to_status, event_id FROM order_transitions WHERE payment_id = $1",
        "pay_orders_kill",
    )
    assert [tuple(r) for r in transitions] == [("PENDING", "PAID", event_id)]
    assert await processed_rows(db, "orders") == 1
    # The transition's event reaches the bonuses queue exactly once (outbox relay).
    await eventually(
        lambda: db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL"),
        lambda n: n == 1,
        timeout_s=WAIT_S,
    )
    published = await drain(amqp, topology.work_queue("bonuses").name)
    assert [m.message_id for m in published] == [f"{event_id}:order.paid"]
    orders = topology.work_queue("orders")
    assert await depth(amqp, orders.name) == 0
    assert await depth(amqp, orders.dlq) == 0


async def test_bonuses_worker_killed_while_blocked_mid_transaction_grants_once_after_restart(
    processes: ServiceProcesses,
    amqp: AbstractChannel,
    topology: Topology,
    db: Any,
    settings: Settings,
) -> None:
    transition = await paid_transition(db, "pay_bonus_kill")
    first = await processes.start_ready("bonuses")

    async with bonus_mark_held(settings.database_url, transition.message_id):
        await publish_order_paid(amqp, topology, transition)
        await wait_until_blocked(db, first)
        first.kill()

    second = await processes.start_ready("bonuses")
    await wait_processed(second, "ok", 1)

    assert await ledger(db, "pay_bonus_kill") == [("grant", 500)]
    assert await processed_rows(db, "bonuses") == 1
    bonuses = topology.work_queue("bonuses")
    assert await depth(amqp, bonuses.name) == 0
    assert await depth(amqp, bonuses.dlq) == 0


# --- SIGTERM while holding a message --------------------------------------------------------


async def test_bonuses_worker_on_sigterm_exits_0_and_finishes_or_hands_back_its_message(
    processes: ServiceProcesses,
    amqp: AbstractChannel,
    topology: Topology,
    db: Any,
    settings: Settings,
) -> None:
    transition = await paid_transition(db, "pay_bonus_term")
    worker = await processes.start_ready("bonuses")
    bonuses = topology.work_queue("bonuses")

    async with bonus_mark_held(settings.database_url, transition.message_id):
        await publish_order_paid(amqp, topology, transition)
        await wait_until_blocked(db, worker)
        worker.terminate()
        # The HTTP site closes first on SIGTERM: from then on the process is shutting down,
        # with the message still in hand. Only now is the lock released.
        await eventually(worker.listening, lambda up: not up, timeout_s=WAIT_S)
        assert worker.running, worker.describe()

    code = await worker.wait_exit(timeout_s=SHUTDOWN_TIMEOUT_S)
    assert code == 0, worker.describe()

    # No consumer is attached now, so every message still owed is back in the queue.
    after_stop = (await ledger(db, "pay_bonus_term"), await depth(amqp, bonuses.name))
    finished: tuple[list[tuple[str, int]], int] = ([("grant", 500)], 0)
    handed_back: tuple[list[tuple[str, int]], int] = ([], 1)
    assert after_stop in (finished, handed_back), "the message was lost or applied twice"

    restarted = await processes.start_ready("bonuses")
    if after_stop == handed_back:
        await wait_processed(restarted, "ok", 1)
    assert await ledger(db, "pay_bonus_term") == [("grant", 500)]
    assert await processed_rows(db, "bonuses") == 1
    assert await depth(amqp, bonuses.name) == 0
    assert await depth(amqp, bonuses.dlq) == 0


# --- a message that kills the worker every time ----------------------------------------------


async def test_message_that_keeps_killing_the_orders_worker_is_dead_lettered_by_delivery_limit(
    processes: ServiceProcesses,
    amqp: AbstractChannel,
    topology: Topology,
    db: Any,
    settings: Settings,
) -> None:
    await register(db, "pay_poison")
    orders = topology.work_queue("orders")
    kills = 0

    async with order_row_locked(settings.database_url, "pay_poison"):
        event_id, body = await publish_paid_event(amqp, topology, "pay_poison")
        while True:
            worker = await processes.start_ready("orders")

            async def state(worker: ServiceProcess = worker) -> tuple[bool, int]:
                return await waiting_on_lock(db, worker), await depth(amqp, orders.dlq)

            _, dead = await eventually(state, lambda s: s[0] or s[1] > 0, timeout_s=WAIT_S)
            if dead:
                break
            worker.kill()
            kills += 1
            assert kills <= DELIVERY_LIMIT + 1, "the delivery limit never dead-lettered it"

        # x-delivery-limit counts unsuccessful deliveries; "more than the limit" dead-letters.
        assert kills == DELIVERY_LIMIT + 1
        [dead_letter] = await drain(amqp, orders.dlq)

    assert dead_letter.body == body
    assert dead_letter.message_id == event_id
    deaths = dead_letter.headers["x-death"]
    assert isinstance(deaths, list)
    death = deaths[0]
    assert isinstance(death, dict)
    assert (death["reason"], death["queue"]) == ("delivery_limit", orders.name)
    assert await depth(amqp, orders.name) == 0
    assert (
        await db.fetchval("SELECT status FROM orders WHERE payment_id = $1", "pay_poison")
        == "PENDING"
    )
    assert await processed_rows(db, "orders") == 0
