"""Moving dead letters: requeue a selection to its original queue, or purge a DLQ. Nothing
is lost: a copy is acknowledged only after its requeued twin is confirmed (a crash in between
leaves both, a duplicate the workers dedup), and only what was read is purged."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from pamqp.commands import Basic

from shared.amqp.outgoing import persistent_copy
from shared.ops.dlq import DeadLetter, hand_back, parse_time, read_all
from shared.ops.dlq_lock import reading
from shared.vocabulary import ATTEMPTS, REASON, REQUEUED

_PUBLISH_TIMEOUT_S = 10.0

Progress = Callable[[int, int], None]
# Selection's criteria besides ids and `all`, as every edge names its fields.
FILTERS = ("reason", "event_type", "payment_id", "provider", "since", "until")


class UnroutableError(Exception):
    """RabbitMQ could not queue a requeued copy; its DLQ copy was kept."""


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters to requeue: all given criteria must hold (ids: any of them). It must
    say something (`says_nothing`): a forgotten filter never means a whole DLQ."""

    ids: tuple[str, ...] = ()
    everything: bool = False
    reason: str | None = None
    event_type: str | None = None
    payment_id: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    provider: str | None = None  # whose webhook (DeadLetter.provider)

    @classmethod
    def parse(
        cls,
        *,
        ids: Sequence[str] = (),
        everything: bool = False,
        reason: str | None = None,
        event_type: str | None = None,
        payment_id: str | None = None,
        provider: str | None = None,
        since: str | None = None,
        until: str | None = None,
    ) -> Selection:
        """With times as ISO 8601 text (UTC when without an offset); ValueError if not."""
        times = []
        for name, text in (("since", since), ("until", until)):
            at = None if text is None else parse_time(text)
            if text is not None and at is None:
                raise ValueError(f"{name} must be an ISO 8601 time, e.g. 2026-11-30T10:00:00Z")
            times.append(at)
        since_at, until_at = times
        return cls(
            tuple(ids), everything, reason, event_type, payment_id, since_at, until_at, provider
        )

    @property
    def says_nothing(self) -> bool:
        filters = (
            self.reason,
            self.event_type,
            self.payment_id,
            self.provider,
            self.since,
            self.until,
        )
        return not (self.everything or self.ids) and all(f is None for f in filters)

    def as_json(self) -> dict[str, object]:
        """What was given, for the audit trail: times as ISO 8601, unset criteria left out."""
        given = {
            "ids": list(self.ids),
            "all": self.everything,
            "reason": self.reason,
            "event_type": self.event_type,
            "payment_id": self.payment_id,
            "provider": self.provider,
            "since": None if self.since is None else self.since.isoformat(),
            "until": None if self.until is None else self.until.isoformat(),
        }
        return {key: value for key, value in given.items() if value not in (None, False, [])}

    def matches(self, letter: DeadLetter) -> bool:
        if self.says_nothing:
            return False
        if self.ids and letter.id not in self.ids and letter.event_id not in self.ids:
            return False
        if self.reason is not None and letter.reason != self.reason:
            return False
        if self.event_type is not None and letter.event != self.event_type:
            return False
        if self.payment_id is not None and letter.payment_id != self.payment_id:
            return False
        if self.provider is not None and letter.provider != self.provider:
            return False
        if self.since is not None or self.until is not None:
            at = parse_time(letter.last_failed_at)
            if at is None:
                return False
            if self.since is not None and at < self.since:
                return False
            if self.until is not None and at > self.until:
                return False
        return True


@dataclass(frozen=True, slots=True)
class RequeueResult:
    requeued: list[DeadLetter]
    not_found: list[str]
    dry_run: bool


async def requeue(
    channel: AbstractChannel,
    dlq: str,
    selection: Selection,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> RequeueResult:
    """Move matching messages back to their original queue (confirm first, then ack).

    `channel` must have publisher confirms on. A copy RabbitMQ can't route (its original
    queue is gone) stops the requeue with UnroutableError and stays in the DLQ. Ids of the
    selection that match nothing are reported as `not_found`.
    """
    async with reading(channel, dlq):
        messages = await read_all(channel, dlq)
        chosen: list[tuple[AbstractIncomingMessage, DeadLetter]] = []
        for message in messages:
            letter = DeadLetter.from_message(message, dlq)
            if selection.matches(letter) and (limit is None or len(chosen) < limit):
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
            await hand_back(channel, dlq, [m for m in messages if id(m) not in moved])
    requested = set(selection.ids)
    found = {i for _, letter in chosen for i in (letter.id, letter.event_id) if i in requested}
    return RequeueResult(
        requeued=[letter for _, letter in chosen],
        not_found=[i for i in selection.ids if i not in found],
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
        messages = await read_all(channel, dlq)
        removed: list[DeadLetter] = []
        try:
            for done, message in enumerate(messages, start=1):
                await message.ack()
                removed.append(DeadLetter.from_message(message, dlq))
                if progress is not None:
                    progress(done, len(messages))
        finally:
            await hand_back(channel, dlq, messages[len(removed) :])
    return removed
