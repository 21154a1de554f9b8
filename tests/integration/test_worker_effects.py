"""Exactly one effect per real event: duplicates, concurrency, retries, DLQ and the outbox.

Real PostgreSQL, RabbitMQ and an aiosmtpd server; the services run as their own aiohttp apps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import random
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aio_pika
import orjson
import pytest
from aio_pika.abc import AbstractChannel, DeliveryMode
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from services.ingest.accept import outgoing
from services.orders.handler import make_handler as orders_handler
from services.orders.outbox import OutboxRelay
from services.sim.summary import expected_final_status
from shared.amqp.broker import Broker
from shared.amqp.outgoing import to_message
from shared.amqp.topology import Topology, declare
from shared.config import Settings
from shared.db import create_pool
from shared.messages import ORDER_TRANSITION_SCHEMA
from shared.metrics import OrderMetrics, WorkerMetrics, new_registry
from shared.providers.xhub.events import InvalidEventError
from shared.vocabulary import OrderStatus
from shared.worker.batches import BatchHandler, Delivery, Result
from shared.worker.runtime import Worker
from tests.batch_handlers import Handler, one_by_one
from tests.conftest import SmtpSink
from tests.helpers import drain, eventually, payment_event
from tests.integration.system import (
    System,
    consumer_counts,
    depths,
    dlqs,
    effects,
    gather_posts,
    get_one,
    header,
    post,
    quiescent,
    register,
    requeue_one,
    smtp_counts,
    smtp_messages,
    start_system,
    system_settings,
)

EARNING = (OrderStatus.PAID, OrderStatus.SETTLED)
STATUSES = ("paid", "settled", "refunded", "expired")


def new_id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def effect_settings(make_settings: Any, smtp: tuple[SmtpSink, int]) -> Settings:
    return system_settings(make_settings, smtp[1])


@pytest.fixture
async def system(
    aiohttp_client: Any, effect_settings: Settings, amqp: Any, topology: Topology, db: Any
) -> System:
    return await start_system(aiohttp_client, effect_settings, amqp, topology)


async def assert_dlqs_empty(channel: AbstractChannel, topology: Topology) -> None:
    assert await depths(channel, dlqs(topology)) == dict.fromkeys(dlqs(topology), 0)


async def assert_paid_once(db: Any, sink: SmtpSink, payment_id: str, status: str) -> None:
    assert await effects(db, payment_id) == {
        "status": status,
        "bonus": 500,
        "ledger": ["grant"],
        "emails": ["payment_succeeded"],
    }
    assert smtp_messages(sink, payment_id) == ["payment_succeeded"]


# --- the same event again and again ------------------------------------------------------


async def test_same_paid_webhook_five_times_in_sequence_grants_once_and_emails_once(
    system: System, db: Any, smtp: tuple[SmtpSink, int], amqp: Any, topology: Topology
) -> None:
    payment_id, event_id = new_id("pay"), new_id("evt")
    await register(db, payment_id)

    answers = [
        await post(system.ingest, payment_event(payment_id, "paid"), event_id) for _ in range(5)
    ]

    assert answers == [{"status": "accepted"}] + [{"status": "duplicate"}] * 4
    done = await quiescent(db, system)
    assert done["orders_finished"] == 1  # ingest published it once
    await assert_paid_once(db, smtp[0], payment_id, "PAID")
    await assert_dlqs_empty(amqp, topology)


async def test_same_paid_webhook_fifty_times_concurrently_grants_once_and_emails_once(
    system: System, db: Any, smtp: tuple[SmtpSink, int], amqp: Any, topology: Topology
) -> None:
    payment_id, event_id = new_id("pay"), new_id("evt")
    await register(db, payment_id)

    answers = await gather_posts(
        system.ingest, [(payment_event(payment_id, "paid"), event_id)] * 50
    )

    assert {a["status"] for a in answers} <= {"accepted", "duplicate"}
    done = await quiescent(db, system)
    assert done["orders_finished"] == 1
    await assert_paid_once(db, smtp[0], payment_id, "PAID")
    await assert_dlqs_empty(amqp, topology)


@pytest.mark.parametrize(
    ("statuses", "final"),
    [(("paid", "settled"), "SETTLED"), (("paid", "paid"), "PAID")],
    ids=["paid+settled", "paid+paid"],
)
async def test_two_different_events_for_one_payment_sent_concurrently_grant_once_and_email_once(
    system: System,
    db: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    statuses: tuple[str, str],
    final: str,
) -> None:
    payment_id = new_id("pay")
    await register(db, payment_id)

    await gather_posts(
        system.ingest, [(payment_event(payment_id, s), new_id("evt")) for s in statuses]
    )

    done = await quiescent(db, system)
    assert done["orders_finished"] == 2
    await assert_paid_once(db, smtp[0], payment_id, final)
    await assert_dlqs_empty(amqp, topology)


# --- any order, any duplicates -----------------------------------------------------------


Events = list[tuple[str, int]]  # (status, slot): events sharing a slot share an event id


@st.composite
def status_sequences(draw: st.DrawFn) -> Events:
    """Distinct statuses in some order, then duplicates anywhere: a duplicate either repeats an
    event id (the provider retrying) or is a new event with the same status."""
    order = draw(st.permutations(STATUSES))
    size = draw(st.integers(1, len(STATUSES)))
    events = [(status, slot) for slot, status in enumerate(order[:size])]
    slots = size
    for _ in range(draw(st.integers(0, 4))):
        status, slot = draw(st.sampled_from(events))
        if draw(st.booleans()):
            slot, slots = slots, slots + 1
        events.insert(draw(st.integers(0, len(events))), (status, slot))
    return events


async def post_sequence(system: System, payment_id: str, events: Events) -> None:
    """Post the events in order, each after the previous one was accepted."""
    ids: dict[int, str] = {}
    for status, slot in events:
        event_id = ids.setdefault(slot, new_id("evt"))
        await post(system.ingest, payment_event(payment_id, status), event_id)


async def outcome_problems(db: Any, sink: SmtpSink, payment_id: str, events: Events) -> list[str]:
    """What differs from SPEC 5 for one payment after its events went through (empty: fine)."""
    expected = expected_final_status(status for status, _ in events)
    state = await effects(db, payment_id)
    sent = smtp_messages(sink, payment_id)
    problems = []
    if state["status"] != expected:
        problems.append(f"status {state['status']}, expected {expected.value}")
    if state["bonus"] != (500 if expected in EARNING else 0):
        problems.append(f"bonus net {state['bonus']} (ledger {state['ledger']})")
    if sent != state["emails"] or len(set(sent)) != len(sent):
        problems.append(f"SMTP messages {sent}, emails_sent rows {state['emails']}")
    if expected in EARNING and "payment_succeeded" not in sent:
        problems.append("no payment_succeeded email for a paid order")
    if (expected is OrderStatus.REFUNDED) != ("payment_refunded" in sent):
        problems.append(f"payment_refunded email {sent} for a {expected.value} order")
    if expected is OrderStatus.CANCELLED and sent:
        problems.append(f"emails {sent} for a cancelled order")
    return [f"{payment_id} {events}: {p}" for p in problems]


# One system serves every example (fresh payment ids keep examples apart): the health check
# against function-scoped fixtures does not apply.
@hypothesis_settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(events=status_sequences())
@example(events=[("paid", 0), ("settled", 1), ("refunded", 2), ("expired", 3)])
@example(events=[("expired", 0), ("refunded", 1), ("settled", 2), ("paid", 3), ("paid", 0)])
async def test_status_events_in_any_order_with_duplicates_end_in_the_state_machine_answer(
    system: System,
    db: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    events: Events,
) -> None:
    payment_id = new_id("pay")
    await register(db, payment_id)

    await post_sequence(system, payment_id, events)

    await quiescent(db, system)
    assert await outcome_problems(db, smtp[0], payment_id, events) == []
    await assert_dlqs_empty(amqp, topology)


def every_arrangement() -> list[Events]:
    """Every ordering of every non-empty subset of STATUSES (64), first event retried last."""
    arrangements = []
    for size in range(1, len(STATUSES) + 1):
        for perm in itertools.permutations(STATUSES, size):
            arrangements.append([*((s, i) for i, s in enumerate(perm)), (perm[0], 0)])
    return arrangements


async def test_every_ordering_of_status_events_ends_in_the_state_machine_answer(
    system: System, db: Any, smtp: tuple[SmtpSink, int], amqp: Any, topology: Topology
) -> None:
    cases = {new_id("pay"): events for events in every_arrangement()}
    assert len(cases) == 64
    for payment_id in cases:
        await register(db, payment_id)

    # Each payment's events in order; the payments all at once.
    await asyncio.gather(*(post_sequence(system, p, events) for p, events in cases.items()))

    await quiescent(db, system, timeout_s=30)
    problems = [
        problem
        for payment_id, events in cases.items()
        for problem in await outcome_problems(db, smtp[0], payment_id, events)
    ]
    assert problems == []
    await assert_dlqs_empty(amqp, topology)


# --- two instances of every worker ---------------------------------------------------------


async def test_two_instances_of_each_worker_make_one_grant_and_one_email_per_payment(
    aiohttp_client: Any,
    effect_settings: Settings,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    system = await start_system(
        aiohttp_client,
        effect_settings,
        amqp,
        topology,
        {"ingest": 1, "orders": 2, "bonuses": 2, "email": 2},
    )
    payments = [new_id("pay") for _ in range(30)]
    for payment_id in payments:
        await register(db, payment_id)
    events = [(payment_event(p, s), new_id("evt")) for p in payments for s in ("paid", "settled")]
    # Each webhook twice through ingest, plus a copy of each published straight to the exchange
    # as a redelivery would: the workers themselves see every message id twice.
    webhooks = events * 2
    random.Random(7).shuffle(webhooks)
    exchange = await amqp.get_exchange(topology.exchange, ensure=False)

    async def republish(payload: dict[str, Any], event_id: str) -> None:
        message = outgoing("xhub", event_id, payload["event"], orjson.dumps(payload))
        await exchange.publish(to_message(message), message.routing_key, mandatory=True)

    await asyncio.gather(
        gather_posts(system.ingest, webhooks), *(republish(p, e) for p, e in events)
    )

    done = await quiescent(db, system, extra_orders_deliveries=len(events), timeout_s=30)
    assert done["orders_finished"] == 2 * len(events)
    for payment_id in payments:
        await assert_paid_once(db, smtp[0], payment_id, "SETTLED")
    assert len(smtp[0].messages) == len(payments)
    assert set(smtp_counts(smtp[0]).values()) == {1}
    # Both instances of every worker took part.
    for service in ("orders", "bonuses", "email"):
        assert all(n > 0 for n in system.finished_by_instance(service)), service
    await assert_dlqs_empty(amqp, topology)


# --- the worker runtime: retry ladder and DLQ ----------------------------------------------


def each_alone(handle: Handler) -> BatchHandler:
    """A batch handler calling `handle` for each delivery, concurrently."""

    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        results = await asyncio.gather(*(handle(d) for d in deliveries), return_exceptions=True)
        return [r if isinstance(r, str | Exception) else RuntimeError(repr(r)) for r in results]

    return run


@asynccontextmanager
async def running_worker(
    settings: Settings, topology: Topology, channel: AbstractChannel, handler: Handler
) -> AsyncIterator[Worker]:
    """A shared.worker.runtime.Worker on the test topology's orders queue with `handler`."""
    broker = Broker(settings.amqp_url, topology)
    await broker.start()
    worker = Worker(
        "ladder-test",
        broker,
        topology.work["orders"],
        each_alone(handler),
        WorkerMetrics.create("t"),
    )
    try:
        await broker.wait_connected(10)
        worker.start()
        queue = topology.work["orders"].name
        await eventually(lambda: consumer_counts(channel, [queue]), lambda c: c == {queue: 1})
        yield worker
    finally:
        await worker.stop()
        await broker.close()


# Odd spacing and a trailing newline: the DLQ copy must keep these exact bytes.
RAW_BODY = b'{"event": "payment.status_changed",  "payment_id":"pay_raw", "status":"paid"}\n'


async def publish_to_queue(channel: AbstractChannel, queue: str, message_id: str) -> None:
    message = aio_pika.Message(
        RAW_BODY,
        message_id=message_id,
        type="payment.status_changed",
        content_type="application/json",
        delivery_mode=DeliveryMode.PERSISTENT,
    )
    await channel.default_exchange.publish(message, routing_key=queue, mandatory=True)


async def test_failing_handler_retries_on_the_ladder_then_dead_letters_with_its_story(
    settings: Settings, topology: Topology, amqp: Any
) -> None:
    calls: list[tuple[float, int]] = []

    async def failing(delivery: Delivery) -> str:
        calls.append((time.monotonic(), delivery.attempts))
        raise RuntimeError(f"handler failed on call {len(calls)}")

    work = topology.work["orders"]
    async with running_worker(settings, topology, amqp, failing):
        await publish_to_queue(amqp, work.name, "evt_ladder")
        dead = await eventually(lambda: get_one(amqp, work.dlq), lambda m: m is not None)
        assert dead is not None
        # Nothing comes back after the DLQ: no copy left on the work or retry queues.
        for queue in (work.name, *work.retry_queues):
            assert await drain(amqp, queue) == []

    assert [attempts for _, attempts in calls] == [0, 1, 2]  # settings: RETRY_DELAYS=0.2,0.4
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(calls)]
    assert gaps[0] >= 0.18
    assert gaps[1] >= 0.38
    assert dead.body == RAW_BODY
    assert dead.message_id == "evt_ladder"
    assert header(dead, "reason") == "retries_exhausted"
    assert int(header(dead, "attempts")) == 3
    assert "RuntimeError" in header(dead, "error")
    assert "call 3" in header(dead, "error")  # the last error, not the first
    assert header(dead, "original_queue") == work.name
    first = dt.datetime.fromisoformat(header(dead, "first_failed_at"))
    last = dt.datetime.fromisoformat(header(dead, "last_failed_at"))
    assert first <= last
    assert last - first >= dt.timedelta(seconds=0.5)


async def test_permanent_error_dead_letters_at_once_as_invalid_message(
    settings: Settings, topology: Topology, amqp: Any
) -> None:
    calls: list[Delivery] = []

    async def rejecting(delivery: Delivery) -> str:
        calls.append(delivery)
        raise InvalidEventError("status_changed without status")

    work = topology.work["orders"]
    async with running_worker(settings, topology, amqp, rejecting):
        await publish_to_queue(amqp, work.name, "evt_invalid")
        dead = await eventually(lambda: get_one(amqp, work.dlq), lambda m: m is not None)
        assert dead is not None
        for queue in (work.name, *work.retry_queues):
            assert await drain(amqp, queue) == []

    assert len(calls) == 1
    assert dead.body == RAW_BODY
    assert header(dead, "reason") == "invalid_message"
    assert int(header(dead, "attempts")) == 1
    assert "InvalidEventError" in header(dead, "error")
    assert header(dead, "original_queue") == work.name
    assert header(dead, "first_failed_at") == header(dead, "last_failed_at")


# --- unknown payment, DLQ, requeue ---------------------------------------------------------


async def test_event_parked_past_its_park_dead_letters_then_requeued_after_registering_applies_once(
    system: System, db: Any, smtp: tuple[SmtpSink, int], amqp: Any, topology: Topology
) -> None:
    """No order: parked (UNKNOWN_PAYMENT_PARK_SECONDS is 1 s in the tests), then dead-lettered
    with reason unknown_payment; registered and requeued, it takes effect once."""
    payment_id, event_id = new_id("pay"), new_id("evt")
    payload = payment_event(payment_id, "paid")
    work = topology.work["orders"]

    await post(system.ingest, payload, event_id)

    await eventually(lambda: depths(amqp, [work.dlq]), lambda d: d[work.dlq] == 1, timeout_s=15)
    assert await effects(db, payment_id) == {
        "status": None,
        "bonus": 0,
        "ledger": [],
        "emails": [],
    }

    await register(db, payment_id)
    dead = await requeue_one(amqp, work.dlq)

    assert dead.body == orjson.dumps(payload)
    assert header(dead, "reason") == "unknown_payment"
    assert int(header(dead, "attempts")) == 1  # parked, never on the retry ladder
    assert header(dead, "original_queue") == work.name
    done = await quiescent(db, system, extra_orders_deliveries=1)
    assert done["orders_finished"] == 2  # parked once, then processed once
    await assert_paid_once(db, smtp[0], payment_id, "PAID")
    processed = await db.fetchval(
        "SELECT count(*) FROM processed_events WHERE worker = 'orders' AND event_id = $1", event_id
    )
    assert processed == 1
    await assert_dlqs_empty(amqp, topology)


# --- the outbox: a crash between commit and publish ------------------------------------------


async def test_transition_committed_but_never_published_is_published_once_by_the_relay(
    aiohttp_client: Any,
    effect_settings: Settings,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    payment_id, event_id = new_id("pay"), new_id("evt")
    await register(db, payment_id)
    await declare(amqp, topology)
    work = topology.work
    # The orders handler with a relay that never runs: its transaction commits the transition
    # and the outbox row, and nothing publishes them - what a process killed right after the
    # commit leaves behind.
    pool = await create_pool(effect_settings.database_url, max_size=2)
    try:
        relay = OutboxRelay(pool, Broker(effect_settings.amqp_url, topology))
        handle = one_by_one(orders_handler(pool, relay, OrderMetrics.create(new_registry())))
        body = orjson.dumps(payment_event(payment_id, "paid"))
        outcome = await handle(Delivery(event_id, "payment.status_changed", body, attempts=0))
    finally:
        await pool.close()

    assert outcome == "ok"
    rows = await db.fetch("SELECT message_id, routing_key, published_at FROM outbox")
    assert [tuple(r) for r in rows] == [(f"{event_id}:order.paid", "order.paid", None)]
    assert (await effects(db, payment_id))["status"] == "PAID"
    assert await drain(amqp, work["bonuses"].name) == []
    assert await drain(amqp, work["emails"].name) == []

    system = await start_system(
        aiohttp_client,
        effect_settings,
        amqp,
        topology,
        {"orders": 1, "bonuses": 1, "email": 1},
    )

    done = await quiescent(db, system)
    assert (done["bonuses_finished"], done["email_finished"]) == (1, 1)  # published once
    published = await db.fetchval("SELECT published_at FROM outbox")
    assert published is not None
    await assert_paid_once(db, smtp[0], payment_id, "PAID")
    assert len(smtp[0].messages) == 1
    await assert_dlqs_empty(amqp, topology)


async def test_event_id_at_the_255_character_limit_goes_all_the_way_through(
    aiohttp_client: Any,
    effect_settings: Settings,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    """Ingest takes ids of up to 255 characters; the transition's message id adds
    ":order.paid" and would no longer fit an AMQP short string. It must still publish (hashed
    id) rather than fail on every relay pass and leave the payment without bonus and email."""
    payment_id, event_id = new_id("pay"), "evt_" + "x" * 251
    await register(db, payment_id)
    system = await start_system(aiohttp_client, effect_settings, amqp, topology)

    await post(system.ingest, payment_event(payment_id, "paid"), event_id)

    done = await quiescent(db, system)
    assert (done["bonuses_finished"], done["email_finished"]) == (1, 1)
    await assert_paid_once(db, smtp[0], payment_id, "PAID")
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
    await assert_dlqs_empty(amqp, topology)


async def test_relay_marks_every_confirmed_row_even_after_one_that_fails(
    effect_settings: Settings, amqp: Any, topology: Topology, db: Any
) -> None:
    """One row that cannot be published must neither hold back the rows after it nor make
    the relay send them again on every pass."""
    await declare(amqp, topology)
    await db.execute(
        "INSERT INTO outbox (message_id, routing_key, body) VALUES ($1, $2, $3)",
        "evt_poison:order.paid",
        "order.paid",
        b'{"not": "published"}',
    )
    for i in range(5):
        await db.execute(
            "INSERT INTO outbox (message_id, routing_key, body) VALUES ($1, $2, $3)",
            f"evt_{i}:order.paid",
            "order.paid",
            b"{}",
        )
    pool = await create_pool(effect_settings.database_url, max_size=2)
    broker = Broker(effect_settings.amqp_url, topology)
    await broker.start()
    try:
        await broker.wait_connected(10)
        failing = broker.start_publishes

        async def first_fails(messages: Any) -> Any:
            futures = await failing(messages)
            futures[0].cancel()  # the first row's publish fails (as a refused frame would)
            return futures

        broker.start_publishes = first_fails  # type: ignore[method-assign]
        relay = OutboxRelay(pool, broker)
        assert await relay.relay_once() == 5
        assert await relay.relay_once() == 0  # only the failed row is left, and it fails again
    finally:
        await broker.close()
        await pool.close()

    unpublished = await db.fetch("SELECT message_id FROM outbox WHERE published_at IS NULL")
    assert [r["message_id"] for r in unpublished] == ["evt_poison:order.paid"]
    delivered = await drain(amqp, topology.work["bonuses"].name)
    assert sorted(m.message_id for m in delivered if m.message_id != "evt_poison:order.paid") == [  # type: ignore[type-var]
        f"evt_{i}:order.paid" for i in range(5)
    ]  # each once: a second pass did not send them again
    assert {(m.headers or {}).get("schema") for m in delivered} == {ORDER_TRANSITION_SCHEMA}


async def test_rows_handed_over_at_commit_are_published_and_marked_before_any_sweep(
    effect_settings: Settings, amqp: Any, topology: Topology, db: Any
) -> None:
    """The orders handler hands its committed rows to the relay, which publishes them at once;
    the sweep leaves rows younger than its grace to that hand-over."""
    await declare(amqp, topology)
    rows = [(f"evt_handed_{i}:order.paid", "order.paid", b"{}") for i in range(3)]
    for row in rows:
        await db.execute(
            "INSERT INTO outbox (message_id, routing_key, body) VALUES ($1, $2, $3)", *row
        )
    pool = await create_pool(effect_settings.database_url, max_size=2)
    broker = Broker(effect_settings.amqp_url, topology)
    await broker.start()
    try:
        await broker.wait_connected(10)
        relay = OutboxRelay(pool, broker)
        assert await relay.relay_once(older_than_s=60) == 0  # young: the hand-over's
        relay.committed(rows)
        assert await relay.publish_committed() == 3
        assert await relay.publish_committed() == 0  # handed over once, published once
    finally:
        await broker.close()
        await pool.close()

    assert await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
    delivered = await drain(amqp, topology.work["bonuses"].name)
    assert sorted(m.message_id for m in delivered) == [r[0] for r in rows]  # type: ignore[type-var]


async def test_refund_completed_delivered_after_its_reversal_leaves_the_order_paid(
    aiohttp_client: Any,
    effect_settings: Settings,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    """paid; refunded (t1); refund.reversed r1 (t2); then the refund.completed of r1 (t1),
    delivered late. The provider's truth is PAID with the bonus: the late refund must neither
    refund the order again nor leave a REFUNDED order holding points."""
    payment_id = new_id("pay")
    await register(db, payment_id)
    system = await start_system(aiohttp_client, effect_settings, amqp, topology)
    t1, t2 = "2026-11-30T11:00:00Z", "2026-11-30T12:00:00Z"
    refund = {"payment_id": payment_id, "refund_id": "r1", "amount": "100.00", "currency": "USD"}

    for payload in (
        payment_event(payment_id, "paid"),
        payment_event(payment_id, "refunded", created_at=t1),
        {"event": "refund.reversed", **refund, "created_at": t2},
        {"event": "refund.completed", **refund, "created_at": t1},
    ):
        await post(system.ingest, payload)
        await quiescent(db, system)

    assert await effects(db, payment_id) == {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant", "clawback", "restore"],
        "emails": ["payment_refunded", "payment_succeeded"],
    }
    await assert_dlqs_empty(amqp, topology)
