"""shared.ops.dlq against a real RabbitMQ: show keeps every message in place, requeue moves exactly
what was asked (confirmed before acknowledged), purge reports what it removed.

The DLQ is filled as the worker runtime fills it (its failure headers), plus one message that
RabbitMQ dead-lettered itself when the work queue's delivery limit ran out.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import orjson
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, DeliveryMode

from shared.amqp.topology import DELIVERY_LIMIT, Topology, WorkQueue
from shared.ops import dlq
from shared.ops.dlq_moves import Selection, UnroutableError, purge, requeue
from shared.vocabulary import (
    ATTEMPTS,
    FIRST_FAILED_AT,
    LAST_ERROR,
    LAST_FAILED_AT,
    ORIGINAL_QUEUE,
    REASON,
    REQUEUED,
)
from tests.conftest import TEST_AMQP_URL
from tests.helpers import drain, eventually, payment_event
from tests.integration.system import depths

BASE_TIME = dt.datetime(2026, 1, 1, 10, 0, tzinfo=dt.UTC)


def new_id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Letter:
    """A dead letter as the worker runtime leaves it in a DLQ."""

    id: str = field(default_factory=lambda: new_id("evt"))
    reason: str = "unknown_payment"
    event: str = "payment.status_changed"
    payment_id: str = field(default_factory=lambda: new_id("pay"))
    failed_at: dt.datetime = BASE_TIME
    attempts: int = 3
    requeued: int = 0
    original_queue: str | None = None  # None: the queue whose DLQ it is in

    @property
    def body(self) -> bytes:
        return orjson.dumps(payment_event(self.payment_id, event=self.event))


def selection_letters() -> dict[str, Letter]:
    """What the requeue-selection tests pick from, a minute apart: a and c unknown_payment
    (c a refund event), b retries_exhausted."""
    minute = dt.timedelta(minutes=1)
    return {
        "a": Letter(reason="unknown_payment", failed_at=BASE_TIME),
        "b": Letter(reason="retries_exhausted", failed_at=BASE_TIME + minute),
        "c": Letter(
            reason="unknown_payment", event="refund.completed", failed_at=BASE_TIME + 2 * minute
        ),
    }


async def put_dead_letters(
    channel: AbstractChannel, work: WorkQueue, letters: Sequence[Letter]
) -> None:
    """Publish `letters` to the DLQ of `work`, in order, each confirmed before the next."""
    for letter in letters:
        headers: dict[str, Any] = {
            ATTEMPTS: letter.attempts,
            FIRST_FAILED_AT: (letter.failed_at - dt.timedelta(seconds=1)).isoformat(),
            LAST_FAILED_AT: letter.failed_at.isoformat(),
            LAST_ERROR: f"UnknownPaymentError: no order registered for {letter.payment_id}",
            REASON: letter.reason,
            ORIGINAL_QUEUE: letter.original_queue or work.name,
        }
        if letter.requeued:
            headers[REQUEUED] = letter.requeued
        message = aio_pika.Message(
            letter.body,
            headers=headers,
            message_id=letter.id,
            type=letter.event,
            content_type="application/json",
            delivery_mode=DeliveryMode.PERSISTENT,
        )
        await channel.default_exchange.publish(message, work.dlq, mandatory=True)


async def kill_by_delivery_limit(channel: AbstractChannel, work: WorkQueue, letter: Letter) -> None:
    """Put `letter` on the work queue and let a consumer die holding it until RabbitMQ itself
    dead-letters it (reason `delivery_limit`, no headers of ours)."""
    before = (await depths(channel, [work.dlq]))[work.dlq]
    message = aio_pika.Message(
        letter.body,
        message_id=letter.id,
        type=letter.event,
        content_type="application/json",
        delivery_mode=DeliveryMode.PERSISTENT,
    )
    await channel.default_exchange.publish(message, work.name, mandatory=True)
    async with await aio_pika.connect(TEST_AMQP_URL) as connection:
        for _ in range(DELIVERY_LIMIT + 1):
            dying = await connection.channel()
            queue = await dying.get_queue(work.name, ensure=False)
            held = await eventually(
                lambda q=queue: q.get(no_ack=False, fail=False),  # type: ignore[misc]
                lambda m: m is not None,
            )
            assert held is not None
            await dying.close()  # unacknowledged: back to the queue, one delivery more
    await eventually(
        lambda: depths(channel, [work.dlq, work.name]),
        lambda d: d == {work.dlq: before + 1, work.name: 0},
    )


async def contents(channel: AbstractChannel, queue: str) -> list[AbstractIncomingMessage]:
    """Take every message out of `queue` (end of a test: what is there, in order)."""
    return await drain(channel, queue, settle_s=0.03)


async def settled(channel: AbstractChannel, counts: dict[str, int]) -> None:
    """Wait until the queues hold `counts` ready messages: messages a DLQ operation handed
    back are ready again a moment after the call returns."""
    await eventually(lambda: depths(channel, counts), lambda d: d == counts, timeout_s=5)


async def queue_ids(
    channel: AbstractChannel, expected: dict[str, list[str]]
) -> dict[str, list[str]]:
    """The message ids in each queue, in order, once they hold as many as `expected` says."""
    await settled(channel, {q: len(v) for q, v in expected.items()})
    return {q: ids(await contents(channel, q)) for q in expected}


def ids(messages: Sequence[AbstractIncomingMessage]) -> list[str]:
    return [m.message_id or "" for m in messages]


@pytest.fixture
def orders(topology: Topology) -> WorkQueue:
    return topology.work["orders"]


@dataclass
class Filled:
    """A DLQ holding five worker dead letters and one RabbitMQ delivery-limit one, in order."""

    a: Letter
    b: Letter
    c: Letter
    d: Letter
    e: Letter
    limit: Letter

    @property
    def all(self) -> list[Letter]:
        return [self.a, self.b, self.c, self.d, self.e, self.limit]


@pytest.fixture
async def filled(channel: AbstractChannel, orders: WorkQueue) -> Filled:
    p1, p2, p3, p4 = (new_id("pay") for _ in range(4))
    minute = dt.timedelta(minutes=1)
    letters = Filled(
        a=Letter(reason="unknown_payment", payment_id=p1, failed_at=BASE_TIME),
        b=Letter(reason="retries_exhausted", payment_id=p2, failed_at=BASE_TIME + minute),
        c=Letter(
            reason="unknown_payment",
            event="refund.completed",
            payment_id=p1,
            failed_at=BASE_TIME + 2 * minute,
        ),
        d=Letter(
            reason="invalid_message",
            event="refund.completed",
            payment_id=p3,
            failed_at=BASE_TIME + 3 * minute,
        ),
        e=Letter(reason="unknown_payment", payment_id=p2, failed_at=BASE_TIME + 4 * minute),
        limit=Letter(reason="delivery_limit", payment_id=p4, attempts=0),
    )
    await put_dead_letters(channel, orders, [letters.a, letters.b, letters.c, letters.d, letters.e])
    await kill_by_delivery_limit(channel, orders, letters.limit)
    return letters


# --- show -----------------------------------------------------------------------------------


async def test_show_twice_returns_every_message_in_the_same_order_and_leaves_them_queued(
    channel: AbstractChannel, orders: WorkQueue, filled: Filled
) -> None:
    first = await dlq.show(channel, orders.dlq)
    second = await dlq.show(channel, orders.dlq)

    expected = [letter.id for letter in filled.all]
    assert [d.id for d in first] == expected
    assert [d.id for d in second] == expected
    assert await queue_ids(channel, {orders.dlq: expected}) == {orders.dlq: expected}


async def test_show_many_times_never_drops_a_message(
    channel: AbstractChannel, orders: WorkQueue
) -> None:
    # The api's monitor shows every non-empty DLQ every few seconds: a DLQ message is handed
    # back hundreds of times a day and must survive every one of them.
    letters = [Letter() for _ in range(3)]
    await put_dead_letters(channel, orders, letters)

    for _ in range(30):
        await dlq.show(channel, orders.dlq)

    assert [d.id for d in await dlq.show(channel, orders.dlq)] == [x.id for x in letters]
    expected = {orders.dlq: [x.id for x in letters]}
    assert await queue_ids(channel, expected) == expected


async def test_show_describes_worker_failures_from_our_headers(
    channel: AbstractChannel, orders: WorkQueue
) -> None:
    letter = Letter(reason="retries_exhausted", attempts=3)
    await put_dead_letters(channel, orders, [letter])

    [shown] = await dlq.show(channel, orders.dlq)

    assert shown.as_json() == {
        "id": letter.id,
        "event_id": letter.id,
        "event": "payment.status_changed",
        "payment_id": letter.payment_id,
        "reason": "retries_exhausted",
        "error": f"UnknownPaymentError: no order registered for {letter.payment_id}",
        "attempts": 3,
        "first_failed_at": (BASE_TIME - dt.timedelta(seconds=1)).isoformat(),
        "last_failed_at": BASE_TIME.isoformat(),
        "original_queue": orders.name,
        "requeued": 0,
        "provider": "xhub",
    }


async def test_show_describes_a_delivery_limit_death_from_rabbitmqs_x_death(
    channel: AbstractChannel, orders: WorkQueue
) -> None:
    letter = Letter(reason="delivery_limit")
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    await kill_by_delivery_limit(channel, orders, letter)

    [shown] = await dlq.show(channel, orders.dlq)

    assert (shown.id, shown.reason, shown.original_queue) == (
        letter.id,
        "delivery_limit",
        orders.name,
    )
    assert (shown.event, shown.payment_id) == ("payment.status_changed", letter.payment_id)
    assert shown.last_failed_at is not None
    died_at = dt.datetime.fromisoformat(shown.last_failed_at)
    assert before - dt.timedelta(seconds=2) <= died_at <= dt.datetime.now(dt.UTC)


async def test_stats_count_each_dlq_and_age_its_oldest_message(
    channel: AbstractChannel, topology: Topology
) -> None:
    an_hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    await put_dead_letters(
        channel,
        topology.work["emails"],
        [Letter(failed_at=an_hour_ago), Letter(failed_at=an_hour_ago + dt.timedelta(minutes=30))],
    )

    stats = {s.queue: s for s in await dlq.stats(channel, topology)}

    assert {q: s.messages for q, s in stats.items()} == {
        topology.work["orders"].dlq: 0,
        topology.work["bonuses"].dlq: 0,
        topology.work["emails"].dlq: 2,
    }
    age = stats[topology.work["emails"].dlq].oldest_age_seconds
    assert age is not None
    assert 3600 <= age < 3660
    assert stats[topology.work["orders"].dlq].oldest_age_seconds is None


# --- requeue --------------------------------------------------------------------------------


SELECTIONS: dict[str, tuple[dict[str, Any], str]] = {
    # name: (matcher arguments, with letters named by their Filled attribute; expected letters)
    "by ids": ({"ids": ["b", "d"]}, "bd"),
    "by reason": ({"reason": "unknown_payment"}, "ace"),
    "by rabbitmq's reason": ({"reason": "delivery_limit"}, "L"),
    "by event type": ({"event_type": "refund.completed"}, "cd"),
    "by payment id": ({"payment_id": "a"}, "ac"),
    "by time range": ({"since": 1, "until": 3}, "bcd"),
    "by reason and payment id": ({"reason": "unknown_payment", "payment_id": "b"}, "e"),
    "all": ({"everything": True}, "abcdeL"),
}


def letter_named(filled: Filled, name: str) -> Letter:
    letter: Letter = filled.limit if name == "L" else getattr(filled, name)
    return letter


def selection(filled: Filled, spec: dict[str, Any]) -> dict[str, Any]:
    """Matcher arguments with letter names turned into that letter's ids and times."""
    args = dict(spec)
    if "ids" in args:
        args["ids"] = tuple(letter_named(filled, n).id for n in args["ids"])
    if "payment_id" in args:
        args["payment_id"] = letter_named(filled, args["payment_id"]).payment_id
    for key in ("since", "until"):
        if key in args:
            args[key] = BASE_TIME + dt.timedelta(minutes=args[key])
    return args


@pytest.mark.parametrize(("spec", "expected"), SELECTIONS.values(), ids=SELECTIONS.keys())
async def test_requeue_moves_exactly_the_selected_messages_to_their_original_queue(
    channel: AbstractChannel,
    orders: WorkQueue,
    filled: Filled,
    spec: dict[str, Any],
    expected: str,
) -> None:
    args = selection(filled, spec)
    moved = [letter_named(filled, n) for n in expected]
    kept = [x for x in filled.all if x not in moved]

    result = await requeue(channel, orders.dlq, Selection(**args))

    assert [d.id for d in result.requeued] == [x.id for x in moved]
    assert result.not_found == []
    assert not result.dry_run
    await settled(channel, {orders.dlq: len(kept), orders.name: len(moved)})
    requeued = await contents(channel, orders.name)
    assert ids(requeued) == [x.id for x in moved]
    assert ids(await contents(channel, orders.dlq)) == [x.id for x in kept]
    for message, letter in zip(requeued, moved, strict=True):
        headers = message.headers or {}
        assert message.body == letter.body
        assert message.type == letter.event
        assert headers[REQUEUED] == 1
        assert ATTEMPTS not in headers  # a fresh retry ladder
        assert REASON not in headers
        assert "x-death" not in headers  # no stale death record
        assert headers.get("x-delivery-count", 0) == 0  # the work queue's own, first delivery


async def test_requeue_limit_moves_only_the_first_matching_messages(
    channel: AbstractChannel, orders: WorkQueue, filled: Filled
) -> None:
    result = await requeue(channel, orders.dlq, Selection(reason="unknown_payment"), limit=2)

    assert [d.id for d in result.requeued] == [filled.a.id, filled.c.id]
    expected = {
        orders.name: [filled.a.id, filled.c.id],
        orders.dlq: [x.id for x in (filled.b, filled.d, filled.e, filled.limit)],
    }
    assert await queue_ids(channel, expected) == expected


async def test_dry_run_reports_what_would_move_and_moves_nothing(
    channel: AbstractChannel, orders: WorkQueue, filled: Filled
) -> None:
    result = await requeue(channel, orders.dlq, Selection(everything=True), dry_run=True)

    assert result.dry_run
    assert [d.id for d in result.requeued] == [x.id for x in filled.all]
    expected = {orders.dlq: [x.id for x in filled.all], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_requeue_by_id_reports_ids_that_are_not_in_the_dlq(
    channel: AbstractChannel, orders: WorkQueue
) -> None:
    letter = Letter()
    await put_dead_letters(channel, orders, [letter])

    result = await requeue(channel, orders.dlq, Selection(ids=(letter.id, "evt_gone")))

    assert [d.id for d in result.requeued] == [letter.id]
    assert result.not_found == ["evt_gone"]


async def test_requeue_by_event_id_does_not_report_that_id_not_found(
    channel: AbstractChannel, topology: Topology
) -> None:
    # A bonuses or emails message's id is `<event id>:order.paid`; operators know the event id.
    bonuses = topology.work["bonuses"]
    event_id = new_id("evt")
    message = aio_pika.Message(
        orjson.dumps({"source_event_id": event_id, "event": "order.paid", "payment_id": "p"}),
        headers={REASON: "retries_exhausted", ORIGINAL_QUEUE: bonuses.name},
        message_id=f"{event_id}:order.paid",
        delivery_mode=DeliveryMode.PERSISTENT,
    )
    await channel.default_exchange.publish(message, bonuses.dlq, mandatory=True)
    wanted = [event_id, "evt_gone"]

    result = await requeue(channel, bonuses.dlq, Selection(ids=tuple(wanted)))

    assert [d.id for d in result.requeued] == [f"{event_id}:order.paid"]
    assert result.not_found == ["evt_gone"]
    expected = {bonuses.name: [f"{event_id}:order.paid"], bonuses.dlq: []}
    assert await queue_ids(channel, expected) == expected


async def test_no_selection_requeues_nothing(channel: AbstractChannel, orders: WorkQueue) -> None:
    letters = [Letter(), Letter()]
    await put_dead_letters(channel, orders, letters)

    result = await requeue(channel, orders.dlq, Selection())

    assert result.requeued == []
    expected = {orders.dlq: [x.id for x in letters], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_requeue_counts_every_requeue_in_a_header(
    channel: AbstractChannel, orders: WorkQueue
) -> None:
    letter = Letter(requeued=1)  # it was requeued once before and died again
    await put_dead_letters(channel, orders, [letter])

    await requeue(channel, orders.dlq, Selection(everything=True))

    [message] = await eventually(
        lambda: contents(channel, orders.name), lambda messages: len(messages) == 1
    )
    assert (message.headers or {})[REQUEUED] == 2


# --- requeue safety: a failure between publish and ack ------------------------------------


class InjectedCrashError(Exception):
    """Stands for the requeue process dying at that exact point."""


def fail_on_call(number: int, original: Any) -> Any:
    """A replacement for an async method that raises on its `number`th call."""
    calls = 0

    async def replacement(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == number:
            raise InjectedCrashError(f"call {number}")
        return await original(self, *args, **kwargs)

    return replacement


@pytest.fixture
async def requeue_channel() -> AsyncIterator[AbstractChannel]:
    """A channel of its own for the requeue, closed when it fails (as the CLI's and api's
    are): whatever it held unacknowledged goes back to the DLQ."""
    async with await aio_pika.connect(TEST_AMQP_URL) as connection:
        yield await connection.channel(publisher_confirms=True)


@pytest.mark.parametrize(
    ("patched", "in_both"),
    [
        pytest.param((aio_pika.message.IncomingMessage, "ack"), True, id="ack fails"),
        pytest.param((aio_pika.exchange.Exchange, "publish"), False, id="publish fails"),
    ],
)
async def test_failure_mid_requeue_leaves_every_message_somewhere(
    channel: AbstractChannel,
    orders: WorkQueue,
    requeue_channel: AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
    patched: tuple[type, str],
    in_both: bool,
) -> None:
    letters = [Letter() for _ in range(5)]
    await put_dead_letters(channel, orders, letters)
    owner, method = patched
    monkeypatch.setattr(owner, method, fail_on_call(2, getattr(owner, method)))

    with pytest.raises(InjectedCrashError):
        await requeue(requeue_channel, orders.dlq, Selection(everything=True))
    monkeypatch.undo()
    await requeue_channel.close()

    all_ids = {x.id for x in letters}
    # The first was moved; the second was published (and its ack failed) or not (its publish
    # failed); the others were never touched. Everything is somewhere, at least once.
    first, second = letters[0].id, letters[1].id
    expected_work = [first, second] if in_both else [first]
    await settled(channel, {orders.dlq: 4, orders.name: len(expected_work)})
    work_ids = ids(await contents(channel, orders.name))
    dlq_ids = ids(await contents(channel, orders.dlq))
    assert work_ids == expected_work
    assert set(dlq_ids) == all_ids - {first}
    assert set(work_ids) | set(dlq_ids) == all_ids


@pytest.mark.parametrize("on_return_raises", [False, True], ids=["returned", "raised"])
async def test_requeue_to_a_queue_that_no_longer_exists_keeps_the_message_in_the_dlq(
    channel: AbstractChannel, orders: WorkQueue, on_return_raises: bool
) -> None:
    # Its original queue was renamed or deleted (another AMQP_PREFIX, a retired worker): the
    # broker returns the unroutable copy instead of queueing it, so the DLQ copy must stay.
    # The CLI's and the api's channels raise on a return; others hand the message back.
    stranded = Letter(original_queue=f"{orders.name}-retired")
    kept = Letter()
    await put_dead_letters(channel, orders, [stranded, kept])

    async with await aio_pika.connect(TEST_AMQP_URL) as connection:
        requeue_channel = await connection.channel(
            publisher_confirms=True, on_return_raises=on_return_raises
        )
        with pytest.raises(UnroutableError, match=f"{orders.name}-retired"):
            await requeue(requeue_channel, orders.dlq, Selection(everything=True))

    expected = {orders.dlq: [stranded.id, kept.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


# --- purge ----------------------------------------------------------------------------------


async def test_purge_returns_every_message_it_removed_and_empties_the_dlq(
    channel: AbstractChannel, orders: WorkQueue, filled: Filled
) -> None:
    removed = await purge(channel, orders.dlq)

    assert [d.id for d in removed] == [x.id for x in filled.all]
    assert [d.reason for d in removed] == [x.reason for x in filled.all]
    assert await contents(channel, orders.dlq) == []
    assert await depths(channel, [orders.dlq, orders.name]) == {orders.dlq: 0, orders.name: 0}
