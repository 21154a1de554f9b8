"""One order transition: the payment's bonus ledger brought in line with its order's history,
replayed from the committed transitions (shared/bonus_rules.py), each entry unique on its
transition: reordered, repeated or concurrent messages add each entry once, with no lock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import structlog

from shared.bonus_rules import SIGN, EntryKind, Transition, entries_for
from shared.db import TRANSIENT_DB_ERRORS, Executor
from shared.errors import UnknownPaymentError
from shared.messages import OrderTransition
from shared.metrics import BonusMetrics
from shared.queries import ledger as ledger_sql
from shared.queries import orders as orders_sql
from shared.worker.batches import BatchHandler, Delivery, Result, Step, apply_set_batch, keys_of

log = structlog.get_logger(__name__)

WORKER = "bonuses"


class _Batch:
    """One attempt at a batch: the transitions of its payments read in one statement first,
    each message's entries due from its payment's history, every entry written in one
    statement at the end (and every processed mark, by apply_batch)."""

    def __init__(self, orders: dict[str, asyncpg.Record], points: int, metrics: BonusMetrics):
        self._orders = orders  # read before the transaction (their user ids never change)
        self._points = points
        self._metrics = metrics
        self._history: dict[str, list[Transition]] = {}
        # Of the entries written, which step logs and counts each (the first that was due it).
        self._added_by: dict[int, int] = {}

    async def start(self, conn: Executor, payment_ids: list[str]) -> None:
        history = await orders_sql.transitions_for_payments(conn, payment_ids)
        self._history = {
            payment_id: [Transition(r["id"], r["to_status"], r["event_id"]) for r in rows]
            for payment_id, rows in history.items()
        }
        self._added_by = {}

    async def handle(self, step: Step, delivery: Delivery) -> str:
        payment_id = OrderTransition.decode(delivery.body).payment_id
        order = self._orders.get(payment_id)
        if order is None:
            raise UnknownPaymentError(f"no order for payment {payment_id}")
        due = [
            (
                ledger_sql.LedgerEntry(
                    payment_id,
                    order["user_id"],
                    e.transition.id,
                    e.kind.value,
                    SIGN[e.kind] * self._points,
                    e.transition.event_id,
                ),
                e.transition.to_status,
            )
            for e in entries_for(self._history.get(payment_id, []))
        ]
        step.value = [entry for entry, _ in due]

        def committed() -> None:
            for entry, to_status in due:
                if self._added_by.get(entry.transition_id) != step.index:
                    continue
                self._metrics.entries.labels(kind=entry.kind).inc()
                if entry.kind == EntryKind.GRANT.value:
                    self._metrics.points_granted.inc(entry.points)
                log.info(
                    "bonus.entry_added",
                    message_id=delivery.message_id,
                    payment_id=payment_id,
                    user_id=entry.user_id,
                    kind=entry.kind,
                    points=entry.points,
                    transition_id=entry.transition_id,
                    to_status=to_status,
                )

        step.after_commit(committed)
        return "ok"

    async def write(self, conn: Executor, steps: list[Step]) -> dict[int, Exception]:
        """The committed steps' entries, each transition's once (several messages of one
        payment replay the same history)."""
        entries: dict[int, tuple[int, ledger_sql.LedgerEntry]] = {}
        for step in steps:
            for entry in step.value or ():
                entries.setdefault(entry.transition_id, (step.index, entry))
        if entries:
            added = await ledger_sql.add_ledger_entries(conn, [e for _, e in entries.values()])
            self._added_by = {t: entries[t][0] for t in added}
        return {}


def make_handler(pool: asyncpg.Pool[Any], points: int, metrics: BonusMetrics) -> BatchHandler:
    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        try:
            orders = await orders_sql.orders_for_payments(pool, keys_of(deliveries, payment_id_of))
        except TRANSIENT_DB_ERRORS as e:
            return [e if isinstance(e, Exception) else RuntimeError(repr(e))] * len(deliveries)
        return await apply_set_batch(
            pool, deliveries, _Batch(orders, points, metrics), payment_id_of, marks=WORKER
        )

    return run


def payment_id_of(delivery: Delivery) -> str:
    """The batch order: the payment whose ledger the message extends."""
    return OrderTransition.decode(delivery.body).payment_id
