"""Dead-letter queues as operators see them: every message read under the DLQ's lock and
handed back in order (looking moves nothing), described from our failure headers or
RabbitMQ's x-death. Requeue and purge: shared/ops/dlq_moves.py."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import aiormq
import aiormq.abc
import orjson
import structlog
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from shared.amqp.topology import WORK_QUEUES, Topology, queue_of_dlq
from shared.ops.dlq_lock import reading
from shared.providers import registry
from shared.vocabulary import (
    ATTEMPTS,
    FIRST_FAILED_AT,
    LAST_ERROR,
    LAST_FAILED_AT,
    ORIGINAL_QUEUE,
    REASON,
    REQUEUED,
    int_header,
)

QUEUES = WORK_QUEUES

log = structlog.get_logger(__name__)


class MissingQueueError(Exception):
    """The queue does not exist: a wrong AMQP_PREFIX, or no service has declared it yet."""


@asynccontextmanager
async def _existing(queue: str) -> AsyncIterator[None]:
    try:
        yield
    except aio_pika.exceptions.ChannelNotFoundEntity:
        raise MissingQueueError(
            f"queue {queue} does not exist (check AMQP_PREFIX; any payhooks service declares"
            " the queues when it starts)"
        ) from None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One DLQ message as an operator sees it."""

    id: str
    event_id: str | None
    event: str | None
    payment_id: str | None
    reason: str
    error: str | None
    attempts: int | None
    first_failed_at: str | None
    last_failed_at: str | None
    original_queue: str
    requeued: int
    body: bytes = field(repr=False)
    # Whose webhook it came from: the message's `provider` header (ingest's, kept through the
    # retries), else what its event id's prefix says (registry.provider_of).
    provider: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event_id": self.event_id,
            "provider": self.provider,
            "event": self.event,
            "payment_id": self.payment_id,
            "reason": self.reason,
            "error": self.error,
            "attempts": self.attempts,
            "first_failed_at": self.first_failed_at,
            "last_failed_at": self.last_failed_at,
            "original_queue": self.original_queue,
            "requeued": self.requeued,
        }

    def age_seconds(self, now: dt.datetime) -> float | None:
        at = parse_time(self.last_failed_at)
        return None if at is None else max(0.0, (now - at).total_seconds())

    @classmethod
    def from_message(cls, message: AbstractIncomingMessage, dlq: str) -> DeadLetter:
        """Read our failure headers, or RabbitMQ's x-death for messages it dead-lettered itself
        (delivery limit), and the ids inside the body."""
        headers: dict[str, Any] = dict(message.headers or {})
        death = _first_death(headers)
        try:
            payload = orjson.loads(message.body)
        except orjson.JSONDecodeError:
            payload = None
        payload = payload if isinstance(payload, dict) else {}
        message_id = message.message_id or ""
        event_id = payload.get("source_event_id") or message_id or None
        # Our own reason when a worker put it here; RabbitMQ's when it dead-lettered the message
        # itself (the delivery limit): a requeue strips both, so whichever is present is current.
        reason = _text(headers.get(REASON)) or _text(death.get("reason")) or "unknown"
        death_time = death.get("time")
        last_failed = _text(headers.get(LAST_FAILED_AT)) or (
            death_time.isoformat() if isinstance(death_time, dt.datetime) else None
        )
        return cls(
            id=message_id,
            event_id=_text(event_id),
            event=_text(payload.get("event")) or _text(message.type),
            payment_id=_text(payload.get("payment_id")),
            reason=reason,
            error=_text(headers.get(LAST_ERROR)),
            attempts=int_header(headers.get(ATTEMPTS)),
            first_failed_at=_text(headers.get(FIRST_FAILED_AT)) or last_failed,
            last_failed_at=last_failed,
            original_queue=_text(headers.get(ORIGINAL_QUEUE))
            or _text(death.get("queue"))
            or queue_of_dlq(dlq),
            requeued=int_header(headers.get(REQUEUED)) or 0,
            body=message.body,
            provider=_text(headers.get("provider"))
            or (registry.provider_of(str(event_id)) if event_id else None),
        )


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    messages: int
    oldest_age_seconds: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "messages": self.messages,
            "oldest_age_seconds": self.oldest_age_seconds,
        }


def dlq_name(topology: Topology, queue: str) -> str:
    """`orders` -> `<prefix>orders.dlq`; raises KeyError for an unknown queue."""
    return topology.work[queue].dlq


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """What a passive declare tells about a queue: ready messages and consumers."""

    messages: int
    consumers: int


async def counts(channel: AbstractChannel, queue: str) -> QueueCounts:
    async with _existing(queue):
        declared = await channel.declare_queue(queue, passive=True)
    result = declared.declaration_result
    return QueueCounts(int(result.message_count or 0), int(result.consumer_count or 0))


async def depth(channel: AbstractChannel, queue: str) -> int:
    return (await counts(channel, queue)).messages


async def read_all(channel: AbstractChannel, queue: str) -> list[AbstractIncomingMessage]:
    """Every ready message, unacknowledged (the caller acks or hands back each one)."""
    messages: list[AbstractIncomingMessage] = []
    await _consume_all(channel, queue, messages)
    return messages


async def hand_back(
    channel: AbstractChannel, queue: str, messages: Sequence[AbstractIncomingMessage]
) -> None:
    """Return `messages` (read from `queue` on `channel`) to the queue, in order, and wait
    until it counts them as ready again: a quorum queue takes nacked messages back some time
    after the channel has answered later commands, and the next reader, on another
    connection, counted and read only the part already back (a show of 35 out of 600 in a
    clean-clone CI run; a requeue there would have moved only that part)."""
    if not messages:
        return
    underlay = await channel.get_underlay_channel()
    try:
        # What is ready besides the held ones (new arrivals): they only add to the count.
        others = await _ready(underlay, queue)
        for message in messages:  # in order: the queue gets them back in the order it had them
            await message.nack(requeue=True)
        deadline = asyncio.get_running_loop().time() + _HAND_BACK_WAIT_S
        while (ready := await _ready(underlay, queue)) < others + len(messages):
            if asyncio.get_running_loop().time() >= deadline:
                # Dropped meanwhile (unrouted's age and length limits), or a broker this slow:
                # the next reader may miss what is not back yet.
                log.warning(
                    "dlq.hand_back_incomplete", queue=queue, ready=ready, handed_back=len(messages)
                )
                return
            await asyncio.sleep(_HAND_BACK_POLL_S)
    except (aiormq.exceptions.ChannelInvalidStateError, aiormq.exceptions.AMQPError):
        return  # the channel is closed: RabbitMQ took back everything it held


async def _ready(channel: aiormq.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.queue_declare(queue, passive=True)
    return int(declared.message_count or 0)


async def show(
    channel: AbstractChannel, dlq: str, *, lock_wait_s: float | None = None
) -> list[DeadLetter]:
    async with peeking(channel, dlq, lock_wait_s=lock_wait_s) as messages:
        return [DeadLetter.from_message(m, dlq) for m in messages]


_PEEK_PREFETCH = 65535
# How long a hand-back waits for the queue to count its messages as ready again, and how
# often it looks (on a quiet machine they are back within a few milliseconds).
_HAND_BACK_WAIT_S = 5.0
_HAND_BACK_POLL_S = 0.005
# Fewer messages came than the queue counted (expired or dropped meanwhile): the read ends
# after this long without one.
_PEEK_QUIET_S = 1.0


@asynccontextmanager
async def peeking(
    channel: AbstractChannel, queue: str, *, lock_wait_s: float | None = None
) -> AsyncIterator[list[AbstractIncomingMessage]]:
    """Every ready message of the queue, held unacknowledged under its lock and handed back in
    order at the end: looking moves nothing. Always all of them: a quorum queue puts what is
    handed back at its tail, so handing back the first few would move them behind the rest."""
    async with reading(channel, queue, wait_s=lock_wait_s):
        messages: list[AbstractIncomingMessage] = []
        try:
            await _consume_all(channel, queue, messages)
            yield messages
        finally:
            await hand_back(channel, queue, messages)


async def _consume_all(
    channel: AbstractChannel, queue: str, messages: list[AbstractIncomingMessage]
) -> None:
    """Append the queue's ready messages to `messages`, unacknowledged, in queue order."""
    async with _existing(queue):
        declared = await channel.declare_queue(queue, passive=True)
    expected = int(declared.declaration_result.message_count or 0)
    if not expected:
        return
    arrived = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        messages.append(message)
        arrived.set()

    # A consumer, not one basic.get round trip per message (about 1 ms each on a busy machine).
    # Nothing is acknowledged until the end, so the prefetch bounds what one look can read:
    # AMQP's largest (a quorum queue caps "unlimited" at 2,000), above unrouted's length bound.
    await channel.set_qos(prefetch_count=_PEEK_PREFETCH)
    tag = await declared.consume(on_message, no_ack=False)
    try:
        while len(messages) < expected:
            arrived.clear()
            try:
                async with asyncio.timeout(_PEEK_QUIET_S):
                    await arrived.wait()
            except TimeoutError:
                break
    finally:
        await declared.cancel(tag)
    await asyncio.sleep(0)  # deliveries that came before the cancel's answer are appended


async def dead_letters_for_payment(
    channel: AbstractChannel, topology: Topology, payment_id: str, *, lock_wait_s: float
) -> list[DeadLetter]:
    """Every DLQ's messages about one payment (the payment view's `dead_letters`)."""
    letters: list[DeadLetter] = []
    for queue in QUEUES:
        found = await show(channel, dlq_name(topology, queue), lock_wait_s=lock_wait_s)
        letters.extend(d for d in found if d.payment_id == payment_id)
    return letters


async def stats(channel: AbstractChannel, topology: Topology) -> list[QueueStats]:
    now = dt.datetime.now(dt.UTC)
    result = []
    for queue in QUEUES:
        dlq = dlq_name(topology, queue)
        letters = await show(channel, dlq) if await depth(channel, dlq) else []
        ages = [a for a in (d.age_seconds(now) for d in letters) if a is not None]
        result.append(QueueStats(dlq, len(letters), max(ages) if ages else None))
    return result


def _first_death(headers: dict[str, Any]) -> dict[str, Any]:
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        return deaths[0]
    return {}


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None


def parse_time(value: str | None) -> dt.datetime | None:
    """An ISO 8601 time (UTC when without an offset); None if absent or not a time."""
    if value is None:
        return None
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)
