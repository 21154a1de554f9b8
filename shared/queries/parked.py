"""Parked events: provider events for a payment with no order yet, held until the order is
registered (released) or their park runs out (dead-lettered). The per-payment lock that both
the orders worker and order registration take makes "no order, so park" and "registered, so
release" exclusive: whichever commits second sees what the first wrote."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from shared.db import Executor

# The orders service listens on this channel: a registration released parked events.
RELEASED_CHANNEL = "payhooks_parked_released"


async def lock_payments(conn: Executor, payment_ids: Sequence[str]) -> None:
    """Until the transaction ends, nobody else parks or releases these payments' events. One
    statement; the locks are taken in the order of their keys, so transactions sharing
    payments (or whose hashes collide, which only serializes them) never deadlock. Run it as
    a statement of its own, before the reads it protects: under READ COMMITTED each later
    statement sees what the lock's previous holder committed."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT"
        " hashtextextended('orders:' || p, 0) AS k FROM unnest($1::text[]) AS p ORDER BY k) s",
        list(payment_ids),
    )


@dataclass(frozen=True, slots=True)
class ParkedEvent:
    """One event as parked: what is needed to publish it again as it came."""

    event_id: str  # the message id
    provider: str | None
    payment_id: str
    event_type: str
    routing_key: str
    body: bytes
    headers: Mapping[str, Any]


async def park(conn: Executor, event: ParkedEvent) -> bool:
    """Park the event (call under lock_payments); True if this call parked it. A copy of an
    event already parked or released changes nothing; one that was dead-lettered (requeued
    from the DLQ while its order is still missing) is parked again, for a new term."""
    row = await conn.fetchval(
        "INSERT INTO parked_events"
        " (event_id, provider, payment_id, event_type, routing_key, body, headers)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)"
        " ON CONFLICT (event_id) DO UPDATE SET parked_at = now(), dead_lettered_at = NULL"
        " WHERE parked_events.dead_lettered_at IS NOT NULL"
        " RETURNING id",
        event.event_id,
        event.provider,
        event.payment_id,
        event.event_type,
        event.routing_key,
        event.body,
        dict(event.headers),
    )
    return row is not None


async def release(conn: Executor, payment_id: str) -> int:
    """In the transaction that registers the payment's order, under lock_payments: release
    its parked events (the relay publishes them to the orders queue once this commits, woken
    by a NOTIFY). Returns how many. An event being dead-lettered right now is left to that
    (the UPDATE waits for its row lock, then finds it dead-lettered)."""
    released = await conn.fetchval(
        "WITH r AS (UPDATE parked_events SET released_at = now() WHERE payment_id = $1"
        " AND released_at IS NULL AND dead_lettered_at IS NULL RETURNING 1)"
        " SELECT count(*) FROM r",
        payment_id,
    )
    if released:
        await conn.execute("SELECT pg_notify($1, $2)", RELEASED_CHANNEL, payment_id)
    return int(released)


@dataclass(frozen=True, slots=True)
class ParkedRow:
    id: int
    event_id: str
    payment_id: str
    routing_key: str
    body: bytes
    headers: dict[str, Any]
    parked_at: datetime


_ROW = "id, event_id, payment_id, routing_key, body, headers, parked_at"


async def lock_released(conn: Executor, limit: int) -> list[ParkedRow]:
    """Released events not yet confirmed on the orders queue, oldest first, locked; other
    relays skip them (SKIP LOCKED)."""
    rows = await conn.fetch(
        f"SELECT {_ROW} FROM parked_events WHERE released_at IS NOT NULL"
        " AND published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        limit,
    )
    return [ParkedRow(**dict(r)) for r in rows]


async def mark_published(conn: Executor, ids: Sequence[int]) -> None:
    await conn.execute(
        "UPDATE parked_events SET published_at = now() WHERE id = ANY($1::bigint[])", list(ids)
    )


async def lock_expired(conn: Executor, park_s: float, limit: int) -> list[ParkedRow]:
    """Events still parked `park_s` after they were parked, oldest first, locked (a
    registration releasing them waits for this transaction, then finds them dead-lettered)."""
    rows = await conn.fetch(
        f"SELECT {_ROW} FROM parked_events WHERE released_at IS NULL"
        " AND dead_lettered_at IS NULL AND parked_at < now() - make_interval(secs => $1)"
        " ORDER BY parked_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        park_s,
        limit,
    )
    return [ParkedRow(**dict(r)) for r in rows]


async def mark_dead_lettered(conn: Executor, ids: Sequence[int]) -> None:
    await conn.execute(
        "UPDATE parked_events SET dead_lettered_at = now() WHERE id = ANY($1::bigint[])",
        list(ids),
    )


async def waiting(conn: Executor) -> tuple[int, float]:
    """How many events are parked now, and the age in seconds of the oldest (0 if none)."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n, coalesce(extract(epoch FROM now() - min(parked_at)), 0) AS oldest"
        " FROM parked_events WHERE released_at IS NULL AND dead_lettered_at IS NULL"
    )
    assert row is not None
    return int(row["n"]), float(row["oldest"])


async def for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    """A payment's parked events, parked, released or dead-lettered, oldest first."""
    return await conn.fetch(
        "SELECT event_id, event_type, parked_at, released_at, published_at, dead_lettered_at"
        " FROM parked_events WHERE payment_id = $1 ORDER BY id",
        payment_id,
    )
