"""The inbox: each verified webhook stored once per (provider, event id); `inbox_unpublished`
holds the ids whose publish RabbitMQ has not confirmed yet."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from shared.db import Executor
from shared.queries import without_flush_wait


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """A verified webhook about to be stored."""

    event_id: str
    event_type: str
    payment_id: str | None
    body: bytes
    headers: dict[str, str]
    copies: int = 1  # deliveries of it in this batch


@dataclass(frozen=True, slots=True)
class StoredEntry:
    id: int
    event_id: str
    inserted: bool  # False: a copy of an event stored before (counted as a duplicate)
    published: bool  # RabbitMQ confirmed a publish of it (and the mark committed)


# One statement stores a whole batch: each event id's key goes into `inbox_keys` (the dedup,
# which outlives the inbox's daily partitions: shared/migrations/021_inbox_partitions.sql);
# a new key's row goes into the inbox (and `inbox_unpublished` until the confirm), a key stored
# before counts its copies as duplicates. `xmax = 0` tells an insert from an update. A copy is
# published when its key was in this statement's snapshot without an unpublished row: a key a
# concurrent transaction committed after the snapshot (the INSERT waited for it) counts as
# unpublished, since its unpublished row can't be seen yet, and is published again (harmless)
# rather than answered unconfirmed. A key whose row retention archived was published long
# before (retention keeps every unpublished row). The key is looked up by a scalar subquery,
# not EXISTS: PostgreSQL may turn an EXISTS into a hash of the whole table, which the plan of
# a young table keeps as the table grows (measured: a scan of inbox_keys per batch).
_STORE_BATCH = """
WITH t AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::int[])
         AS t(event_id, event_type, payment_id, body, headers, copies)
), keys AS (
    INSERT INTO inbox_keys AS k (provider, event_id, id, received_at, duplicates)
    SELECT $1, t.event_id, nextval('inbox_id_seq'), now(), t.copies - 1 FROM t
    ON CONFLICT (provider, event_id) DO UPDATE SET
        duplicates = k.duplicates + EXCLUDED.duplicates + 1, last_seen_at = now()
    RETURNING k.id, k.event_id, k.received_at, (k.xmax = 0) AS inserted
), stored AS (
    INSERT INTO inbox (id, provider, event_id, event_type, payment_id, body, headers, received_at)
    SELECT k.id, $1, t.event_id, t.event_type, t.payment_id, t.body, t.headers::jsonb,
           k.received_at
    FROM keys k JOIN t USING (event_id) WHERE k.inserted
), unpublished AS (
    INSERT INTO inbox_unpublished (id, received_at)
    SELECT id, received_at FROM keys WHERE inserted
)
SELECT k.id, k.event_id, k.inserted,
       CASE WHEN k.inserted THEN false
            ELSE coalesce((SELECT true FROM inbox_keys v WHERE v.provider = $1
                                                          AND v.event_id = k.event_id), false)
                 AND NOT EXISTS (SELECT 1 FROM inbox_unpublished u WHERE u.id = k.id)
       END AS published
FROM keys k
"""


def storable_text(value: str) -> str:
    """PostgreSQL text and jsonb can't hold NUL or lone surrogates (undecodable header
    bytes); the exact bytes stay in `body`, this copy is for lookups and reading."""
    if "\x00" in value or not value.isascii():
        value = value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode()
    return value


def _storable_headers(headers: dict[str, str]) -> str:
    return orjson.dumps({storable_text(k): storable_text(v) for k, v in headers.items()}).decode()


async def store_batch(
    db: Executor, provider: str, entries: Sequence[InboxEntry]
) -> list[StoredEntry]:
    """Store entries (distinct event ids) in one statement; one StoredEntry per entry."""
    rows = await db.fetch(
        _STORE_BATCH,
        provider,
        [storable_text(e.event_id) for e in entries],
        [storable_text(e.event_type) for e in entries],
        [None if e.payment_id is None else storable_text(e.payment_id) for e in entries],
        [e.body for e in entries],
        [_storable_headers(e.headers) for e in entries],
        [e.copies for e in entries],
    )
    return [StoredEntry(r["id"], r["event_id"], r["inserted"], r["published"]) for r in rows]


_STORE_ONE = """
WITH k AS (
    INSERT INTO inbox_keys (provider, event_id, id, received_at)
    VALUES ($1, $2, nextval('inbox_id_seq'), now())
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING id, received_at
), i AS (
    INSERT INTO inbox (id, provider, event_id, event_type, payment_id, body, headers, received_at)
    SELECT k.id, $1, $2, $3, $4, $5, $6::jsonb, k.received_at FROM k
)
SELECT id FROM k
"""


async def store_one(db: Executor, provider: str, entry: InboxEntry) -> int | None:
    """One webhook in a statement of its own and no unpublished row (its publish is awaited
    before the answer): the naive benchmark baseline's accept path (bench/naive_ingest.py).
    The new row's id; None for an id stored before."""
    row_id: int | None = await db.fetchval(
        _STORE_ONE,
        provider,
        storable_text(entry.event_id),
        storable_text(entry.event_type),
        None if entry.payment_id is None else storable_text(entry.payment_id),
        entry.body,
        _storable_headers(entry.headers),
    )
    return row_id


_MARK_PUBLISHED = "DELETE FROM inbox_unpublished WHERE id = ANY($1::bigint[])"


async def mark_published(db: Executor, ids: Sequence[int]) -> None:
    await db.execute(_MARK_PUBLISHED, list(ids))


async def mark_published_lazily(db: Executor, ids: Sequence[int]) -> None:
    """mark_published without waiting for the WAL flush: a mark lost in a crash only means
    the sweeper publishes the row again, and the flush it saves is one every hot-path commit
    would otherwise queue behind."""
    await db.execute(_MARK_PUBLISHED_LAZILY, list(ids))


_MARK_PUBLISHED_LAZILY = without_flush_wait(_MARK_PUBLISHED)


@dataclass(frozen=True, slots=True)
class Unpublished:
    id: int
    provider: str
    event_id: str
    event_type: str
    body: bytes


# Joined by id alone, not also by received_at (which would pick the partition): a row the
# sweeper cannot find is a publish lost for good, and the few rows a pass takes afford a
# probe of each partition's primary key.
_LOCK_UNPUBLISHED = """
SELECT i.id, i.provider, i.event_id, i.event_type, i.body
FROM inbox_unpublished u JOIN inbox i ON i.id = u.id
WHERE u.received_at < now() - make_interval(secs => $1)
ORDER BY u.id
LIMIT $2
FOR UPDATE OF u SKIP LOCKED
"""


async def lock_unpublished(db: Executor, older_than_s: float, limit: int) -> list[Unpublished]:
    """Lock (for the caller's transaction) stored rows never confirmed, received more than
    `older_than_s` ago; rows another transaction holds are skipped (safe with replicas)."""
    rows = await db.fetch(_LOCK_UNPUBLISHED, older_than_s, limit)
    return [Unpublished(**dict(r)) for r in rows]


# A stored webhook as the views describe it: whether RabbitMQ confirmed it, and what the orders
# worker decided about it (shared/ops/inbox_view.py turns both into its outcome), found by the
# id the workers know it by (shared/providers/registry.py message_of: X-Hub's event id as it
# is, any other provider's after its name and a colon), with its copies counted on its key.
# {extra}: more columns.
DESCRIBED = (
    "SELECT i.id, i.provider, i.event_id, i.event_type, i.payment_id, i.received_at,"
    " coalesce(k.duplicates, 0) AS duplicates,"
    " coalesce(k.last_seen_at, i.received_at) AS last_seen_at,"
    " NOT EXISTS (SELECT 1 FROM inbox_unpublished u WHERE u.id = i.id) AS published,"
    " p.outcome AS processed_outcome{extra}"
    " FROM inbox i"
    " LEFT JOIN inbox_keys k ON k.provider = i.provider AND k.event_id = i.event_id"
    " LEFT JOIN processed_events p"
    "   ON p.worker = 'orders' AND p.event_id = CASE i.provider WHEN 'xhub' THEN i.event_id"
    "     ELSE i.provider || ':' || i.event_id END"
)


async def webhooks_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        DESCRIBED.format(extra=", i.body")
        + " WHERE i.payment_id = $1 ORDER BY i.received_at, i.id",
        payment_id,
    )


async def providers_of_payment(db: Executor, payment_id: str) -> list[str]:
    """The providers whose stored webhooks name the payment (by the inbox's lookup copy)."""
    rows = await db.fetch(
        "SELECT DISTINCT provider FROM inbox WHERE payment_id = $1 ORDER BY provider", payment_id
    )
    return [row["provider"] for row in rows]


async def webhook(db: Executor, provider: str, event_id: str) -> asyncpg.Record | None:
    """One stored webhook with its body and headers; None if there is none."""
    return await db.fetchrow(
        DESCRIBED.format(extra=", i.body, i.headers")
        + " WHERE (i.id, i.received_at) = (SELECT k.id, k.received_at FROM inbox_keys k"
        " WHERE k.provider = $1 AND k.event_id = $2)",
        provider,
        event_id,
    )


@dataclass(frozen=True, slots=True)
class EventFilter:
    """What a listing or a replay of the inbox keeps (all given must hold); times inclusive."""

    payment_id: str | None = None
    event_type: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    provider: str | None = None
    event_ids: tuple[str, ...] = ()


# Where a read resumes: the (received_at, id) of the last row it read.
Position = tuple[dt.datetime, int]


def events_statement(
    where: EventFilter,
    position: Position | None,
    limit: int,
    *,
    oldest_first: bool = False,
    extra: str = "",
) -> tuple[str, list[Any]]:
    """The statement of `events_before` (newest first, before `position`: the views) or of a
    replay's read (oldest first, after it), DESCRIBED with `extra` columns, and its arguments
    (the index tests EXPLAIN it). Only the filters given are in it, so each combination is
    planned for the index that serves it (migration 011's)."""
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
    if position is not None:
        at, row_id = arg(position[0], "timestamptz"), arg(position[1], "bigint")
        beyond = ">" if oldest_first else "<"
        conditions.append(f"(i.received_at, i.id) {beyond} ({at}, {row_id})")
    sql = DESCRIBED.format(extra=extra)
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    order = "" if oldest_first else " DESC"
    sql += f" ORDER BY i.received_at{order}, i.id{order} LIMIT {arg(limit, 'int')}"
    return sql, args


async def events_before(
    conn: Executor, where: EventFilter, before: Position | None, limit: int
) -> list[asyncpg.Record]:
    """Up to `limit` stored webhooks, newest first, after `before` in that order."""
    sql, args = events_statement(where, before, limit)
    return await conn.fetch(sql, *args)


async def events_after(
    conn: Executor, where: EventFilter, after: Position | None, limit: int
) -> list[asyncpg.Record]:
    """Up to `limit` stored webhooks with their bodies, oldest first, after `after` (a
    replay's read, shared/ops/replay.py)."""
    sql, args = events_statement(where, after, limit, oldest_first=True, extra=", i.body")
    return await conn.fetch(sql, *args)


@asynccontextmanager
async def planned_for_values(db: Executor) -> AsyncIterator[Executor]:
    """A read-only transaction whose statements are planned for their arguments each time. A
    prepared statement's generic plan can't tell a rare event type from a common one and, as
    measured, walks the time index filtering by type instead of the type's own index."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn, planned_for_values(conn) as planned:
            yield planned
        return
    async with db.transaction(readonly=True):
        await db.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        yield db


async def unpublished_count(conn: Executor) -> int:
    """Stored webhooks not yet confirmed by RabbitMQ."""
    return int(await conn.fetchval("SELECT count(*) FROM inbox_unpublished"))


async def received_since(conn: Executor, seconds: float, cap: int) -> int:
    """Webhooks first received in the last `seconds`, counted up to `cap` (an index range)."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM (SELECT 1 FROM inbox"
            " WHERE received_at > now() - make_interval(secs => $1) LIMIT $2) recent",
            seconds,
            cap,
        )
    )
