"""The outbox: order transitions committed with the order, published by the relay."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.db import Executor, columns


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    id: int
    message_id: str
    routing_key: str
    body: bytes


async def add_many_to_outbox(conn: Executor, messages: Sequence[tuple[str, str, bytes]]) -> None:
    """Transitions' (message id, routing key, body) in one statement, in the order given
    (the relay publishes by id); a message id already there is left as it is."""
    await conn.execute(
        "INSERT INTO outbox (message_id, routing_key, body)"
        " SELECT t.message_id, t.routing_key, t.body"
        " FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY"
        " AS t(message_id, routing_key, body, n) ORDER BY t.n"
        " ON CONFLICT (message_id) DO NOTHING",
        *columns(messages, 3),
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
