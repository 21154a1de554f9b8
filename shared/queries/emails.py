"""Customer emails sent (or skipped): at most one record per (payment, template)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from shared.db import Executor


async def lock_payment_emails(conn: Executor, payment_ids: Sequence[str]) -> None:
    """Until the transaction ends, no other email of these payments is decided or sent, so a
    payment's emails leave in the order they were decided. One statement for a batch; the
    locks are taken in the order of their keys, so batches sharing payments (or whose
    payments' hashes collide, which only serializes them) never deadlock."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT"
        " hashtextextended('emails:' || p, 0) AS k FROM unnest($1::text[]) AS p ORDER BY k) s",
        list(payment_ids),
    )


async def claim_email(
    conn: Executor,
    payment_id: str,
    template: str,
    message_id: str,
    recipient: str,
    event_id: str,
    *,
    skip_if_recorded: str | None,
) -> bool | None:
    """Claim the (payment, template) send, or record it as skipped when the payment already
    has a `skip_if_recorded` email (the success email after the refund one). True: claimed,
    to be sent; False: recorded as skipped; None: already sent, skipped, or being sent (a
    concurrent claim of the same key waits on the unique index until this transaction ends).
    Run under the payment's lock: the statement's snapshot then sees the lock holder's row,
    and sent_at, the time of the claim, orders a payment's emails as they were sent."""
    skipped = await conn.fetchval(
        "INSERT INTO emails_sent (payment_id, template, message_id, recipient, event_id,"
        " skipped, sent_at)"
        " SELECT $1, $2, $3, $4, $5, s.skipped, CASE WHEN s.skipped THEN NULL"
        " ELSE clock_timestamp() END"
        " FROM (SELECT EXISTS (SELECT 1 FROM emails_sent WHERE payment_id = $1"
        "   AND template = $6) AS skipped) s"
        " ON CONFLICT DO NOTHING RETURNING skipped",
        payment_id,
        template,
        message_id,
        recipient,
        event_id,
        skip_if_recorded,
    )
    return None if skipped is None else not skipped


async def forget_emails(conn: Executor, keys: Sequence[tuple[str, ...]]) -> None:
    """Take back the claims of emails whose send failed (payment id, template): the retry
    claims them again."""
    await conn.execute(
        "DELETE FROM emails_sent WHERE (payment_id, template) IN"
        " (SELECT * FROM unnest($1::text[], $2::text[]))",
        [k[0] for k in keys],
        [k[1] for k in keys],
    )


async def emails_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT template, message_id, recipient, sent_at, skipped FROM emails_sent"
        " WHERE payment_id = $1 ORDER BY sent_at NULLS LAST",
        payment_id,
    )


async def templates_sent(conn: Executor, payment_ids: Sequence[str]) -> dict[str, list[str]]:
    """payment id -> the templates sent for it, oldest first (skipped ones left out)."""
    rows = await conn.fetch(
        "SELECT payment_id, array_agg(template ORDER BY sent_at) AS templates FROM emails_sent"
        " WHERE payment_id = ANY($1::text[]) AND NOT skipped GROUP BY payment_id",
        list(payment_ids),
    )
    return {r["payment_id"]: list(r["templates"]) for r in rows}
