"""The outbox: order transitions committed with the order, published by the relay."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from shared.db import Executor, columns
from shared.queries import without_flush_wait


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    id: int
    message_id: str
    routing_key: str
    body: bytes
    # What the message carries besides the schema header (shared/tracing.py CARRIED).
    headers: dict[str, str] = field(default_factory=dict)


async def add_many_to_outbox(
    conn: Executor,
    messages: Sequence[tuple[str, str, bytes]],
    headers: Sequence[Mapping[str, str]] | None = None,
) -> None:
    """Transitions' (message id, routing key, body) in one statement, in the order given
    (the relay publishes by id); a message id already there is left as it is. `headers`:
    each message's carried headers (shared/tracing.py), in the same order."""
    stored = [orjson.dumps(h).decode() if h else None for h in headers or []]
    await conn.execute(
        "INSERT INTO outbox (message_id, routing_key, body, headers)"
        " SELECT t.message_id, t.routing_key, t.body, t.headers::jsonb"
        " FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]) WITH ORDINALITY"
        " AS t(message_id, routing_key, body, headers, n) ORDER BY t.n"
        " ON CONFLICT (message_id) DO NOTHING",
        *columns(messages, 3),
        stored or [None] * len(messages),
    )


async def lock_unpublished_outbox(
    conn: Executor, older_than_s: float, limit: int
) -> list[OutboxMessage]:
    """Oldest unpublished outbox rows committed more than `older_than_s` ago, locked; other
    relays skip them (SKIP LOCKED)."""
    rows = await conn.fetch(
        "SELECT id, message_id, routing_key, body, coalesce(headers, '{}') AS headers"
        " FROM outbox WHERE published_at IS NULL"
        " AND created_at < now() - make_interval(secs => $1)"
        " ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
        older_than_s,
        limit,
    )
    return [OutboxMessage(**dict(r)) for r in rows]


_MARK_PUBLISHED = (
    "UPDATE outbox SET published_at = now()"
    " WHERE message_id = ANY($1::text[]) AND published_at IS NULL"
)


async def mark_outbox_published(conn: Executor, message_ids: Sequence[str]) -> None:
    await conn.execute(_MARK_PUBLISHED, list(message_ids))


async def mark_outbox_published_lazily(db: Executor, message_ids: Sequence[str]) -> None:
    """mark_outbox_published in a transaction of its own that doesn't wait for its WAL flush:
    a mark lost in a crash only publishes the row again."""
    await db.execute(_MARK_PUBLISHED_LAZILY, list(message_ids))


_MARK_PUBLISHED_LAZILY = without_flush_wait(_MARK_PUBLISHED)


async def unpublished_count(conn: Executor) -> int:
    """Transitions not yet published by the relay (walks a partial index of those only)."""
    return int(await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"))
