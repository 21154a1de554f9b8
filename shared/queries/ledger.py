"""The bonus ledger: one entry per order transition that earns or takes back points."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from shared.db import Executor


async def add_ledger_entries(
    conn: Executor,
    payment_id: str,
    user_id: str,
    entries: Sequence[tuple[int, str, int, str]],
) -> list[int]:
    """Insert (transition id, kind, points, event id) entries; return the transition ids of
    those added. An entry already there for its transition (or a second grant) is skipped."""
    rows = await conn.fetch(
        "INSERT INTO bonus_ledger (payment_id, user_id, transition_id, kind, points, event_id)"
        " SELECT $1, $2, e.transition_id, e.kind, e.points, e.event_id"
        " FROM unnest($3::bigint[], $4::text[], $5::int[], $6::text[])"
        " AS e(transition_id, kind, points, event_id)"
        " ON CONFLICT DO NOTHING RETURNING transition_id",
        payment_id,
        user_id,
        [e[0] for e in entries],
        [e[1] for e in entries],
        [e[2] for e in entries],
        [e[3] for e in entries],
    )
    return [r["transition_id"] for r in rows]


async def ledger_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT payment_id, user_id, kind, points, event_id, transition_id, created_at"
        " FROM bonus_ledger"
        " WHERE payment_id = $1 ORDER BY id",
        payment_id,
    )


async def ledger_for_user(conn: Executor, user_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT payment_id, kind, points, created_at FROM bonus_ledger"
        " WHERE user_id = $1 ORDER BY id",
        user_id,
    )


async def balances(conn: Executor, payment_ids: Sequence[str]) -> dict[str, int]:
    """payment id -> net bonus points, for the payments that have ledger entries."""
    rows = await conn.fetch(
        "SELECT payment_id, sum(points)::bigint AS points FROM bonus_ledger"
        " WHERE payment_id = ANY($1::text[]) GROUP BY payment_id",
        list(payment_ids),
    )
    return {r["payment_id"]: int(r["points"]) for r in rows}


async def kinds(conn: Executor, payment_ids: Sequence[str]) -> dict[str, list[str]]:
    """payment id -> its ledger's entry kinds, oldest first."""
    rows = await conn.fetch(
        "SELECT payment_id, array_agg(kind ORDER BY transition_id, id) AS kinds"
        " FROM bonus_ledger WHERE payment_id = ANY($1::text[]) GROUP BY payment_id",
        list(payment_ids),
    )
    return {r["payment_id"]: list(r["kinds"]) for r in rows}
