"""The `unrouted` queue for operators: events no worker consumes (withdrawals, exchanges, kyc,
reminders, ...), counted and shown, never moved (no worker wants them back). Read with
shared/ops/dlq.py's `peeking`: one reader at a time, every message handed back in order."""

from __future__ import annotations

import collections
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import orjson
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from shared.ops import dlq

# The most messages one look lists (it counts all of them).
MAX_SHOWN = 1000


@dataclass(frozen=True, slots=True)
class UnroutedMessage:
    """One message of `unrouted` as an operator sees it."""

    id: str
    event: str | None
    payment_id: str | None
    provider: str | None
    published_at: dt.datetime | None
    body: bytes = field(repr=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event": self.event,
            "payment_id": self.payment_id,
            "provider": self.provider,
            "published_at": None if self.published_at is None else self.published_at.isoformat(),
        }

    def age_seconds(self, now: dt.datetime) -> float | None:
        if self.published_at is None:
            return None
        return max(0.0, (now - self.published_at).total_seconds())


def describe(message: AbstractIncomingMessage) -> UnroutedMessage:
    try:
        payload = orjson.loads(message.body)
    except orjson.JSONDecodeError:
        payload = None
    payload = payload if isinstance(payload, dict) else {}
    headers = message.headers or {}
    at = message.timestamp  # set by payhooks' publishers; messages of older versions have none
    if at is not None and at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    return UnroutedMessage(
        id=message.message_id or "",
        event=_text(payload.get("event")) or _text(message.type),
        payment_id=_text(payload.get("payment_id")),
        provider=_text(headers.get("provider")),
        published_at=at,
        body=message.body,
    )


@dataclass(frozen=True, slots=True)
class UnroutedView:
    queue: str
    total: int  # messages in the queue
    oldest_age_seconds: float | None  # of the first message, the oldest (FIFO)
    by_event: dict[str, int]  # of all of them, most frequent first
    messages: list[UnroutedMessage]  # the first few

    def as_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "total": self.total,
            "oldest_age_seconds": self.oldest_age_seconds,
            "by_event": self.by_event,
            "shown": len(self.messages),
            "messages": [m.as_json() for m in self.messages],
        }


async def view(
    channel: AbstractChannel, queue: str, *, limit: int, lock_wait_s: float | None = None
) -> UnroutedView:
    """How many, how old, of which types, and the first `limit` messages (nothing is moved).

    Reads the whole queue and hands it back in order (handing back only the first messages
    would move them to the tail): 6 s for a full one (50,000 messages) on our 2-core machine,
    their bodies in memory meanwhile.
    """
    if not await dlq.depth(channel, queue):
        return UnroutedView(queue, 0, None, {}, [])
    async with dlq.peeking(channel, queue, lock_wait_s=lock_wait_s) as messages:
        seen = [describe(m) for m in messages]
    oldest = seen[0].age_seconds(dt.datetime.now(dt.UTC)) if seen else None
    by_event = collections.Counter(m.event or "?" for m in seen)
    return UnroutedView(queue, len(seen), oldest, dict(by_event.most_common()), seen[:limit])


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None
