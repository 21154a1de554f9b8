"""Customer emails sent: at most one per (payment, template)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from shared.db import Executor


async def record_email(
    conn: Executor, payment_id: str, template: str, message_id: str, recipient: str, event_id: str
) -> bool:
    """Claim the (payment, template) send; False if it was already sent (or is being sent).

    A concurrent claim of the same key waits on the unique index until this transaction ends.
    """
    row = await conn.fetchval(
        "INSERT INTO emails_sent (payment_id, template, message_id, recipient, event_id)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING true",
        payment_id,
        template,
        message_id,
        recipient,
        event_id,
    )
    return row is True


async def emails_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT template, message_id, recipient, sent_at FROM emails_sent"
        " WHERE payment_id = $1 ORDER BY sent_at",
        payment_id,
    )


async def templates_sent(conn: Executor, payment_ids: Sequence[str]) -> dict[str, list[str]]:
    """payment id -> the templates sent for it (one entry per email row)."""
    rows = await conn.fetch(
        "SELECT payment_id, template FROM emails_sent WHERE payment_id = ANY($1::text[])"
        " ORDER BY sent_at",
        list(payment_ids),
    )
    sent: dict[str, list[str]] = {}
    for r in rows:
        sent.setdefault(r["payment_id"], []).append(r["template"])
    return sent
