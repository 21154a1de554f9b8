"""The outbox: order transitions committed with the order, published by the relay."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.db import Executor


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    id: int
    message_id: str
    routing_key: str
    body: bytes


async def add_to_outbox(conn: Executor, message_id: str, routing_key: str, body: bytes) -> None:
    await conn.execute(
        "INSERT INTO outbox (message_id, routing_key, body) VALUES ($1, $2, $3)"
        " ON CONFLICT (message_id) DO NOTHING",
        message_id,
        routing_key,
        body,
    )


async def lock_unpublished_outbox(conn: Executor, limit: int) -> list[OutboxMessage]:
    """Oldest unpublished outbox rows, locked; other relays skip them (SKIP LOCKED)."""
    rows = await conn.fetch(
        "SELECT id, message_id, routing_key, body FROM outbox WHERE published_at IS NULL"
        " ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        limit,
    )
    return [OutboxMessage(**dict(r)) for r in rows]


async def mark_outbox_published(conn: Executor, ids: Sequence[int]) -> None:
    await conn.execute(
        "UPDATE outbox SET published_at = now() WHERE id = ANY($1::bigint[])", list(ids)
    )


async def unpublished_count(conn: Executor) -> int:
    """Transitions not yet published by the relay (walks a partial index of those only)."""
    return int(await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"))
