"""Every DML statement payhooks runs, each next to a small typed function that runs it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeAlias

import asyncpg
import orjson
from asyncpg.pool import PoolConnectionProxy

# asyncpg's Pool, Connection and pooled connection all offer fetch/execute; callers pass either.
Executor: TypeAlias = "asyncpg.Pool[Any] | asyncpg.Connection[Any] | PoolConnectionProxy[Any]"


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """A verified webhook about to be stored."""

    event_id: str
    event_type: str
    payment_id: str | None
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class StoredEntry:
    id: int
    event_id: str
    inserted: bool
    published: bool
    # True when this call holds the row's publish claim: the row is not yet confirmed by the
    # broker and nobody else is publishing it right now.
    must_publish: bool


# One statement stores a whole batch: new ids are inserted with a publish claim; ids already
# stored count a duplicate and take the claim only if the row is unpublished and unclaimed
# (its first publish failed, its claim expired, or its claim is one the caller knows was
# abandoned, $9). `xmax = 0` tells an insert from an update.
_STORE_BATCH = """
INSERT INTO inbox AS i
    (provider, event_id, event_type, payment_id, body, headers, claim_token, claimed_until)
SELECT $1, t.event_id, t.event_type, t.payment_id, t.body, t.headers::jsonb,
       $7, now() + make_interval(secs => $8)
FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[])
     AS t(event_id, event_type, payment_id, body, headers)
ON CONFLICT (provider, event_id) DO UPDATE SET
    duplicates = i.duplicates + 1,
    last_seen_at = now(),
    claim_token = CASE WHEN i.published_at IS NULL
                        AND (i.claimed_until IS NULL OR i.claimed_until < now()
                             OR i.claim_token = ANY($9::uuid[]))
                       THEN EXCLUDED.claim_token ELSE i.claim_token END,
    claimed_until = CASE WHEN i.published_at IS NULL
                          AND (i.claimed_until IS NULL OR i.claimed_until < now()
                               OR i.claim_token = ANY($9::uuid[]))
                         THEN EXCLUDED.claimed_until ELSE i.claimed_until END
RETURNING i.id, i.event_id, (i.xmax = 0) AS inserted, (i.published_at IS NOT NULL) AS published,
          (i.published_at IS NULL AND i.claim_token = $7) AS must_publish
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
    db: Executor,
    provider: str,
    entries: Sequence[InboxEntry],
    claim: uuid.UUID,
    lease_s: float,
    abandoned: Sequence[uuid.UUID] = (),
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
        claim,
        lease_s,
        list(abandoned),
    )
    return [
        StoredEntry(r["id"], r["event_id"], r["inserted"], r["published"], r["must_publish"])
        for r in rows
    ]


async def mark_published(db: Executor, ids: Sequence[int]) -> None:
    await db.execute(
        "UPDATE inbox SET published_at = now(), claim_token = NULL, claimed_until = NULL"
        " WHERE id = ANY($1::bigint[])",
        list(ids),
    )


async def release_claims(db: Executor, ids: Sequence[int], claim: uuid.UUID) -> None:
    """Give up a publish claim after a failed publish, so the next retry may publish at once."""
    await db.execute(
        "UPDATE inbox SET claimed_until = NULL"
        " WHERE id = ANY($1::bigint[]) AND claim_token = $2 AND published_at IS NULL",
        list(ids),
        claim,
    )


@dataclass(frozen=True, slots=True)
class Unpublished:
    id: int
    provider: str
    event_id: str
    event_type: str
    body: bytes


_CLAIM_UNPUBLISHED = """
UPDATE inbox SET claim_token = $1, claimed_until = now() + make_interval(secs => $2)
WHERE id IN (
    SELECT id FROM inbox
    WHERE published_at IS NULL AND (claimed_until IS NULL OR claimed_until < now())
    ORDER BY received_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
RETURNING id, provider, event_id, event_type, body
"""


async def claim_unpublished(
    db: Executor, claim: uuid.UUID, lease_s: float, limit: int
) -> list[Unpublished]:
    """Claim stored rows nobody is publishing (safe with several ingest replicas)."""
    rows = await db.fetch(_CLAIM_UNPUBLISHED, claim, lease_s, limit)
    return [Unpublished(**dict(r)) for r in rows]


# --- workers -------------------------------------------------------------------------------


async def mark_processed(conn: Executor, worker: str, event_id: str, outcome: str) -> bool:
    """Record that `worker` handled `event_id`; False if it already had (a redelivery).

    Runs inside the effect's transaction: a concurrent copy blocks on the unique key until
    this one commits or rolls back, so only one of them ever applies the effect.
    """
    row = await conn.fetchval(
        "INSERT INTO processed_events (worker, event_id, outcome) VALUES ($1, $2, $3)"
        " ON CONFLICT DO NOTHING RETURNING true",
        worker,
        event_id,
        outcome,
    )
    return row is True


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    id: int
    message_id: str
    routing_key: str
    body: bytes


async def add_to_outbox(conn: Executor, message_id: str, routing_key: str, body: bytes) -> None:
    await conn.execute(
        "INSERT INTO outbox (message_id, routing_key, body) VALUES ($1, $2, $3)"
        " ON CONFLICT (message_id) DO NOTHING",
        message_id,
        routing_key,
        body,
    )


async def lock_unpublished_outbox(conn: Executor, limit: int) -> list[OutboxMessage]:
    """Oldest unpublished outbox rows, locked; other relays skip them (SKIP LOCKED)."""
    rows = await conn.fetch(
        "SELECT id, message_id, routing_key, body FROM outbox WHERE published_at IS NULL"
        " ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        limit,
    )
    return [OutboxMessage(**dict(r)) for r in rows]


async def mark_outbox_published(conn: Executor, ids: Sequence[int]) -> None:
    await conn.execute(
        "UPDATE outbox SET published_at = now() WHERE id = ANY($1::bigint[])", list(ids)
    )


# --- orders --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewOrder:
    order_id: str
    payment_id: str
    user_id: str
    email: str
    amount: Decimal
    currency: str


class OrderConflictError(Exception):
    """The order id or payment id is already registered with different details."""


_ORDER_COLUMNS = (
    "order_id, payment_id, user_id, email, amount, currency, status, refunded_amount,"
    " refunded_at, refund_ids, created_at, updated_at"
)


async def register_order(conn: Executor, order: NewOrder) -> tuple[asyncpg.Record, bool]:
    """Insert the order; idempotent on order_id. Returns (row, created)."""
    try:
        row = await conn.fetchrow(
            "INSERT INTO orders (order_id, payment_id, user_id, email, amount, currency)"
            " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (order_id) DO NOTHING"
            f" RETURNING {_ORDER_COLUMNS}",
            order.order_id,
            order.payment_id,
            order.user_id,
            order.email,
            order.amount,
            order.currency,
        )
    except asyncpg.UniqueViolationError:
        raise OrderConflictError(f"payment {order.payment_id} belongs to another order") from None
    if row is not None:
        return row, True
    existing = await conn.fetchrow(
        f"SELECT {_ORDER_COLUMNS} FROM orders WHERE order_id = $1", order.order_id
    )
    if existing is None:  # deleted between the two statements: let the caller retry
        raise OrderConflictError(f"order {order.order_id} changed concurrently")
    same = (
        existing["payment_id"] == order.payment_id
        and existing["user_id"] == order.user_id
        and existing["email"] == order.email
        and existing["amount"] == order.amount
        and existing["currency"] == order.currency
    )
    if not same:
        raise OrderConflictError(f"order {order.order_id} is registered with other details")
    return existing, False


async def lock_order(conn: Executor, payment_id: str) -> asyncpg.Record | None:
    """The order of a payment, row-locked until the transaction ends (one writer at a time)."""
    return await conn.fetchrow(
        f"SELECT {_ORDER_COLUMNS} FROM orders WHERE payment_id = $1 FOR UPDATE", payment_id
    )


async def save_order_state(
    conn: Executor,
    payment_id: str,
    status: str,
    refunded_amount: Decimal,
    refunded_at: datetime | None,
    refund_ids: Sequence[str],
) -> None:
    await conn.execute(
        "UPDATE orders SET status = $2, refunded_amount = $3, refunded_at = $4,"
        " refund_ids = $5, updated_at = now() WHERE payment_id = $1",
        payment_id,
        status,
        refunded_amount,
        refunded_at,
        list(refund_ids),
    )


async def add_transition(
    conn: Executor, payment_id: str, from_status: str, to_status: str, event_id: str
) -> None:
    await conn.execute(
        "INSERT INTO order_transitions (payment_id, from_status, to_status, event_id)"
        " VALUES ($1, $2, $3, $4)",
        payment_id,
        from_status,
        to_status,
        event_id,
    )


# --- bonuses -------------------------------------------------------------------------------


async def order_status_for_update(conn: Executor, payment_id: str) -> asyncpg.Record | None:
    """The order's status and user, locked: one bonus decision per payment at a time."""
    return await conn.fetchrow(
        "SELECT status, user_id FROM orders WHERE payment_id = $1 FOR UPDATE", payment_id
    )


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


# --- emails --------------------------------------------------------------------------------


async def order_for_payment(conn: Executor, payment_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {_ORDER_COLUMNS} FROM orders WHERE payment_id = $1", payment_id
    )


async def record_email(
    conn: Executor, payment_id: str, template: str, message_id: str, recipient: str, event_id: str
) -> bool:
    """Claim the (payment, template) send; False if it was already sent (or is being sent).

    A concurrent claim of the same key waits on the unique index until this transaction ends.
    """
    row = await conn.fetchval(
        "INSERT INTO emails_sent (payment_id, template, message_id, recipient, event_id)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING true",
        payment_id,
        template,
        message_id,
        recipient,
        event_id,
    )
    return row is True


async def order_by_id(conn: Executor, order_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {_ORDER_COLUMNS} FROM orders WHERE order_id = $1", order_id)


# --- support views -------------------------------------------------------------------------


async def webhooks_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT i.event_id, i.event_type, i.body, i.received_at, i.duplicates, i.published_at,"
        " p.outcome AS processed_outcome"
        " FROM inbox i LEFT JOIN processed_events p"
        "   ON p.worker = 'orders' AND p.event_id = i.event_id"
        " WHERE i.payment_id = $1 ORDER BY i.received_at, i.id",
        payment_id,
    )


async def transitions_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT from_status, to_status, event_id, at FROM order_transitions"
        " WHERE payment_id = $1 ORDER BY id",
        payment_id,
    )


async def ledger_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT payment_id, user_id, kind, points, event_id, created_at FROM bonus_ledger"
        " WHERE payment_id = $1 ORDER BY id",
        payment_id,
    )


async def emails_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT template, message_id, recipient, sent_at FROM emails_sent"
        " WHERE payment_id = $1 ORDER BY sent_at",
        payment_id,
    )


async def ledger_for_user(conn: Executor, user_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT payment_id, kind, points, created_at FROM bonus_ledger"
        " WHERE user_id = $1 ORDER BY id",
        user_id,
    )


async def backlog(conn: Executor) -> tuple[int, int]:
    """Rows waiting to be published: (inbox rows for ingest, outbox rows for the relay).

    Both counts walk partial indexes that hold only unpublished rows."""
    inbox = await conn.fetchval("SELECT count(*) FROM inbox WHERE published_at IS NULL")
    outbox = await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
    return int(inbox), int(outbox)


# --- reconciliation and housekeeping -------------------------------------------------------


_CLAIM_STALE = """
UPDATE orders SET reconciled_at = now()
WHERE payment_id IN (
    SELECT payment_id FROM orders
    WHERE status IN ('PENDING', 'AMOUNT_MISMATCH')
      AND updated_at < now() - make_interval(secs => $1)
      AND (reconciled_at IS NULL OR reconciled_at < now() - make_interval(secs => $2))
    ORDER BY updated_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
RETURNING payment_id, status, amount, currency, refunded_amount, refunded_at, refund_ids
"""


async def claim_stale_orders(
    conn: Executor, after_s: float, again_after_s: float, limit: int
) -> list[asyncpg.Record]:
    """Orders still undecided after `after_s`, not asked about in the last `again_after_s`;
    marked as asked in the same statement, so other reconcilers skip them."""
    return await conn.fetch(_CLAIM_STALE, after_s, again_after_s, limit)


async def delete_old(conn: Executor, table: str, retention_s: float, limit: int) -> int:
    """Delete up to `limit` rows past the retention; never an unpublished inbox/outbox row."""
    statements = {
        "inbox": "DELETE FROM inbox WHERE id IN (SELECT id FROM inbox WHERE received_at <"
        " now() - make_interval(secs => $1) AND published_at IS NOT NULL LIMIT $2)",
        "outbox": "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE created_at <"
        " now() - make_interval(secs => $1) AND published_at IS NOT NULL LIMIT $2)",
        "processed_events": "DELETE FROM processed_events WHERE (worker, event_id) IN (SELECT"
        " worker, event_id FROM processed_events WHERE processed_at <"
        " now() - make_interval(secs => $1) LIMIT $2)",
    }
    result = await conn.execute(statements[table], retention_s, limit)
    return int(result.split()[-1])
