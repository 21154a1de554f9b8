"""What a replay reads (shared/ops/replay.py): inbox events by a selection, oldest first, a
chunk at a time; the transitions they caused and those transitions' outbox messages; which
emails are recorded already."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from shared.db import Executor
from shared.queries import inbox as inbox_sql


@dataclass(frozen=True, slots=True)
class InboxWhere:
    """The stored columns a replay selects on (all given must hold); times inclusive."""

    event_type: str | None = None
    payment_id: str | None = None
    provider: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    event_ids: tuple[str, ...] = ()


# Where a read resumes: the (received_at, id) of the last row it read.
After = tuple[dt.datetime, int]


def inbox_statement(where: InboxWhere, after: After | None, limit: int) -> tuple[str, list[Any]]:
    """Oldest first, as received; only the filters given are in the statement, so each
    combination is planned for the index that serves it (migration 011's)."""
    args: list[Any] = []

    def arg(value: Any, cast: str) -> str:
        args.append(value)
        return f"${len(args)}::{cast}"

    conditions = []
    if where.event_ids:
        conditions.append(f"i.event_id = ANY({arg(list(where.event_ids), 'text[]')})")
    if where.payment_id is not None:
        conditions.append(f"i.payment_id = {arg(where.payment_id, 'text')}")
    if where.event_type is not None:
        conditions.append(f"i.event_type = {arg(where.event_type, 'text')}")
    if where.provider is not None:
        conditions.append(f"i.provider = {arg(where.provider, 'text')}")
    if where.since is not None:
        conditions.append(f"i.received_at >= {arg(where.since, 'timestamptz')}")
    if where.until is not None:
        conditions.append(f"i.received_at <= {arg(where.until, 'timestamptz')}")
    if after is not None:
        at, row_id = arg(after[0], "timestamptz"), arg(after[1], "bigint")
        conditions.append(f"(i.received_at, i.id) > ({at}, {row_id})")
    # As the views describe a stored webhook (its processed mark found by the id the workers
    # know it by), with its body.
    sql = inbox_sql.DESCRIBED.format(extra=", i.body")
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    sql += f" ORDER BY i.received_at, i.id LIMIT {arg(limit, 'int')}"
    return sql, args


async def inbox_after(
    conn: Executor, where: InboxWhere, after: After | None, limit: int
) -> list[asyncpg.Record]:
    sql, args = inbox_statement(where, after, limit)
    return await conn.fetch(sql, *args)


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
