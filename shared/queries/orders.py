"""Orders and their transitions: registration, the row lock every effect takes, state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

import asyncpg
import orjson
from asyncpg.pool import PoolConnectionProxy

from shared.db import Executor, columns
from shared.queries import parked as parked_sql


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
    " refunded_at, refund_ids, reversed_refund_ids, created_at, updated_at, undecided_since,"
    " undecided_reason"
)


async def register_order(db: Executor, order: NewOrder) -> tuple[asyncpg.Record, bool]:
    """Insert the order; idempotent on order_id. Returns (row, created). In the same
    transaction, under the payment's lock (shared/queries/parked.py), release the events the
    orders worker parked for this payment before its order existed: every edge that registers
    an order (API, console, CLI) comes through here."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            return await _register(conn, order)
    return await _register(db, order)


async def _register(
    conn: asyncpg.Connection[Any] | PoolConnectionProxy[Any], order: NewOrder
) -> tuple[asyncpg.Record, bool]:
    async with conn.transaction():  # a savepoint inside the caller's transaction, if any
        await parked_sql.lock_payments(conn, [order.payment_id])
        # No conflict target: a taken order_id or payment_id both leave no row (an error
        # would abort the transaction); the comparison below tells which.
        row = await conn.fetchrow(
            "INSERT INTO orders (order_id, payment_id, user_id, email, amount, currency)"
            " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING"
            f" RETURNING {_ORDER_COLUMNS}",
            order.order_id,
            order.payment_id,
            order.user_id,
            order.email,
            order.amount,
            order.currency,
        )
        if row is not None:
            await parked_sql.release(conn, order.payment_id)
            return row, True
        existing = await conn.fetchrow(
            f"SELECT {_ORDER_COLUMNS} FROM orders WHERE order_id = $1", order.order_id
        )
        if existing is None:
            raise OrderConflictError(f"payment {order.payment_id} belongs to another order")
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


async def lock_orders(conn: Executor, payment_ids: Sequence[str]) -> list[asyncpg.Record]:
    """The orders of a batch's payments, row-locked in payment id order until the transaction
    ends (batches sharing orders wait for each other, never deadlock); each row also carries
    the transaction's `now()` as `tx_now` (what `updated_at` becomes when it is saved)."""
    return await conn.fetch(
        f"SELECT {_ORDER_COLUMNS}, now() AS tx_now FROM orders"
        " WHERE payment_id = ANY($1::text[]) ORDER BY payment_id FOR UPDATE",
        list(payment_ids),
    )


@dataclass(frozen=True, slots=True)
class OrderStateRow:
    """What the state machine keeps of an order, as saved."""

    payment_id: str
    status: str
    refunded_amount: Decimal
    refunded_at: datetime | None
    refund_ids: Sequence[str]
    reversed_refund_ids: Sequence[str]


async def save_order_states(conn: Executor, states: Sequence[OrderStateRow]) -> None:
    """Save orders' states in one statement (one row per payment). A changed order is due for
    the reconciler RECONCILE_AFTER from now (shared/queries/schedule.py), unless it is flagged
    undecided: then it stays due at once."""
    await conn.execute(
        "UPDATE orders o SET status = t.status, refunded_amount = t.refunded_amount,"
        " refunded_at = t.refunded_at,"
        " refund_ids = ARRAY(SELECT jsonb_array_elements_text(t.refund_ids::jsonb)),"
        " reversed_refund_ids ="
        " ARRAY(SELECT jsonb_array_elements_text(t.reversed_refund_ids::jsonb)),"
        " updated_at = now(),"
        " next_check_at = CASE WHEN o.undecided_since IS NULL THEN NULL ELSE o.next_check_at END"
        " FROM unnest($1::text[], $2::text[], $3::numeric[], $4::timestamptz[], $5::text[],"
        " $6::text[]) AS t(payment_id, status, refunded_amount, refunded_at, refund_ids,"
        " reversed_refund_ids)"
        " WHERE o.payment_id = t.payment_id",
        [s.payment_id for s in states],
        [s.status for s in states],
        [s.refunded_amount for s in states],
        [s.refunded_at for s in states],
        # A text[] per row can't ride in one array: each as the text of a JSON array.
        [orjson.dumps(list(s.refund_ids)).decode() for s in states],
        [orjson.dumps(list(s.reversed_refund_ids)).decode() for s in states],
    )


class TransitionRow(NamedTuple):
    payment_id: str
    from_status: str
    to_status: str
    event_id: str


async def add_transitions(conn: Executor, transitions: Sequence[TransitionRow]) -> None:
    """Record transitions in one statement, in the order given (their ids follow it)."""
    await conn.execute(
        "INSERT INTO order_transitions (payment_id, from_status, to_status, event_id)"
        " SELECT t.payment_id, t.from_status, t.to_status, t.event_id"
        " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY"
        " AS t(payment_id, from_status, to_status, event_id, n) ORDER BY t.n",
        *columns(transitions, 4),
    )


# The reconciler listens on this channel: an undecided order is asked about at once.
UNDECIDED_CHANNEL = "payhooks_undecided"


async def flag_undecided(conn: Executor, payment_id: str, reason: str) -> None:
    """The model could not decide an event of this order: due for the reconciler now (and it
    is woken up when the transaction commits)."""
    await conn.execute(
        "UPDATE orders SET undecided_since = coalesce(undecided_since, now()),"
        " undecided_at = now(), undecided_reason = $2, next_check_at = now()"
        " WHERE payment_id = $1",
        payment_id,
        reason,
    )
    await conn.execute("SELECT pg_notify($1, $2)", UNDECIDED_CHANNEL, payment_id)


async def clear_undecided(conn: Executor, payment_id: str, asked_at: datetime) -> None:
    """The provider's answer, sought at `asked_at`, settled the order: unless another
    undecidable event came after that, it is decided again."""
    await conn.execute(
        "UPDATE orders SET undecided_since = NULL, undecided_at = NULL, undecided_reason = NULL"
        " WHERE payment_id = $1 AND undecided_at <= $2",
        payment_id,
        asked_at,
    )


async def undecided_backlog(conn: Executor) -> tuple[int, float]:
    """How many orders are undecided, and the age in seconds of the oldest (0 if none)."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n, coalesce(extract(epoch FROM now() - min(undecided_since)), 0)"
        " AS oldest FROM orders WHERE undecided_since IS NOT NULL"
    )
    assert row is not None
    return int(row["n"]), float(row["oldest"])


async def order_for_payment(conn: Executor, payment_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {_ORDER_COLUMNS} FROM orders WHERE payment_id = $1", payment_id
    )


async def orders_for_payments(
    conn: Executor, payment_ids: Sequence[str]
) -> dict[str, asyncpg.Record]:
    """payment id -> its order, for the ids that have one (a batch's orders in one read)."""
    rows = await conn.fetch(
        f"SELECT {_ORDER_COLUMNS} FROM orders WHERE payment_id = ANY($1::text[])",
        list(payment_ids),
    )
    return {r["payment_id"]: r for r in rows}


async def order_by_id(conn: Executor, order_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {_ORDER_COLUMNS} FROM orders WHERE order_id = $1", order_id)


async def transitions_for_payments(
    conn: Executor, payment_ids: Sequence[str]
) -> dict[str, list[asyncpg.Record]]:
    """Each payment's transitions, oldest first, in one statement."""
    rows = await conn.fetch(
        "SELECT payment_id, id, from_status, to_status, event_id, at, source, actor, forced,"
        " reason FROM order_transitions"
        " WHERE payment_id = ANY($1::text[]) ORDER BY id",
        list(payment_ids),
    )
    history: dict[str, list[asyncpg.Record]] = {p: [] for p in payment_ids}
    for row in rows:
        history[row["payment_id"]].append(row)
    return history


async def transitions_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return (await transitions_for_payments(conn, [payment_id]))[payment_id]


async def statuses(conn: Executor, payment_ids: Sequence[str]) -> dict[str, str]:
    """payment id -> order status, for the payments that have an order."""
    rows = await conn.fetch(
        "SELECT payment_id, status FROM orders WHERE payment_id = ANY($1::text[])",
        list(payment_ids),
    )
    return {r["payment_id"]: r["status"] for r in rows}


async def transition_statuses(conn: Executor, payment_ids: Sequence[str]) -> dict[str, list[str]]:
    """payment id -> the statuses its order moved to, oldest first."""
    rows = await conn.fetch(
        "SELECT payment_id, array_agg(to_status ORDER BY id) AS statuses FROM order_transitions"
        " WHERE payment_id = ANY($1::text[]) GROUP BY payment_id",
        list(payment_ids),
    )
    return {r["payment_id"]: list(r["statuses"]) for r in rows}


async def reconciled_transitions(conn: Executor, payment_ids: Sequence[str]) -> int:
    """Transitions of these payments made by the reconciler's synthetic events (repairs)."""
    count = await conn.fetchval(
        "SELECT count(*) FROM order_transitions"
        " WHERE payment_id = ANY($1::text[]) AND event_id LIKE 'reconcile:%'",
        list(payment_ids),
    )
    return int(count)
