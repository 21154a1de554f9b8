"""The resolution of an order by an operator, carried out (shared/ops/operator_actions.py
resolve_order_recorded is its one entry, and writes the audit row): the payment's events in
flight, the transition and its outbox message, in one transaction under the payment's lock."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeAlias

import asyncpg
import structlog
from aio_pika.abc import AbstractChannel
from asyncpg.pool import PoolConnectionProxy

from shared import resolution
from shared.amqp.topology import Topology, message_id
from shared.db import Executor
from shared.errors import UnavailableError
from shared.messages import OrderTransition
from shared.ops import dlq, dlq_lock
from shared.ops.connections import UnreachableError
from shared.ops.order_input import order_json
from shared.order_machine import OrderState
from shared.queries import orders as orders_sql
from shared.queries import outbox as outbox_sql
from shared.queries import parked as parked_sql
from shared.queries import resolution as resolution_sql
from shared.queries.resolution import InFlight

log = structlog.get_logger(__name__)


class PaymentNotFoundError(LookupError):
    """No order is registered for the payment: nothing to resolve."""


class InFlightError(Exception):
    """A provider event of the payment is still on its way to the orders worker: resolving
    now would race it. Try again once it is processed (or requeue it, if dead-lettered)."""

    def __init__(self, payment_id: str, events: list[InFlight], note: str | None = None) -> None:
        listed = ", ".join(f"{e.event_id} ({e.event_type}, {e.where})" for e in events)
        extra = f"; {note}" if note else ""
        super().__init__(
            f"payment {payment_id} has {len(events)} provider event(s) not yet processed by"
            f" the orders worker: {listed}{extra}; resolve once they are"
        )
        self.events = events
        self.note = note


@dataclass(frozen=True, slots=True)
class Resolved:
    payment_id: str
    from_status: str
    to_status: str
    forced: bool
    reason: str
    actor: str
    transition_id: int
    event_id: str  # the transition's (operator:…): its ledger entry and order.* message
    order: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {
            "payment_id": self.payment_id,
            "from": self.from_status,
            "to": self.to_status,
            "forced": self.forced,
            "reason": self.reason,
            "actor": self.actor,
            "transition_id": self.transition_id,
            "event_id": self.event_id,
            "order": self.order,
        }


# Event ids (or message ids) of the payment's provider events now in orders.dlq.
DeadLettered: TypeAlias = "Callable[[], Awaitable[set[str]]]"
# Writes the resolution's audit row on the connection of its transaction.
Record: TypeAlias = "Callable[[Executor, Resolved], Awaitable[None]]"


async def resolve(
    conn: asyncpg.Connection[Any] | PoolConnectionProxy[Any],
    payment_id: str,
    request: resolution.Request,
    by: tuple[str, str],
    dead_lettered: DeadLettered | None,
    record: Record,
) -> Resolved:
    """resolve_order_recorded's work (shared/ops/operator_actions.py) on one connection;
    `by` is (actor, source) as the audit trail writes them; `record` writes the audit row in
    the resolution's transaction."""
    actor, source = by
    # Dead letters first, outside the lock (a DLQ is read under a lock of its own): a letter
    # that arrives after this read only counts as in flight, the safe side.
    dead: set[str] = set()
    note = None
    if dead_lettered is not None and any(
        e.where == "queued" for e in await resolution_sql.in_flight(conn, payment_id)
    ):
        try:
            dead = await dead_lettered()
        except (
            UnavailableError,
            UnreachableError,
            dlq_lock.DlqBusyError,
            dlq.MissingQueueError,
        ) as e:
            note = f"whether they are dead letters could not be read: {e}"
    async with conn.transaction():
        await parked_sql.lock_payments(conn, [payment_id])
        rows = await orders_sql.lock_orders(conn, [payment_id])
        if not rows:
            raise PaymentNotFoundError(f"no order is registered for payment {payment_id}")
        row = rows[0]
        waiting = [
            e
            for e in await resolution_sql.in_flight(conn, payment_id)
            if e.where == "parked" or not {e.event_id, message_id(e.event_id)} & dead
        ]
        if waiting:
            raise InFlightError(payment_id, waiting, note)
        state = OrderState.from_row(row)
        new, moved = resolution.plan(state, request, row["tx_now"])
        forced = resolution.is_forced(state.status, request.to)
        event_id = f"{resolution.OPERATOR_EVENT_PREFIX}{uuid.uuid4()}"
        await orders_sql.save_order_states(
            conn,
            [
                orders_sql.OrderStateRow(
                    payment_id,
                    new.status.value,
                    new.refunded_amount,
                    new.refunded_at,
                    sorted(new.refund_ids),
                    sorted(new.reversed_refund_ids),
                )
            ],
        )
        transition_id = await resolution_sql.add_operator_transition(
            conn,
            resolution_sql.OperatorTransition(
                payment_id,
                moved.from_status.value,
                moved.to_status.value,
                event_id,
                actor,
                forced,
                request.reason,
            ),
        )
        transition = OrderTransition(
            event=moved.name,
            payment_id=payment_id,
            order_id=row["order_id"],
            user_id=row["user_id"],
            from_status=moved.from_status.value,
            to_status=moved.to_status.value,
            source_event_id=event_id,
        )
        await outbox_sql.add_many_to_outbox(
            conn, [(transition.message_id, transition.event, transition.encode())]
        )
        await resolution_sql.clear_undecided(conn, payment_id)
        order = await orders_sql.order_for_payment(conn, payment_id)
        assert order is not None  # locked above, in this transaction
        resolved = Resolved(
            payment_id,
            transition.from_status,
            transition.to_status,
            forced,
            request.reason,
            actor,
            transition_id,
            event_id,
            order_json(order),
        )
        await record(conn, resolved)
    log.info(
        "order.resolved",
        payment_id=payment_id,
        from_status=transition.from_status,
        to_status=transition.to_status,
        forced=forced,
        actor=actor,
        source=source,
        transition_id=transition_id,
    )
    return resolved


def orders_dead_letters(
    channel: Callable[[], AbstractAsyncContextManager[AbstractChannel]],
    topology: Topology,
    payment_id: str,
) -> DeadLettered:
    """What resolve_order_recorded asks about dead letters: the ids (message and event) of
    the payment's messages in orders.dlq."""

    async def read() -> set[str]:
        async with channel() as opened:
            letters = await dlq.show(
                opened, dlq.dlq_name(topology, "orders"), lock_wait_s=dlq_lock.VIEW_LOCK_WAIT_S
            )
        return {i for d in letters if d.payment_id == payment_id for i in (d.id, d.event_id) if i}

    return read
