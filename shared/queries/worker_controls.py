"""Operators' pause and rate cap of each worker, one row per worker (017_worker_controls.sql),
and the token bucket every replica of a capped worker takes its batches from."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import asyncpg

from shared.db import Executor

# Bounds of a cap an operator may set, in messages per second.
MIN_RATE = 0.01
MAX_RATE = 100_000.0

# Every replica of every worker listens here; the payload is the worker's name.
CHANNEL = "payhooks_worker_controls"

_COLUMNS = "worker, paused_at, paused_by, paused_reason, per_second, throttled_at, throttled_by"


@dataclass(frozen=True, slots=True)
class Controls:
    worker: str
    paused_at: dt.datetime | None = None
    paused_by: str | None = None
    paused_reason: str | None = None
    per_second: float | None = None
    throttled_at: dt.datetime | None = None
    throttled_by: str | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def as_json(self) -> dict[str, Any]:
        """As the api, the CLI's --json and the console show a worker."""
        return {
            "worker": self.worker,
            "paused": self.paused,
            "paused_at": None if self.paused_at is None else self.paused_at.isoformat(),
            "paused_by": self.paused_by,
            "paused_reason": self.paused_reason,
            "rate_limit_per_second": self.per_second,
            "throttled_at": None if self.throttled_at is None else self.throttled_at.isoformat(),
            "throttled_by": self.throttled_by,
        }


def _controls(row: asyncpg.Record | None, worker: str) -> Controls:
    return Controls(worker) if row is None else Controls(**dict(row))


async def controls(conn: Executor, worker: str) -> Controls:
    """The worker's controls (none set: a Controls with nothing in it)."""
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM worker_controls WHERE worker = $1", worker)
    return _controls(row, worker)


async def notify(conn: Executor, worker: str) -> None:
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, worker)


async def pause(conn: Executor, worker: str, by: str, reason: str) -> Controls | None:
    """Pause the worker; None if it is paused already (that pause stays as it is)."""
    row = await conn.fetchrow(
        "INSERT INTO worker_controls AS w (worker, paused_at, paused_by, paused_reason)"
        " VALUES ($1, now(), $2, $3) ON CONFLICT (worker) DO UPDATE"
        " SET paused_at = excluded.paused_at, paused_by = excluded.paused_by,"
        " paused_reason = excluded.paused_reason WHERE w.paused_at IS NULL"
        f" RETURNING {_COLUMNS}",
        worker,
        by,
        reason,
    )
    return None if row is None else _controls(row, worker)


async def resume(conn: Executor, worker: str) -> Controls | None:
    """End the worker's pause; the pause that ended (None: it was not paused)."""
    row = await conn.fetchrow(
        "WITH ended AS (SELECT worker, paused_at, paused_by, paused_reason FROM worker_controls"
        " WHERE worker = $1 AND paused_at IS NOT NULL FOR UPDATE)"
        " UPDATE worker_controls w SET paused_at = NULL, paused_by = NULL, paused_reason = NULL"
        " FROM ended WHERE w.worker = ended.worker"
        " RETURNING ended.worker, ended.paused_at, ended.paused_by, ended.paused_reason",
        worker,
    )
    return None if row is None else _controls(row, worker)


async def throttle(conn: Executor, worker: str, per_second: float, by: str) -> float | None:
    """Cap the worker at `per_second` messages per second (replacing a cap it had); the
    cap it had before, if any. A new cap starts with an empty bucket; a changed one keeps
    the tokens its new capacity holds."""
    previous: float | None = await conn.fetchval(
        "SELECT per_second FROM worker_controls WHERE worker = $1 FOR UPDATE", worker
    )
    await conn.execute(
        "INSERT INTO worker_controls AS w (worker, per_second, throttled_at, throttled_by)"
        " VALUES ($1, $2, now(), $3) ON CONFLICT (worker) DO UPDATE"
        " SET per_second = excluded.per_second, throttled_at = excluded.throttled_at,"
        " throttled_by = excluded.throttled_by,"
        " tokens = CASE WHEN w.per_second IS NULL THEN 0.0"
        "  ELSE least(w.tokens, greatest(excluded.per_second, 1.0)) END,"
        " refilled_at = CASE WHEN w.per_second IS NULL THEN now() ELSE w.refilled_at END",
        worker,
        per_second,
        by,
    )
    return previous


async def unthrottle(conn: Executor, worker: str) -> float | None:
    """Lift the worker's cap; the cap it had (None: it had none)."""
    lifted: float | None = await conn.fetchval(
        "WITH capped AS (SELECT worker, per_second FROM worker_controls"
        " WHERE worker = $1 AND per_second IS NOT NULL FOR UPDATE)"
        " UPDATE worker_controls w SET per_second = NULL, throttled_at = NULL,"
        " throttled_by = NULL, tokens = 0.0 FROM capped WHERE w.worker = capped.worker"
        " RETURNING capped.per_second",
        worker,
    )
    return lifted


@dataclass(frozen=True, slots=True)
class Taken:
    granted: int
    tokens_left: float
    per_second: float


async def take(conn: Executor, worker: str, wanted: int) -> Taken | None:
    """Take up to `wanted` whole tokens from the worker's bucket in one atomic UPDATE (the
    row lock orders the replicas' takes; each sees the bucket the one before left). None:
    the worker has no cap."""
    row = await conn.fetchrow(
        "UPDATE worker_controls SET"
        " granted = least($2, floor(worker_bucket_tokens(tokens, per_second, refilled_at,"
        "  statement_timestamp())))::integer,"
        " tokens = worker_bucket_tokens(tokens, per_second, refilled_at, statement_timestamp())"
        "  - least($2, floor(worker_bucket_tokens(tokens, per_second, refilled_at,"
        "  statement_timestamp()))),"
        " refilled_at = greatest(refilled_at, statement_timestamp())"
        " WHERE worker = $1 AND per_second IS NOT NULL"
        " RETURNING granted, tokens, per_second",
        worker,
        wanted,
    )
    if row is None:
        return None
    return Taken(row["granted"], row["tokens"], row["per_second"])


async def every(conn: Executor) -> dict[str, Controls]:
    rows = await conn.fetch(f"SELECT {_COLUMNS} FROM worker_controls ORDER BY worker")
    return {row["worker"]: _controls(row, row["worker"]) for row in rows}
