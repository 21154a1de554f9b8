"""What a replay reads (shared/ops/replay.py) besides the inbox's events (shared/queries/inbox.py
`events_after`): the transitions they caused and those transitions' outbox messages; which
emails are recorded already."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from shared.db import Executor


async def transitions_caused(
    conn: Executor, payment_ids: Sequence[str], source_ids: Sequence[str]
) -> list[asyncpg.Record]:
    """The transitions these events caused (by the payments' index), oldest first."""
    return await conn.fetch(
        "SELECT id, payment_id, event_id, to_status FROM order_transitions"
        " WHERE payment_id = ANY($1::text[]) AND event_id = ANY($2::text[]) ORDER BY id",
        list(payment_ids),
        list(source_ids),
    )


async def outbox_messages(conn: Executor, message_ids: Sequence[str]) -> dict[str, asyncpg.Record]:
    """The stored order.* messages by id (those retention has not deleted)."""
    rows = await conn.fetch(
        "SELECT message_id, routing_key, body FROM outbox WHERE message_id = ANY($1::text[])",
        list(message_ids),
    )
    return {r["message_id"]: r for r in rows}


async def emails_recorded(conn: Executor, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which (payment id, template) emails are recorded, sent or skipped."""
    rows = await conn.fetch(
        "SELECT e.payment_id, e.template FROM emails_sent e"
        " JOIN unnest($1::text[], $2::text[]) AS k(p, t)"
        "   ON e.payment_id = k.p AND e.template = k.t",
        [p for p, _ in keys],
        [t for _, t in keys],
    )
    return {(r["payment_id"], r["template"]) for r in rows}
