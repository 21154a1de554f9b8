"""The statements of an erasure (shared/ops/erasure.py): find a person's orders and
addresses, and replace an address where it is held. Addresses are compared in lower case."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import asyncpg

from shared.db import Executor

# Tables holding raw bytes an address may sit in: (table, has a headers jsonb column).
RAW_TABLES: tuple[tuple[Literal["inbox", "parked_events", "outbox"], bool], ...] = (
    ("inbox", True),
    ("parked_events", True),
    ("outbox", False),
)


async def orders_of(
    conn: Executor, column: Literal["user_id", "order_id"], value: str
) -> list[asyncpg.Record]:
    """The orders of a user id, or the order of an order id."""
    return await conn.fetch(
        f"SELECT order_id, payment_id, email, erased_at FROM orders WHERE {column} = $1",
        value,
    )


async def payments_with(conn: Executor, addresses: Sequence[str]) -> list[str]:
    """The payments of the orders registered with any of the addresses."""
    rows = await conn.fetch(
        "SELECT payment_id FROM orders WHERE lower(email) = ANY($1::text[])", list(addresses)
    )
    return [r["payment_id"] for r in rows]


async def erase_orders(
    conn: Executor, payment_ids: Sequence[str], addresses: Sequence[str], marker: str
) -> list[str]:
    """The marker for the address of those of the payments' orders registered with one of the
    addresses, erased_at now (updated_at, amounts and states untouched); their order ids."""
    rows = await conn.fetch(
        "UPDATE orders SET email = $3, erased_at = now()"
        " WHERE payment_id = ANY($1::text[]) AND lower(email) = ANY($2::text[])"
        " RETURNING order_id",
        list(payment_ids),
        list(addresses),
        marker,
    )
    return sorted(r["order_id"] for r in rows)


async def erase_recipients(conn: Executor, addresses: Sequence[str], marker: str) -> int:
    """The marker for the recipient of every sent-email record to one of the addresses."""
    status = await conn.execute(
        "UPDATE emails_sent SET recipient = $2 WHERE lower(recipient) = ANY($1::text[])",
        list(addresses),
        marker,
    )
    return int(status.rsplit(" ", 1)[-1])


async def rows_holding(
    conn: Executor, table: str, has_headers: bool, addresses: Sequence[str]
) -> list[asyncpg.Record]:
    """The rows of `table` (one of RAW_TABLES) whose body (ASCII letters without regard to
    case) or headers hold one of the addresses, locked until the transaction ends. A full
    scan: erasures are rare, and an address may sit in a row of any payment."""
    found = "strpos(lower(encode(body, 'escape')), n.needle) > 0"
    if has_headers:
        found += " OR strpos(lower(headers::text), n.a) > 0"
    headers = "headers" if has_headers else "NULL::jsonb AS headers"
    return await conn.fetch(
        f"SELECT id, body, {headers} FROM {table} t WHERE EXISTS (SELECT 1 FROM"
        " (SELECT a, lower(encode(convert_to(a, 'UTF8'), 'escape')) AS needle"
        f" FROM unnest($1::text[]) AS a) n WHERE {found}) FOR UPDATE",
        list(addresses),
    )


async def rewrite_row(
    conn: Executor, table: str, row_id: int, body: bytes, headers: dict[str, Any] | None
) -> None:
    """A row of `table` (one of RAW_TABLES) with its body (and headers, when it has them)
    rewritten."""
    if headers is None:
        await conn.execute(f"UPDATE {table} SET body = $2 WHERE id = $1", row_id, body)
    else:
        await conn.execute(
            f"UPDATE {table} SET body = $2, headers = $3 WHERE id = $1", row_id, body, headers
        )
