"""The inbox archives (shared/ops/archive.py): the rows of a day read for its archive, and
`inbox_archives`, the record of every archive file."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import asyncpg

from shared.db import Executor

# In id order, so an archive's lines are in the order the rows were stored; a chunk at a time
# after the last id read (the partition's primary key), no cursor left open on the partition.
_DAY_ROWS = (
    "SELECT i.id, i.provider, i.event_id, i.event_type, i.payment_id, i.received_at,"
    " coalesce(k.last_seen_at, i.received_at) AS last_seen_at,"
    " coalesce(k.duplicates, 0) AS duplicates, i.headers, i.body"
    " FROM inbox i LEFT JOIN inbox_keys k ON k.provider = i.provider AND k.event_id = i.event_id"
    " WHERE i.received_at >= $1 AND i.received_at < $2 AND i.id > $3 ORDER BY i.id LIMIT $4"
)


async def day_rows(
    conn: Executor, start: dt.datetime, end: dt.datetime, chunk: int
) -> AsyncIterator[list[asyncpg.Record]]:
    """The rows received in [start, end) (one partition), `chunk` at a time."""
    after = -(2**63)
    while rows := await conn.fetch(_DAY_ROWS, start, end, after, chunk):
        yield rows
        after = rows[-1]["id"]


async def record(
    conn: Executor, file_name: str, start: dt.datetime, end: dt.datetime, rows: int, sha256: str
) -> None:
    await conn.execute(
        "INSERT INTO inbox_archives (file_name, range_from, range_to, rows, sha256)"
        " VALUES ($1, $2, $3, $4, $5)",
        file_name,
        start,
        end,
        rows,
        sha256,
    )


async def all_archives(conn: Executor) -> list[asyncpg.Record]:
    """Every archive, oldest day first."""
    return await conn.fetch(
        "SELECT id, file_name, range_from, range_to, rows, sha256, created_at, rewritten_at"
        " FROM inbox_archives ORDER BY range_from"
    )


async def lock_all(conn: Executor) -> list[asyncpg.Record]:
    """Every archive, locked until the caller's transaction ends (an erasure rewrites them)."""
    return await conn.fetch(
        "SELECT id, file_name, range_from, range_to, rows, sha256 FROM inbox_archives"
        " ORDER BY range_from FOR UPDATE"
    )


async def rewritten(conn: Executor, archive_id: int, file_name: str, sha256: str) -> None:
    await conn.execute(
        "UPDATE inbox_archives SET file_name = $2, sha256 = $3, rewritten_at = now() WHERE id = $1",
        archive_id,
        file_name,
        sha256,
    )


async def key_received_at(conn: Executor, provider: str | None, event_id: str) -> list[dt.datetime]:
    """When the event (of the provider, or of any) was received, by its dedup key."""
    rows = await conn.fetch(
        "SELECT received_at FROM inbox_keys WHERE event_id = $2"
        " AND ($1::text IS NULL OR provider = $1) ORDER BY received_at",
        provider,
        event_id,
    )
    return [r["received_at"] for r in rows]


# Serializes an archive's writing with an erasure's rewriting of archives ("paya").
ARCHIVE_LOCK_KEY = 0x70617961


async def lock_archives(conn: Executor) -> None:
    """Until the caller's transaction ends, no other expiry or erasure touches archives."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", ARCHIVE_LOCK_KEY)
