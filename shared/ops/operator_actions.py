"""Operator actions, each done and recorded in the audit trail by one function: the api, the
console and the CLI only parse their input and render the answer, so no edge can act unaudited."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
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
from shared.ops.dlq_moves import Progress, Selection, purge, requeue
from shared.ops.order_input import order_json
from shared.order_machine import OrderState
from shared.queries import audit
from shared.queries import orders as orders_sql
from shared.queries import outbox as outbox_sql
from shared.queries import parked as parked_sql
from shared.queries import resolution as resolution_sql
from shared.queries.orders import NewOrder
from shared.queries.resolution import InFlight

log = structlog.get_logger(__name__)

# Where the audit row goes: a pool or connection at hand, or one to open after the action
# (the CLI's: a database that cannot be reached then is logged, the action stands).
Trail: TypeAlias = "Executor | Callable[[], AbstractAsyncContextManager[Executor]]"


class Edge(StrEnum):
    """Through which the operator acted: the audit trail's `source`."""

    API = "api"
    CONSOLE = "console"
    CLI = "cli"


@dataclass(frozen=True, slots=True)
class Operator:
    name: str  # a token's name, or `cli:` and the OS user
    edge: Edge


async def _record(trail: Trail, action: audit.Action) -> None:
    if not callable(trail):
        await audit.record(trail, action)
        return
    try:
        async with trail() as conn:
            await audit.record(conn, action)
    except UnreachableError as e:
        audit.not_recorded(action, e)


@dataclass(frozen=True, slots=True)
class Requeued:
    """What a requeue moved (or a dry run would move), and the ids it did not find."""

    ids: list[str]
    not_found: list[str]
    dry_run: bool

    def as_json(self) -> dict[str, Any]:
        """The one answer of every edge (SPEC section 7, with the api's dry-run fields)."""
        return {
            "requeued": 0 if self.dry_run else len(self.ids),
            "would_requeue": len(self.ids) if self.dry_run else None,
            "dry_run": self.dry_run,
            "ids": self.ids,
            "not_found": self.not_found,
        }


async def requeue_recorded(
    channel: AbstractChannel,
    queue: str,
    selection: Selection,
    by: Operator,
    trail: Trail,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> tuple[Requeued, list[dlq.DeadLetter]]:
    """Requeue from the DLQ `queue` (its full name) and record it; a dry run is no action.
    Also returns the letters themselves, for the edges that list them."""
    result = await requeue(
        channel, queue, selection, limit=limit, dry_run=dry_run, progress=progress
    )
    ids = [letter.id for letter in result.requeued]
    if not dry_run:
        what = selection.as_json() | ({} if limit is None else {"limit": limit})
        await _record(
            trail, audit.Action(by.name, by.edge.value, audit.REQUEUE, queue, ids, len(ids), what)
        )
    return Requeued(ids, result.not_found, dry_run), result.requeued


@dataclass(frozen=True, slots=True)
class Purged:
    messages: list[dlq.DeadLetter]

    def as_json(self) -> dict[str, Any]:
        return {"purged": len(self.messages), "messages": [d.as_json() for d in self.messages]}


async def purge_recorded(
    channel: AbstractChannel,
    queue: str,
    by: Operator,
    trail: Trail,
    *,
    progress: Progress | None = None,
) -> Purged:
    """Delete every message now in the DLQ `queue` and record it."""
    removed = await purge(channel, queue, progress=progress)
    ids = [d.id for d in removed]
    await _record(trail, audit.Action(by.name, by.edge.value, audit.PURGE, queue, ids, len(ids)))
    return Purged(removed)


@dataclass(frozen=True, slots=True)
class Registered:
    order: dict[str, Any]  # as the api shows it
    created: bool  # False: the same order was already registered

    def as_json(self) -> dict[str, Any]:
        return self.order


async def register_order_recorded(db: Executor, order: NewOrder, by: Operator) -> Registered:
    """Register the order (idempotent on its id) and record it when it is new;
    orders_sql.OrderConflictError if its id or payment id is another order's."""
    row, created = await orders_sql.register_order(db, order)
    if created:
        registered = audit.Action(
            by.name, by.edge.value, audit.ORDER_REGISTER, order.order_id, [order.payment_id], 1
        )
        await _record(db, registered)
    return Registered(order_json(row), created)


async def dead_letters_or_reason(
    channel: Callable[[], AbstractAsyncContextManager[AbstractChannel]],
    topology: Topology,
    payment_id: str,
) -> tuple[list[dlq.DeadLetter], str | None]:
    """A payment's dead letters, or none and why they could not be read: the database holds
    most of a payment's story, so a view gives it and says what is missing."""
    try:
        async with channel() as opened:
            letters = await dlq.dead_letters_for_payment(
                opened, topology, payment_id, lock_wait_s=dlq_lock.VIEW_LOCK_WAIT_S
            )
    except (UnavailableError, UnreachableError, dlq_lock.DlqBusyError, dlq.MissingQueueError) as e:
        return [], str(e)
    return letters, None


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


async def resolve_order_recorded(
    db: Executor,
    payment_id: str,
    request: resolution.Request,
    by: Operator,
    dead_lettered: DeadLettered | None = None,
) -> Resolved:
    """Move the payment's order to `request.to` as the operator's transition, with its audit
    row, in one transaction under the payment's lock (the one the orders worker takes, so a
    provider event and a resolve never interleave). The transition goes out through the
    outbox as any `order.*` one does, so the ledger and the emails follow it exactly as they
    follow a provider's. Raises PaymentNotFoundError, InFlightError (an event of the payment
    is parked, or stored and not yet processed by the orders worker; one in orders.dlq, as
    `dead_lettered` tells, is not on its way), or resolution.ResolveRefusedError."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            return await _resolve(conn, payment_id, request, by, dead_lettered)
    return await _resolve(db, payment_id, request, by, dead_lettered)


async def _resolve(
    conn: asyncpg.Connection[Any] | PoolConnectionProxy[Any],
    payment_id: str,
    request: resolution.Request,
    by: Operator,
    dead_lettered: DeadLettered | None,
) -> Resolved:
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
                by.name,
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
        detail = {
            "from": transition.from_status,
            "to": transition.to_status,
            "forced": forced,
            "reason": request.reason,
        }
        await audit.record_in_transaction(
            conn,
            audit.Action(
                by.name, by.edge.value, audit.ORDER_RESOLVE, payment_id, [event_id], 1, detail
            ),
        )
        order = await orders_sql.order_for_payment(conn, payment_id)
    log.info(
        "order.resolved",
        payment_id=payment_id,
        from_status=transition.from_status,
        to_status=transition.to_status,
        forced=forced,
        actor=by.name,
        source=by.edge.value,
        transition_id=transition_id,
    )
    assert order is not None  # locked above, in this transaction
    return Resolved(
        payment_id,
        transition.from_status,
        transition.to_status,
        forced,
        request.reason,
        by.name,
        transition_id,
        event_id,
        order_json(order),
    )


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
