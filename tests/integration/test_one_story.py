"""One story per payment (SPEC 5): however the order's transitions reach the bonus and email
workers, the ledger tells the order's history, the emails never contradict it, and a success
email never follows the refund email.

The orders worker's side is played here: it commits a payment's transitions one at a time, and
each `order.*` message exists only once its transition is committed. Every schedule
interleaves those commits with the bonus and email handlers taking the messages, in any order,
some twice (a redelivery, a retry the ladder reordered). Real PostgreSQL and a real SMTP server.
The last test runs the whole system through RabbitMQ with paid and refund webhooks racing.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from services.bonuses.handler import make_handler as bonus_handler
from services.email.handler import make_handler as email_handler
from services.email.sender import SmtpRejectedError, SmtpSender
from services.sim.summary import actual_effects, story_problems
from shared.amqp.topology import Topology
from shared.bonus_rules import Transition, entries_for
from shared.db import create_pool
from shared.messages import OrderTransition
from shared.metrics import BonusMetrics, EmailMetrics, new_registry
from shared.ops.payment_view import payment_view
from shared.queries import orders as orders_sql
from shared.vocabulary import EARNING, REFUNDED_EMAIL, SUCCEEDED_EMAIL
from shared.worker.batches import Delivery
from tests.batch_handlers import Handler, one_by_one
from tests.conftest import RefusingSink, SmtpSink, smtp_server
from tests.helpers import payment_event
from tests.integration.system import (
    System,
    gather_posts,
    quiescent,
    register,
    start_system,
    system_settings,
)

POINTS = 500
EMAIL_FROM = "payhooks@example.test"

# The histories that tell a story: paid then refunded; a refund reversed; refunded twice.
HISTORIES = {
    "refunded": ("PAID", "REFUNDED"),
    "reversed": ("PAID", "REFUNDED", "PAID"),
    "refund_again": ("PAID", "REFUNDED", "PAID", "REFUNDED"),
    "settled_refunded": ("PAID", "SETTLED", "REFUNDED"),
    "refund_first": ("REFUNDED", "PAID"),  # the orders worker saw the refund, then its reversal
}


@dataclass(frozen=True, slots=True)
class Workers:
    bonus: Handler
    email: Handler


@pytest.fixture
async def workers(
    migrated_database: str, smtp: tuple[SmtpSink, int], db: Any
) -> AsyncIterator[Workers]:
    pool = await create_pool(migrated_database, max_size=4)
    sender = SmtpSender("127.0.0.1", smtp[1], connections=1)
    try:
        yield Workers(
            one_by_one(bonus_handler(pool, POINTS, BonusMetrics.create(new_registry()))),
            one_by_one(
                email_handler(pool, sender, EMAIL_FROM, EmailMetrics.create(new_registry()))
            ),
        )
    finally:
        await sender.close()
        await pool.close()


def message(payment_id: str, n: int, from_status: str, to_status: str) -> Delivery:
    transition = OrderTransition(
        event=f"order.{to_status.lower()}",
        payment_id=payment_id,
        order_id=f"ord_{payment_id}",
        user_id=f"user_{payment_id}",
        from_status=from_status,
        to_status=to_status,
        source_event_id=f"ev{n}_{payment_id}",
    )
    return Delivery(transition.message_id, transition.event, transition.encode(), 0)


async def commit(db: Any, payment_id: str, n: int, from_status: str, to_status: str) -> None:
    await orders_sql.add_transitions(
        db, [orders_sql.TransitionRow(payment_id, from_status, to_status, f"ev{n}_{payment_id}")]
    )
    await db.execute("UPDATE orders SET status = $2 WHERE payment_id = $1", payment_id, to_status)


Step = tuple[str, int]  # ("commit" | "bonus" | "email", transition index)


def schedules(n: int, rng: random.Random, count: int) -> list[list[Step]]:
    """Random schedules: commits in order, each message handled by both workers after its
    commit, in any order; now and then a message is handled again later."""
    found = []
    for _ in range(count):
        todo: list[Step]
        committed, todo, steps = 0, [], []
        while committed < n or todo:
            if committed < n and (not todo or rng.random() < 0.4):
                steps.append(("commit", committed))
                todo += [("bonus", committed), ("email", committed)]
                committed += 1
                continue
            step = todo.pop(rng.randrange(len(todo)))
            steps.append(step)
            if rng.random() < 0.15:
                todo.append(step)  # redelivered: handled once more, later
        found.append(steps)
    return found


def after_all_commits(n: int) -> list[list[Step]]:
    """Every order of the messages once the whole history is committed, the email worker
    taking them in the reverse of the bonus worker's order."""
    commits = [("commit", i) for i in range(n)]
    return [
        commits + [s for i in order for s in (("bonus", i), ("email", order[-1 - order.index(i)]))]
        for order in itertools.permutations(range(n))
    ]


async def play(db: Any, workers: Workers, statuses: Sequence[str], steps: list[Step]) -> str:
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    await register(db, payment_id)
    froms = ["PENDING", *statuses[:-1]]
    for kind, i in steps:
        if kind == "commit":
            await commit(db, payment_id, i, froms[i], statuses[i])
        else:
            handler = workers.bonus if kind == "bonus" else workers.email
            await handler(message(payment_id, i, froms[i], statuses[i]))
    return payment_id


async def assert_one_story(
    db: asyncpg.Connection[Any], sink: SmtpSink, payment_id: str, statuses: Sequence[str]
) -> None:
    rows = await db.fetch(
        "SELECT t.id, t.to_status, b.kind, b.points FROM order_transitions t"
        " LEFT JOIN bonus_ledger b ON b.transition_id = t.id WHERE t.payment_id = $1"
        " ORDER BY t.id",
        payment_id,
    )
    history = [Transition(r["id"], r["to_status"], "") for r in rows]
    due = {e.transition.id: e.kind.value for e in entries_for(history)}
    assert {r["id"]: r["kind"] for r in rows if r["kind"]} == due  # one entry per due transition
    net = await db.fetchval(
        "SELECT coalesce(sum(points), 0) FROM bonus_ledger WHERE payment_id = $1", payment_id
    )
    assert net == (POINTS if statuses[-1] in EARNING else 0)

    smtp = [
        str(m["X-Payhooks-Template"])
        for m in sink.messages
        if str(m["Message-ID"]).endswith(f".{payment_id}@example.test>")
    ]
    assert max(Counter(smtp).values(), default=0) <= 1, smtp  # one SMTP message per key
    assert (REFUNDED_EMAIL in smtp) == ("REFUNDED" in statuses)
    if SUCCEEDED_EMAIL in smtp:
        assert "grant" in due.values()
        if REFUNDED_EMAIL in smtp:
            assert smtp.index(SUCCEEDED_EMAIL) < smtp.index(REFUNDED_EMAIL), smtp
    records = {
        r["template"]: r
        for r in await db.fetch(
            "SELECT template, skipped, sent_at FROM emails_sent WHERE payment_id = $1", payment_id
        )
    }
    earned = any(s in EARNING for s in statuses)
    assert (SUCCEEDED_EMAIL in records) == earned  # sent, or recorded as skipped
    if earned:
        assert records[SUCCEEDED_EMAIL]["skipped"] == (SUCCEEDED_EMAIL not in smtp)
        assert (records[SUCCEEDED_EMAIL]["sent_at"] is None) == records[SUCCEEDED_EMAIL]["skipped"]
    assert set(records) - {SUCCEEDED_EMAIL} == (
        {REFUNDED_EMAIL} if REFUNDED_EMAIL in smtp else set()
    )


@pytest.mark.parametrize("name", sorted(HISTORIES))
async def test_every_order_of_the_messages_after_the_history_tells_one_story(
    name: str, db: Any, workers: Workers, smtp: tuple[SmtpSink, int]
) -> None:
    statuses = HISTORIES[name]
    for steps in after_all_commits(len(statuses)):
        payment_id = await play(db, workers, statuses, steps)
        await assert_one_story(db, smtp[0], payment_id, statuses)


@pytest.mark.parametrize("name", sorted(HISTORIES))
async def test_messages_interleaved_with_the_commits_and_redelivered_tell_one_story(
    name: str, db: Any, workers: Workers, smtp: tuple[SmtpSink, int]
) -> None:
    statuses = HISTORIES[name]
    for steps in schedules(len(statuses), random.Random(name), count=25):
        payment_id = await play(db, workers, statuses, steps)
        await assert_one_story(db, smtp[0], payment_id, statuses)


async def test_refund_reversal_refund_nets_zero_with_a_ledger_row_per_transition(
    db: Any, workers: Workers, smtp: tuple[SmtpSink, int]
) -> None:
    statuses = HISTORIES["refund_again"]
    steps = [*[("commit", i) for i in range(4)], ("bonus", 3), ("email", 3), ("bonus", 0)]
    payment_id = await play(db, workers, statuses, steps)
    ledger = await db.fetch(
        "SELECT kind, points FROM bonus_ledger WHERE payment_id = $1 ORDER BY transition_id",
        payment_id,
    )
    assert [(r["kind"], r["points"]) for r in ledger] == [
        ("grant", 500),
        ("clawback", -500),
        ("restore", 500),
        ("clawback", -500),
    ]
    # The refund email went first (the email worker took the last transition first): the success
    # email of the earlier PAID is recorded as skipped, never sent.
    await workers.email(message(payment_id, 0, "PENDING", "PAID"))
    await assert_one_story(db, smtp[0], payment_id, statuses)
    # SPEC 5 and 7: the payment view shows the skipped email, and each ledger row's transition.
    view = await payment_view(db, payment_id, [])
    assert view is not None
    emails = {e["template"]: e for e in view["emails"]}
    assert (emails[SUCCEEDED_EMAIL]["skipped"], emails[SUCCEEDED_EMAIL]["sent_at"]) == (True, None)
    assert emails[REFUNDED_EMAIL]["skipped"] is False
    assert emails[REFUNDED_EMAIL]["sent_at"] is not None
    transitions = {t["id"]: t["to"] for t in view["transitions"]}
    assert [(b["kind"], transitions[b["transition_id"]]) for b in view["bonus"]] == [
        ("grant", "PAID"),
        ("clawback", "REFUNDED"),
        ("restore", "PAID"),
        ("clawback", "REFUNDED"),
    ]


async def test_the_paid_and_refund_messages_handled_at_once_tell_one_story(
    migrated_database: str, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    """Two consumers take order.paid and order.refunded of one payment at the same moment
    (prefetch does that): the per-payment lock makes one email wait for the other."""
    pool = await create_pool(migrated_database, max_size=8)
    sender = SmtpSender("127.0.0.1", smtp[1], connections=4)
    workers = Workers(
        one_by_one(bonus_handler(pool, POINTS, BonusMetrics.create(new_registry()))),
        one_by_one(email_handler(pool, sender, EMAIL_FROM, EmailMetrics.create(new_registry()))),
    )
    statuses = HISTORIES["refunded"]
    try:
        for _ in range(20):
            payment_id = await play(db, workers, statuses, [("commit", 0), ("commit", 1)])
            paid, refunded = (
                message(payment_id, 0, "PENDING", "PAID"),
                message(payment_id, 1, "PAID", "REFUNDED"),
            )
            await asyncio.gather(
                workers.email(refunded),
                workers.email(paid),
                workers.bonus(refunded),
                workers.bonus(paid),
            )
            await assert_one_story(db, smtp[0], payment_id, statuses)
    finally:
        await sender.close()
        await pool.close()


# --- the whole system: paid and refund webhooks racing through RabbitMQ -----------------------


async def test_paid_and_refund_webhooks_sent_together_tell_one_story_end_to_end(
    system: System, smtp: tuple[SmtpSink, int], db: Any
) -> None:
    """The issue's first report: paid and refunded close together, through ingest, RabbitMQ
    and every worker (prefetch lets each worker take both transitions at once). Whichever
    wins each race, every payment's ledger follows its transitions, nets 0, and its emails
    never tell a different story."""
    payment_ids = [f"pay_race_{n}_{uuid.uuid4().hex[:6]}" for n in range(30)]
    for payment_id in payment_ids:
        await register(db, payment_id)
    await gather_posts(
        system.ingest,
        [
            (
                payment_event(payment_id, status, created_at=f"2026-11-30T10:0{n}:00Z"),
                f"{s}_{payment_id}",
            )
            for payment_id in payment_ids
            for n, (status, s) in enumerate((("paid", "p"), ("refunded", "r")))
        ],
    )
    await quiescent(db, system)

    actual = await actual_effects(db, payment_ids)
    for payment_id in payment_ids:
        got = actual[payment_id]
        assert (got["status"], got["bonus"]) == ("REFUNDED", 0), got
        assert story_problems(got["transitions"], got["ledger"], got["emails"]) == [], got
        await assert_one_story(db, smtp[0], payment_id, got["transitions"])


# --- the email worker's batches --------------------------------------------------------------


def templates_in_arrival_order(sink: SmtpSink, payment_id: str) -> list[str]:
    return [
        str(m["X-Payhooks-Template"])
        for m in sink.messages
        if str(m["To"]) == f"{payment_id}@customer.test"
    ]


async def test_one_email_batch_keeps_each_payments_order_and_takes_back_a_failed_send(
    migrated_database: str, db: Any
) -> None:
    """One batch: payment A's paid then refunded (both sent, in that order), payment B's
    refunded then paid (the success email skipped), payment C's paid to a recipient the SMTP
    server refuses (failed alone, its claim taken back so that a retry sends it)."""
    a, b, c = (f"pay_{name}_{uuid.uuid4().hex[:8]}" for name in "abc")
    sink = RefusingSink(f"{c}@customer.test")
    for payment_id in (a, b, c):
        await register(db, payment_id)
    for payment_id in (a, b):
        await commit(db, payment_id, 0, "PENDING", "PAID")
        await commit(db, payment_id, 1, "PAID", "REFUNDED")
    await commit(db, c, 0, "PENDING", "PAID")
    batch = [
        message(a, 0, "PENDING", "PAID"),
        message(b, 1, "PAID", "REFUNDED"),
        message(c, 0, "PENDING", "PAID"),
        message(a, 1, "PAID", "REFUNDED"),
        message(b, 0, "PENDING", "PAID"),
    ]
    pool = await create_pool(migrated_database, max_size=2)
    with smtp_server(sink) as port:
        sender = SmtpSender("127.0.0.1", port, connections=2)
        try:
            handle = email_handler(pool, sender, EMAIL_FROM, EmailMetrics.create(new_registry()))
            results = await handle(batch)
        finally:
            await sender.close()
            await pool.close()

    assert results[:2] == ["ok", "ok"]
    assert results[3:] == ["ok", "ok"]
    assert isinstance(results[2], SmtpRejectedError)
    assert templates_in_arrival_order(sink, a) == [SUCCEEDED_EMAIL, REFUNDED_EMAIL]
    assert templates_in_arrival_order(sink, b) == [REFUNDED_EMAIL]
    assert templates_in_arrival_order(sink, c) == []
    rows = await db.fetch("SELECT payment_id, template, skipped FROM emails_sent")
    assert sorted(tuple(r) for r in rows) == sorted(
        [
            (a, SUCCEEDED_EMAIL, False),
            (a, REFUNDED_EMAIL, False),
            (b, REFUNDED_EMAIL, False),
            (b, SUCCEEDED_EMAIL, True),
        ]
    )


async def test_two_replicas_of_every_service_on_one_payments_racing_events_tell_one_story(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    """Two ingest, two orders, two bonus and two email replicas competing on the same queues;
    each payment's paid, settled and refunded webhooks sent twice (once to each ingest), all at
    once, in a shuffled order. No per-payment routing is needed: the order row's lock orders a
    payment's transitions, the ledger and email keys are unique per transition and payment, so
    every payment ends REFUNDED with its ledger and emails telling the transitions' story."""
    system = await start_system(
        aiohttp_client,
        system_settings(make_settings, smtp[1]),
        amqp,
        topology,
        {"ingest": 2, "orders": 2, "bonuses": 2, "email": 2},
    )
    payment_ids = [f"pay_replicas_{n}_{uuid.uuid4().hex[:6]}" for n in range(20)]
    for payment_id in payment_ids:
        await register(db, payment_id)
    events = [
        (
            payment_event(payment_id, status, created_at=f"2026-11-30T10:0{n}:00Z"),
            f"{s}_{payment_id}",
        )
        for payment_id in payment_ids
        for n, (status, s) in enumerate((("paid", "p"), ("settled", "s"), ("refunded", "r")))
    ]
    first, second = events[:], events[:]
    random.Random(11).shuffle(first)
    random.Random(12).shuffle(second)
    ingest = system.clients["ingest"]
    await asyncio.gather(gather_posts(ingest[0], first), gather_posts(ingest[1], second))
    await quiescent(db, system, timeout_s=30)

    actual = await actual_effects(db, payment_ids)
    for payment_id in payment_ids:
        got = actual[payment_id]
        assert (got["status"], got["bonus"]) == ("REFUNDED", 0), got
        assert story_problems(got["transitions"], got["ledger"], got["emails"]) == [], got
        await assert_one_story(db, smtp[0], payment_id, got["transitions"])
    for service in ("orders", "bonuses", "email"):
        assert all(n > 0 for n in system.finished_by_instance(service)), service
