"""One order transition: bring the payment's bonus ledger in line with its order's status."""

from __future__ import annotations

from typing import Any

import asyncpg
import structlog

from services.bonuses.domain import SIGN, EntryKind, entries_due
from shared.errors import UnknownPaymentError
from shared.messages import OrderTransition
from shared.metrics import BonusMetrics
from shared.queries import ledger as ledger_sql
from shared.queries import orders as orders_sql
from shared.queries import processed as processed_sql
from shared.worker import Delivery, Handler

log = structlog.get_logger(__name__)

WORKER = "bonuses"


def make_handler(pool: asyncpg.Pool[Any], points: int, metrics: BonusMetrics) -> Handler:
    async def handle(delivery: Delivery) -> str:
        transition = OrderTransition.decode(delivery.body)
        async with pool.acquire() as conn, conn.transaction():
            order = await orders_sql.order_status_for_update(conn, transition.payment_id)
            if order is None:
                raise UnknownPaymentError(f"no order for payment {transition.payment_id}")
            if not await processed_sql.mark_processed(conn, WORKER, delivery.message_id, "ok"):
                return "skipped_duplicate"
            existing = {
                EntryKind(k) for k in await ledger_sql.ledger_kinds(conn, transition.payment_id)
            }
            added = []
            for kind in entries_due(order["status"], existing):
                signed = SIGN[kind] * points
                if await ledger_sql.add_ledger_entry(
                    conn,
                    transition.payment_id,
                    order["user_id"],
                    kind.value,
                    signed,
                    delivery.message_id,
                ):
                    added.append((kind, signed))
        for kind, signed in added:
            metrics.entries.labels(kind=kind.value).inc()
            if kind is EntryKind.GRANT:
                metrics.points_granted.inc(signed)
            log.info(
                "bonus.entry_added",
                payment_id=transition.payment_id,
                user_id=order["user_id"],
                kind=kind.value,
                points=signed,
            )
        return "ok"

    return handle
