"""The inbox: each verified webhook stored once per (provider, event id); `inbox_unpublished`
holds the ids whose publish RabbitMQ has not confirmed yet."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from shared.db import Executor


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


# One statement stores a whole batch: new ids are inserted (each with its row in
# `inbox_unpublished` until the confirm), ids already stored count their copies as duplicates.
# `xmax = 0` tells an insert from an update. A copy is published when its row was in this
# statement's snapshot without an unpublished row: a row a concurrent transaction committed
# after the snapshot (the INSERT waited for it) counts as unpublished, since its unpublished
# row can't be seen yet, and is published again (harmless) rather than answered unconfirmed.
_STORE_BATCH = """
WITH stored AS (
    INSERT INTO inbox AS i (provider, event_id, event_type, payment_id, body, headers, duplicates)
    SELECT $1, t.event_id, t.event_type, t.payment_id, t.body, t.headers::jsonb, t.copies - 1
    FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::int[])
         AS t(event_id, event_type, payment_id, body, headers, copies)
    ON CONFLICT (provider, event_id) DO UPDATE SET
        duplicates = i.duplicates + EXCLUDED.duplicates + 1, last_seen_at = now()
    RETURNING i.id, i.event_id, i.received_at, (i.xmax = 0) AS inserted
), unpublished AS (
    INSERT INTO inbox_unpublished (id, received_at)
    SELECT id, received_at FROM stored WHERE inserted
)
SELECT s.id, s.event_id, s.inserted,
       CASE WHEN s.inserted THEN false
            ELSE EXISTS (SELECT 1 FROM inbox v WHERE v.id = s.id)
                 AND NOT EXISTS (SELECT 1 FROM inbox_unpublished u WHERE u.id = s.id)
       END AS published
FROM stored s
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


_MARK_PUBLISHED = "DELETE FROM inbox_unpublished WHERE id = ANY($1::bigint[])"


async def mark_published(db: Executor, ids: Sequence[int]) -> None:
    await db.execute(_MARK_PUBLISHED, list(ids))


async def mark_published_lazily(pool: asyncpg.Pool[Any], ids: Sequence[int]) -> None:
    """mark_published without waiting for the WAL flush: a mark lost in a crash only means
    the sweeper publishes the row again, and the flush it saves is one every hot-path commit
    would otherwise queue behind."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL synchronous_commit = off")
        await conn.execute(_MARK_PUBLISHED, list(ids))


@dataclass(frozen=True, slots=True)
class Unpublished:
    id: int
    provider: str
    event_id: str
    event_type: str
    body: bytes


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


async def webhooks_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT i.event_id, i.event_type, i.body, i.received_at, i.duplicates,"
        " NOT EXISTS (SELECT 1 FROM inbox_unpublished u WHERE u.id = i.id) AS published,"
        " p.outcome AS processed_outcome"
        " FROM inbox i LEFT JOIN processed_events p"
        "   ON p.worker = 'orders' AND p.event_id = i.event_id"
        " WHERE i.payment_id = $1 ORDER BY i.received_at, i.id",
        payment_id,
    )


async def unpublished_count(conn: Executor) -> int:
    """Stored webhooks not yet confirmed by RabbitMQ."""
    return int(await conn.fetchval("SELECT count(*) FROM inbox_unpublished"))
