"""Dead-letter queues: list, show, requeue, purge. One module for the API and the CLI.

Nothing here can lose a message:

* show reads every message of the DLQ unacknowledged and hands them all back in one go, so
  they keep their order among themselves (a quorum queue puts returned messages at its tail:
  reading all of them and returning all of them in order leaves the queue as it was, except
  that anything dead-lettered during the read now sits ahead of them);
* requeue publishes a copy to the message's original queue, waits for the broker's confirm,
  and only then acknowledges the DLQ copy: a crash in between leaves both (a duplicate the
  workers dedup), never neither;
* purge acknowledges only what it read and reports each message it removed.

Each of them holds the DLQ's lock while it reads (`reading`): a message one reader holds
unacknowledged is invisible to every other, so two readers at once would each see part of
the queue, and a requeue or purge would do part of its job while reporting success.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import aiormq
import orjson
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from pamqp.commands import Basic

from shared.broker import persistent_copy
from shared.dlq_lock import reading
from shared.topology import WORK_QUEUES, Topology, queue_of_dlq
from shared.vocabulary import (
    ATTEMPTS,
    FIRST_FAILED_AT,
    LAST_ERROR,
    LAST_FAILED_AT,
    ORIGINAL_QUEUE,
    REASON,
    REQUEUED,
)

QUEUES = WORK_QUEUES

_PUBLISH_TIMEOUT_S = 10.0


class UnroutableError(Exception):
    """RabbitMQ could not queue a requeued copy; its DLQ copy was kept."""


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

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event_id": self.event_id,
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
        at = _parse_time(self.last_failed_at)
        return None if at is None else max(0.0, (now - at).total_seconds())


def describe(message: AbstractIncomingMessage, dlq: str) -> DeadLetter:
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
    return DeadLetter(
        id=message_id,
        event_id=_text(event_id),
        event=_text(payload.get("event")) or _text(message.type),
        payment_id=_text(payload.get("payment_id")),
        reason=reason,
        error=_text(headers.get(LAST_ERROR)),
        attempts=_int_or_none(headers.get(ATTEMPTS)),
        first_failed_at=_text(headers.get(FIRST_FAILED_AT)) or last_failed,
        last_failed_at=last_failed,
        original_queue=_text(headers.get(ORIGINAL_QUEUE))
        or _text(death.get("queue"))
        or queue_of_dlq(dlq),
        requeued=_int_or_none(headers.get(REQUEUED)) or 0,
        body=message.body,
    )


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    messages: int
    oldest_age_seconds: float | None


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


async def _read_all(channel: AbstractChannel, queue: str) -> list[AbstractIncomingMessage]:
    """Every ready message, unacknowledged (the caller acks or hands back each one)."""
    messages: list[AbstractIncomingMessage] = []
    await _consume_all(channel, queue, messages)
    return messages


async def _hand_back(messages: Sequence[AbstractIncomingMessage]) -> None:
    for message in messages:  # in order: the queue gets them back in the order it had them
        try:
            await message.nack(requeue=True)
        except aiormq.exceptions.ChannelInvalidStateError:
            return  # the channel is closed: RabbitMQ took back everything it held


async def show(
    channel: AbstractChannel, dlq: str, *, lock_wait_s: float | None = None
) -> list[DeadLetter]:
    async with peeking(channel, dlq, lock_wait_s=lock_wait_s) as messages:
        return [describe(m, dlq) for m in messages]


_PEEK_PREFETCH = 65535
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
            await _hand_back(messages)


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


async def stats(channel: AbstractChannel, topology: Topology) -> list[QueueStats]:
    now = dt.datetime.now(dt.UTC)
    result = []
    for queue in QUEUES:
        dlq = dlq_name(topology, queue)
        letters = await show(channel, dlq) if await depth(channel, dlq) else []
        ages = [a for a in (d.age_seconds(now) for d in letters) if a is not None]
        result.append(QueueStats(dlq, len(letters), max(ages) if ages else None))
    return result


Matcher = Callable[[DeadLetter], bool]
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class RequeueResult:
    requeued: list[DeadLetter]
    not_found: list[str]
    dry_run: bool


async def requeue(
    channel: AbstractChannel,
    dlq: str,
    match: Matcher,
    *,
    ids: Sequence[str] = (),
    limit: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> RequeueResult:
    """Move matching messages back to their original queue (confirm first, then ack).

    `channel` must have publisher confirms on. A copy RabbitMQ can't route (its original
    queue is gone) stops the requeue with UnroutableError and stays in the DLQ. `ids` only
    feeds `not_found`; the selection itself is `match`.
    """
    async with reading(channel, dlq):
        messages = await _read_all(channel, dlq)
        chosen: list[tuple[AbstractIncomingMessage, DeadLetter]] = []
        for message in messages:
            letter = describe(message, dlq)
            if match(letter) and (limit is None or len(chosen) < limit):
                chosen.append((message, letter))
        moved: set[int] = set()  # id() of each message acknowledged
        try:
            if not dry_run:
                for done, (message, letter) in enumerate(chosen, start=1):
                    await _republish(channel, message, letter)
                    await message.ack()  # only after the confirm: a crash here duplicates
                    moved.add(id(message))
                    if progress is not None:
                        progress(done, len(chosen))
        finally:
            # Everything not moved goes back, in order, also after a failure half-way: the
            # next reader must find it in the DLQ, not held by this channel.
            await _hand_back([m for m in messages if id(m) not in moved])
    requested = set(ids)
    found = {i for _, letter in chosen for i in (letter.id, letter.event_id) if i in requested}
    return RequeueResult(
        requeued=[letter for _, letter in chosen],
        not_found=[i for i in ids if i not in found],
        dry_run=dry_run,
    )


async def _republish(
    channel: AbstractChannel, message: AbstractIncomingMessage, letter: DeadLetter
) -> None:
    # A fresh start: the retry ladder from its first step, and no death record, so that if it
    # dies again the DLQ shows that death, not this one. The requeue count stays.
    headers = {
        k: v
        for k, v in (message.headers or {}).items()
        if not k.startswith("x-") and k not in (REASON, ATTEMPTS)
    }
    headers[REQUEUED] = letter.requeued + 1
    unroutable = UnroutableError(
        f"{letter.original_queue} does not take messages (deleted or renamed?);"
        f" {letter.id} stays in the DLQ"
    )
    try:
        confirm = await channel.default_exchange.publish(
            persistent_copy(message, headers),
            letter.original_queue,
            mandatory=True,
            timeout=_PUBLISH_TIMEOUT_S,
        )
    except aio_pika.exceptions.DeliveryError as e:
        # Returned (a channel with on_return_raises) or refused by the queue.
        raise unroutable from e
    # Only a broker ack means "queued". A returned message (its queue is gone) is confirmed
    # too on other channels, but as a DeliveredMessage: the DLQ copy must stay.
    if not isinstance(confirm, Basic.Ack):
        raise unroutable


async def purge(
    channel: AbstractChannel, dlq: str, *, progress: Progress | None = None
) -> list[DeadLetter]:
    """Remove every message now in the DLQ; return what was removed."""
    async with reading(channel, dlq):
        messages = await _read_all(channel, dlq)
        removed: list[DeadLetter] = []
        try:
            for done, message in enumerate(messages, start=1):
                await message.ack()
                removed.append(describe(message, dlq))
                if progress is not None:
                    progress(done, len(messages))
        finally:
            await _hand_back(messages[len(removed) :])
    return removed


def _first_death(headers: dict[str, Any]) -> dict[str, Any]:
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        return deaths[0]
    return {}


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str | bytes):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def matcher(
    *,
    ids: Sequence[str] = (),
    everything: bool = False,
    reason: str | None = None,
    event_type: str | None = None,
    payment_id: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> Matcher:
    """A selection: all given criteria must hold (ids: any of them). Nothing given and not
    `everything` selects nothing, so a forgotten flag never requeues a whole DLQ."""
    wanted = set(ids)
    if not (everything or wanted or reason or event_type or payment_id or since or until):
        return lambda letter: False

    def match(letter: DeadLetter) -> bool:
        if wanted and letter.id not in wanted and letter.event_id not in wanted:
            return False
        if reason is not None and letter.reason != reason:
            return False
        if event_type is not None and letter.event != event_type:
            return False
        if payment_id is not None and letter.payment_id != payment_id:
            return False
        if since is not None or until is not None:
            at = _parse_time(letter.last_failed_at)
            if at is None:
                return False
            if since is not None and at < since:
                return False
            if until is not None and at > until:
                return False
        return True

    return match


def _parse_time(value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)
