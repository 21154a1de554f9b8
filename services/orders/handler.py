"""One provider event: lock the order, decide, write state + transitions + outbox, atomically.

A batch of events is applied in one transaction (shared/batches.py), in payment id order."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson
import structlog

from services.orders.outbox import OutboxRelay
from shared.batches import BatchHandler, Delivery, Step, in_one_transaction
from shared.errors import UnknownPaymentError
from shared.messages import OrderTransition
from shared.metrics import OrderMetrics
from shared.order_machine import REFUND_FAILURES, UNDECIDED, OrderState, decide
from shared.queries import orders as orders_sql
from shared.queries import outbox as outbox_sql
from shared.queries import processed as processed_sql
from shared.xhub.events import InvalidEventError, parse_event

log = structlog.get_logger(__name__)

WORKER = "orders"


def make_handler(
    pool: asyncpg.Pool[Any], relay: OutboxRelay, metrics: OrderMetrics
) -> BatchHandler:
    async def handle(step: Step, delivery: Delivery) -> str:
        try:
            payload = orjson.loads(delivery.body)
        except orjson.JSONDecodeError:
            raise InvalidEventError("body is not JSON") from None
        if not isinstance(payload, dict):
            raise InvalidEventError("body is not a JSON object")
        event = parse_event(payload)
        conn = step.conn
        row = await orders_sql.lock_order(conn, event.payment_id)
        if row is None:
            raise UnknownPaymentError(f"no order registered for payment {event.payment_id}")
        state = OrderState.from_row(row)
        decision = decide(state, event)
        if not await processed_sql.mark_processed(
            conn, WORKER, delivery.message_id, decision.reason
        ):
            return "skipped_duplicate"
        if decision.reason in UNDECIDED:  # the reconciler asks the provider at once (D11)
            await orders_sql.flag_undecided(conn, event.payment_id, decision.reason.value)
        elif event.checked_at is not None and decision.events:
            await orders_sql.clear_undecided(conn, event.payment_id, event.checked_at)
        if decision.new_state is not None:
            new = decision.new_state
            await orders_sql.save_order_state(
                conn,
                event.payment_id,
                new.status.value,
                new.refunded_amount,
                new.refunded_at,
                sorted(new.refund_ids),
                sorted(new.reversed_refund_ids),
            )
        for domain_event in decision.events:
            transition = OrderTransition(
                event=domain_event.name,
                payment_id=event.payment_id,
                order_id=row["order_id"],
                user_id=row["user_id"],
                from_status=domain_event.from_status.value,
                to_status=domain_event.to_status.value,
                source_event_id=delivery.message_id,
            )
            await orders_sql.add_transition(
                conn,
                event.payment_id,
                transition.from_status,
                transition.to_status,
                delivery.message_id,
            )
            await outbox_sql.add_to_outbox(
                conn, transition.message_id, transition.event, transition.encode()
            )

        def committed() -> None:
            if decision.reason in UNDECIDED:
                metrics.undecided.labels(reason=decision.reason.value).inc()
            if event.event_type in REFUND_FAILURES:
                metrics.refund_failures.labels(event=event.event_type).inc()
            attention = decision.reason in UNDECIDED or event.event_type in REFUND_FAILURES
            (log.warning if attention else log.info)(
                "order.decided",
                message_id=delivery.message_id,
                payment_id=event.payment_id,
                event_type=event.event_type,
                status=event.status,
                reason=decision.reason,
                refund_id=event.refund_id,
                from_status=state.status.value,
                to_status=(decision.new_state or state).status.value,
            )
            if decision.events:
                relay.notify()

        step.after_commit(committed)
        return "ok"

    return in_one_transaction(pool, handle, sort_key=payment_id_of)


def payment_id_of(delivery: Delivery) -> str:
    """The batch order: a provider event's payment id (the row its handling locks)."""
    return str(orjson.loads(delivery.body)["payment_id"])
