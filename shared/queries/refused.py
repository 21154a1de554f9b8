"""Webhooks ingest refused (401, 5xx): written best-effort by ingest, read by `payhooks
missing` with the orders the reconciler could not decide."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.db import Executor, columns

# Refusals one hour may add at most (a flood of bad signatures, each with a new id, must not
# grow the table without bound); beyond it they are counted in ingest's metric and dropped.
MAX_ROWS_PER_HOUR = 20_000


@dataclass(frozen=True, slots=True)
class Refusal:
    provider: str
    event_id: str
    status: int
    outcome: str
    first_at: datetime
    last_at: datetime
    refusals: int


async def record(conn: Executor, refusals: Sequence[Refusal]) -> int:
    """Upsert the refusals (one row per provider, event id and status), unless the last
    hour has MAX_ROWS_PER_HOUR already; how many rows were written."""
    rows = await conn.fetch(
        "INSERT INTO refused_webhooks AS r"
        " (provider, event_id, status, outcome, first_at, last_at, refusals)"
        " SELECT * FROM unnest($1::text[], $2::text[], $3::smallint[], $4::text[],"
        " $5::timestamptz[], $6::timestamptz[], $7::integer[])"
        " WHERE (SELECT count(*) FROM (SELECT 1 FROM refused_webhooks"
        " WHERE last_at > now() - interval '1 hour' LIMIT $8) recent) < $8"
        " ON CONFLICT (provider, event_id, status) DO UPDATE SET"
        " last_at = greatest(r.last_at, excluded.last_at),"
        " first_at = least(r.first_at, excluded.first_at),"
        " refusals = r.refusals + excluded.refusals, outcome = excluded.outcome"
        " RETURNING 1",
        *columns(
            [
                (r.provider, r.event_id, r.status, r.outcome, r.first_at, r.last_at, r.refusals)
                for r in refusals
            ],
            7,
        ),
        MAX_ROWS_PER_HOUR,
    )
    return len(rows)


async def refused_between(
    conn: Executor, since: datetime, until: datetime, limit: int
) -> list[dict[str, Any]]:
    """Event ids refused in [since, until] (by their last refusal) that the inbox's keys still
    do not have (a later copy accepted is not missing, nor is it once archived), newest first."""
    rows = await conn.fetch(
        "SELECT r.provider, r.event_id, r.status, r.outcome, r.first_at, r.last_at, r.refusals"
        " FROM refused_webhooks r WHERE r.last_at BETWEEN $1 AND $2 AND NOT EXISTS"
        " (SELECT 1 FROM inbox_keys k WHERE k.provider = r.provider AND k.event_id = r.event_id)"
        " ORDER BY r.last_at DESC, r.id DESC LIMIT $3",
        since,
        until,
        limit,
    )
    return [dict(r) for r in rows]


async def undecided_between(
    conn: Executor, since: datetime, until: datetime, limit: int
) -> list[dict[str, Any]]:
    """Orders the model could not decide (still flagged), undecided since a time in
    [since, until], oldest first."""
    rows = await conn.fetch(
        "SELECT payment_id, order_id, status, undecided_since, undecided_at, undecided_reason"
        " FROM orders WHERE undecided_since BETWEEN $1 AND $2"
        " ORDER BY undecided_since, payment_id LIMIT $3",
        since,
        until,
        limit,
    )
    return [dict(r) for r in rows]
