"""The bonus ledger: at most one grant, clawback and restore per payment."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from shared.db import Executor


async def ledger_kinds(conn: Executor, payment_id: str) -> set[str]:
    rows = await conn.fetch("SELECT kind FROM bonus_ledger WHERE payment_id = $1", payment_id)
    return {r["kind"] for r in rows}


async def add_ledger_entry(
    conn: Executor, payment_id: str, user_id: str, kind: str, points: int, event_id: str
) -> bool:
    """Insert an entry; False if that (payment, kind) already exists."""
    row = await conn.fetchval(
        "INSERT INTO bonus_ledger (payment_id, user_id, kind, points, event_id)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (payment_id, kind) DO NOTHING RETURNING true",
        payment_id,
        user_id,
        kind,
        points,
        event_id,
    )
    return row is True


async def ledger_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT payment_id, user_id, kind, points, event_id, created_at FROM bonus_ledger"
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
