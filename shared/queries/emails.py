"""Customer emails sent (or skipped): at most one record per (payment, template)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import asyncpg

from shared.db import Executor, columns


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


# emails_sent.skip_reason (migration 020): why a recorded email was not sent.
SKIPPED_AFTER_REFUND = "after_refund"  # the refund email overtook the success email
SKIPPED_ERASED = "erased"  # the customer's data was erased (shared/ops/erasure.py)


class EmailClaim(NamedTuple):
    """One email to claim: its record, and the template whose record skips it instead (the
    refund email's, for the success email) or None."""

    payment_id: str
    template: str
    message_id: str
    recipient: str
    event_id: str
    skip_if_recorded: str | None


async def claim_emails(conn: Executor, claims: Sequence[EmailClaim]) -> list[bool | None]:
    """Claim each (payment, template) send, or record it as skipped when the payment already
    has its `skip_if_recorded` email; in one statement, answering as claiming them one after
    the other in this order would. True: claimed, to be sent; False: recorded as skipped;
    None: already sent, skipped, or being sent (a concurrent claim of the same key waits on
    the unique index until this transaction ends), or claimed earlier in this list.

    Run under the payments' locks: the statement's snapshot then sees the lock holders' rows.
    sent_at, the time of the claim (a microsecond apart at least within the statement),
    orders a payment's emails as they were sent."""
    answers: list[bool | None] = [None] * len(claims)
    keys: set[tuple[str, str]] = set()
    rows: list[tuple[int, EmailClaim, bool]] = []  # index, claim, skipped by an earlier one
    for i, claim in enumerate(claims):
        key = (claim.payment_id, claim.template)
        if key not in keys:
            keys.add(key)
            skip = claim.skip_if_recorded
            rows.append((i, claim, skip is not None and (claim.payment_id, skip) in keys))
    if not rows:
        return answers
    records = await conn.fetch(
        "INSERT INTO emails_sent (payment_id, template, message_id, recipient, event_id,"
        " skipped, sent_at, skip_reason)"
        " SELECT c.p, c.t, c.m, c.r, c.e, c.skipped, CASE WHEN c.skipped THEN NULL"
        " ELSE clock_timestamp() + c.n * interval '1 microsecond' END,"
        f" CASE WHEN c.skipped THEN '{SKIPPED_AFTER_REFUND}' END"
        " FROM (SELECT u.*, u.b OR (u.s IS NOT NULL AND EXISTS (SELECT 1 FROM emails_sent x"
        "   WHERE x.payment_id = u.p AND x.template = u.s)) AS skipped"
        "   FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],"
        "   $6::text[], $7::bool[]) WITH ORDINALITY AS u(p, t, m, r, e, s, b, n)) c"
        " ORDER BY c.n"
        " ON CONFLICT DO NOTHING RETURNING payment_id, template, skipped",
        *columns([(*claim, skipped) for _, claim, skipped in rows], 7),
    )
    claimed = {(r["payment_id"], r["template"]): r["skipped"] for r in records}
    for i, claim, _ in rows:
        skipped = claimed.get((claim.payment_id, claim.template))
        answers[i] = None if skipped is None else not skipped
    return answers


async def claim_email(conn: Executor, claim: EmailClaim) -> bool | None:
    """claim_emails of one."""
    [answer] = await claim_emails(conn, [claim])
    return answer


async def erased_payments(conn: Executor, payment_ids: Sequence[str]) -> set[str]:
    """Those of the payments whose order's customer data was erased: run under the payments'
    email locks (an erasure takes them too), so an erasure that committed first is seen."""
    rows = await conn.fetch(
        "SELECT payment_id FROM orders WHERE payment_id = ANY($1::text[])"
        " AND erased_at IS NOT NULL",
        list(payment_ids),
    )
    return {r["payment_id"] for r in rows}


async def skip_erased(conn: Executor, claims: Sequence[EmailClaim], marker: str) -> list[bool]:
    """Record each claim's email as skipped because its customer was erased (recipient: the
    marker, never an address); True where this call recorded it, False where a record of
    that (payment, template) was there already."""
    if not claims:
        return []
    rows = await conn.fetch(
        "INSERT INTO emails_sent (payment_id, template, message_id, recipient, event_id,"
        " skipped, sent_at, skip_reason)"
        " SELECT u.p, u.t, u.m, $4, u.e, true, NULL, $5"
        " FROM unnest($1::text[], $2::text[], $3::text[], $6::text[]) AS u(p, t, m, e)"
        " ON CONFLICT DO NOTHING RETURNING payment_id, template",
        [c.payment_id for c in claims],
        [c.template for c in claims],
        [c.message_id for c in claims],
        marker,
        SKIPPED_ERASED,
        [c.event_id for c in claims],
    )
    done = {(r["payment_id"], r["template"]) for r in rows}
    return [(c.payment_id, c.template) in done for c in claims]


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
        "SELECT template, message_id, recipient, sent_at, skipped, skip_reason FROM emails_sent"
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
