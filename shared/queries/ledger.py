"""The bonus ledger: one entry per order transition that earns or takes back points."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import asyncpg

from shared.db import Executor, columns


class LedgerEntry(NamedTuple):
    payment_id: str
    user_id: str
    transition_id: int
    kind: str
    points: int
    event_id: str


async def add_ledger_entries(conn: Executor, entries: Sequence[LedgerEntry]) -> list[int]:
    """Insert entries (any payments') in one statement, in the order given; return the
    transition ids of those added. An entry already there for its transition (or a second
    grant) is skipped."""
    rows = await conn.fetch(
        "INSERT INTO bonus_ledger (payment_id, user_id, transition_id, kind, points, event_id)"
        " SELECT e.payment_id, e.user_id, e.transition_id, e.kind, e.points, e.event_id"
        " FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::int[], $6::text[])"
        " WITH ORDINALITY AS e(payment_id, user_id, transition_id, kind, points, event_id, n)"
        " ORDER BY e.n"
        " ON CONFLICT DO NOTHING RETURNING transition_id",
        *columns(entries, 6),
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
