"""The inbox's daily partitions (migration 021): created days ahead, listed, dropped once
archived; and the dedup keys deleted once past their time."""

from __future__ import annotations

import datetime as dt

from shared.db import Executor

# Partitions made ahead of today (UTC): a reconciler down this long still leaves ingest a
# partition to write to; after that, rows go to the default partition until one is made.
DAYS_AHEAD = 3
# How long a dedup key outlives its inbox row's retention: the longest provider retry
# horizon (X-Hub's absolute 30 days from the delivery's creation, seeds/000), so dedup never
# depends on when, or whether, the row's partition was archived.
KEYS_KEPT_BEYOND_RETENTION_DAYS = 30


async def ensure_ahead(conn: Executor) -> list[str]:
    """The partitions of yesterday through DAYS_AHEAD days from now, and of any day with rows
    in the default partition (which moves them), created if missing; their names."""
    rows = await conn.fetch(
        "SELECT payhooks_inbox_partition(d) AS name FROM ("
        " SELECT (now() AT TIME ZONE 'UTC')::date + g AS d FROM generate_series(-1, $1::int) g"
        " UNION SELECT DISTINCT (received_at AT TIME ZONE 'UTC')::date FROM inbox_default"
        ") days ORDER BY d",
        DAYS_AHEAD,
    )
    return [r["name"] for r in rows]


async def days(conn: Executor) -> list[dt.date]:
    """The days the inbox has a partition for, oldest first (the default one aside)."""
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'inbox'::regclass AND c.relname LIKE 'inbox\\_p%'"
    )
    return sorted(dt.date.fromisoformat(r["relname"].removeprefix("inbox_p")) for r in rows)


async def oldest_day(conn: Executor) -> dt.date | None:
    """The oldest UTC day the inbox holds: its oldest partition's (empty or not: a day is
    held until its partition is dropped), or a row's in the default partition where that is
    older (a day whose partition was never made); None if it holds none. Cheap: the catalog,
    and the default partition's index on received_at."""
    held = await days(conn)
    row_at: dt.datetime | None = await conn.fetchval("SELECT min(received_at) FROM inbox_default")
    candidates = held[:1] + ([row_at.astimezone(dt.UTC).date()] if row_at is not None else [])
    return min(candidates, default=None)


async def unpublished_between(conn: Executor, start: dt.datetime, end: dt.datetime) -> int:
    """Rows received in [start, end) that RabbitMQ never confirmed (the sweeper owes them)."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM inbox_unpublished WHERE received_at >= $1 AND received_at < $2",
            start,
            end,
        )
    )


async def drop(conn: Executor, day: dt.date) -> None:
    """Detach and drop the day's partition: ACCESS EXCLUSIVE on inbox until the caller's
    transaction ends, which it does at once. While the drop waits for a reader of the inbox
    (a listing, a replay), ingest's inserts queue behind it: `lock_timeout` keeps that well
    inside ingest's 4 s database budget; a drop that times out waits for the next pass."""
    await conn.execute("SET LOCAL lock_timeout = '1s'")
    await conn.execute("SELECT payhooks_drop_inbox_partition($1)", day)


async def delete_old_keys(conn: Executor, retention_days: int, limit: int) -> int:
    """Delete up to `limit` dedup keys older than the retention plus the retry horizon whose
    inbox row is gone (a row kept longer, unpublished or not yet archived, keeps its key)."""
    result = await conn.execute(
        "DELETE FROM inbox_keys WHERE (provider, event_id) IN (SELECT provider, event_id"
        " FROM inbox_keys k WHERE received_at < now() - make_interval(days => $1)"
        " AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.id = k.id"
        " AND i.received_at = k.received_at) LIMIT $2)",
        retention_days + KEYS_KEPT_BEYOND_RETENTION_DAYS,
        limit,
    )
    return int(result.split()[-1])
