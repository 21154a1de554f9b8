"""One order transition: the payment's bonus ledger brought in line with its order's history,
replayed from the committed transitions (shared/bonus_rules.py), each entry unique on its
transition: reordered, repeated or concurrent messages add each entry once, with no lock."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import asyncpg
import structlog

from shared.batches import BatchHandler, Delivery, Result, Step, in_one_transaction, keys_of
from shared.bonus_rules import SIGN, EntryKind, Transition, entries_for
from shared.db import TRANSIENT_DB_ERRORS
from shared.errors import UnknownPaymentError
from shared.messages import OrderTransition
from shared.metrics import BonusMetrics
from shared.queries import ledger as ledger_sql
from shared.queries import orders as orders_sql
from shared.queries import processed as processed_sql

log = structlog.get_logger(__name__)

WORKER = "bonuses"


def make_handler(pool: asyncpg.Pool[Any], points: int, metrics: BonusMetrics) -> BatchHandler:
    async def handle(orders: dict[str, asyncpg.Record], step: Step, delivery: Delivery) -> str:
        """`orders`: the batch's, read before its transaction (their user ids never change)."""
        payment_id = OrderTransition.decode(delivery.body).payment_id
        conn = step.conn
        order = orders.get(payment_id)
        if order is None:
            raise UnknownPaymentError(f"no order for payment {payment_id}")
        if not await processed_sql.mark_processed(conn, WORKER, delivery.message_id, "ok"):
            return "skipped_duplicate"
        history = [
            Transition(r["id"], r["to_status"], r["event_id"])
            for r in await orders_sql.transitions_for_payment(conn, payment_id)
        ]
        due = entries_for(history)
        added = set(
            await ledger_sql.add_ledger_entries(
                conn,
                payment_id,
                order["user_id"],
                [
                    (e.transition.id, e.kind.value, SIGN[e.kind] * points, e.transition.event_id)
                    for e in due
                ],
            )
        )

        def committed() -> None:
            for entry in due:
                if entry.transition.id not in added:
                    continue
                signed = SIGN[entry.kind] * points
                metrics.entries.labels(kind=entry.kind.value).inc()
                if entry.kind is EntryKind.GRANT:
                    metrics.points_granted.inc(signed)
                log.info(
                    "bonus.entry_added",
                    message_id=delivery.message_id,
                    payment_id=payment_id,
                    user_id=order["user_id"],
                    kind=entry.kind.value,
                    points=signed,
                    transition_id=entry.transition.id,
                    to_status=entry.transition.to_status,
                )

        step.after_commit(committed)
        return "ok"

    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        try:
            orders = await orders_sql.orders_for_payments(pool, keys_of(deliveries, payment_id_of))
        except TRANSIENT_DB_ERRORS as e:
            return [e if isinstance(e, Exception) else RuntimeError(repr(e))] * len(deliveries)
        return await in_one_transaction(pool, partial(handle, orders), payment_id_of)(deliveries)

    return run


def payment_id_of(delivery: Delivery) -> str:
    """The batch order: the payment whose ledger the message extends."""
    return OrderTransition.decode(delivery.body).payment_id
