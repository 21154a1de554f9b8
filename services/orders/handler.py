"""Provider events: lock the orders, decide, write state + transitions + outbox, atomically;
an event for a payment without an order is parked (shared/queries/parked.py).

A batch of events is applied in one transaction (shared/worker/batches.py), in payment id order,
with a constant number of statements, processed marks included."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import asyncpg
import orjson
import structlog

from services.orders.outbox import OutboxRelay
from shared import tracing
from shared.db import Executor
from shared.messages import OrderTransition, checked_at_of
from shared.metrics import OrderMetrics
from shared.order_machine import REFUND_FAILURES, UNDECIDED, OrderState, decide
from shared.providers.xhub.events import InvalidEventError, parse_event
from shared.queries import orders as orders_sql
from shared.queries import outbox as outbox_sql
from shared.queries import parked as parked_sql
from shared.worker.batches import BatchHandler, Delivery, Result, Step, apply_set_batch

log = structlog.get_logger(__name__)

WORKER = "orders"


@dataclass(frozen=True, slots=True)
class _Writes:
    """What one event changes, written for the whole batch at its end."""

    payment_id: str
    state: OrderState | None
    transitions: list[orders_sql.TransitionRow]
    outbox: list[tuple[str, str, bytes]]
    # What the event passes on to its outbox messages (shared/tracing.py CARRIED).
    carried: dict[str, str]


class _Batch:
    """One attempt at a batch: its orders locked and read in one statement first, each event
    decided against the state the batch's earlier events left, every state, transition and
    outbox message written in one statement each at the end (and every processed mark, the
    constraint that makes a redelivery a no-op, by apply_batch)."""

    def __init__(self, relay: OutboxRelay, metrics: OrderMetrics) -> None:
        self._relay = relay
        self._metrics = metrics
        self._rows: dict[str, asyncpg.Record] = {}
        self._states: dict[str, OrderState] = {}

    async def start(self, conn: Executor, payment_ids: list[str]) -> None:
        # The payments' park locks first, as order registration takes them: an order this
        # read does not see is registered after this batch commits, and that registration
        # releases what the batch parks (shared/queries/parked.py).
        await parked_sql.lock_payments(conn, payment_ids)
        rows = await orders_sql.lock_orders(conn, payment_ids)
        self._rows = {r["payment_id"]: r for r in rows}
        self._states = {r["payment_id"]: OrderState.from_row(r) for r in rows}

    async def handle(self, step: Step, delivery: Delivery) -> str:
        try:
            payload = orjson.loads(delivery.body)
        except orjson.JSONDecodeError:
            raise InvalidEventError("body is not JSON") from None
        if not isinstance(payload, dict):
            raise InvalidEventError("body is not a JSON object")
        event = parse_event(payload, checked_at=checked_at_of(delivery.headers))
        conn = step.conn
        row = self._rows.get(event.payment_id)
        if row is None:
            return await self._park(step, delivery, event.payment_id, event.event_type)
        state = self._states[event.payment_id]
        decision = decide(state, event)
        step.outcome = decision.reason
        if decision.reason in UNDECIDED:  # the reconciler asks the provider at once (D11)
            await orders_sql.flag_undecided(conn, event.payment_id, decision.reason.value)
        elif event.checked_at is not None and decision.events:
            await orders_sql.clear_undecided(conn, event.payment_id, event.checked_at)
        writes = _Writes(
            event.payment_id, decision.new_state, [], [], tracing.carried(delivery.headers)
        )
        if decision.new_state is not None:
            # As saved: updated_at becomes the transaction's now().
            self._states[event.payment_id] = replace(decision.new_state, changed_at=row["tx_now"])
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
            writes.transitions.append(
                orders_sql.TransitionRow(
                    event.payment_id,
                    transition.from_status,
                    transition.to_status,
                    delivery.message_id,
                )
            )
            writes.outbox.append((transition.message_id, transition.event, transition.encode()))
        step.value = writes

        def committed() -> None:
            if decision.reason in UNDECIDED:
                self._metrics.undecided.labels(reason=decision.reason.value).inc()
            if event.event_type in REFUND_FAILURES:
                self._metrics.refund_failures.labels(event=event.event_type).inc()
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
            if writes.outbox:
                self._relay.committed(writes.outbox, [writes.carried] * len(writes.outbox))

        step.after_commit(committed)
        return "ok"

    async def _park(self, step: Step, delivery: Delivery, payment_id: str, event_type: str) -> str:
        """No order for the payment (yet): the event waits in parked_events, acked with the
        commit, until the order's registration releases it or its park runs out. No processed
        mark: the released copy is the one that takes effect."""
        provider = delivery.headers.get("provider")
        parked = await parked_sql.park(
            step.conn,
            parked_sql.ParkedEvent(
                event_id=delivery.message_id,
                provider=provider if isinstance(provider, str) else None,
                payment_id=payment_id,
                event_type=event_type,
                routing_key=delivery.routing_key,
                body=delivery.body,
                headers=stored_headers(delivery.headers),
            ),
        )
        step.marked = False
        step.outcome = "parked"

        def committed() -> None:
            log.info(
                "order.parked" if parked else "order.parked_already",
                message_id=delivery.message_id,
                payment_id=payment_id,
                event_type=event_type,
            )

        step.after_commit(committed)
        return "parked"

    async def write(self, conn: Executor, steps: list[Step]) -> dict[int, Exception]:
        """The committed steps' writes: each order's last state, every transition and
        outbox message in the order decided."""
        writes = [step.value for step in steps if isinstance(step.value, _Writes)]
        states = {w.payment_id: w.state for w in writes if w.state is not None}
        if states:
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
                    for payment_id, new in states.items()
                ],
            )
        if transitions := [t for w in writes for t in w.transitions]:
            await orders_sql.add_transitions(conn, transitions)
        if outbox := [m for w in writes for m in w.outbox]:
            carried = [w.carried for w in writes for _ in w.outbox]
            await outbox_sql.add_many_to_outbox(conn, outbox, carried)
        return {}


def make_handler(
    pool: asyncpg.Pool[Any], relay: OutboxRelay, metrics: OrderMetrics
) -> BatchHandler:
    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        return await apply_set_batch(
            pool, deliveries, _Batch(relay, metrics), payment_id_of, marks=WORKER
        )

    return run


def stored_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A message's headers as JSON, to publish again later: ours, not RabbitMQ's (x-*)."""
    return {k: _json_value(v) for k, v in headers.items() if not k.startswith("x-")}


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)  # a Decimal, say


def payment_id_of(delivery: Delivery) -> str:
    """The batch order: a provider event's payment id (the row its handling locks)."""
    return str(orjson.loads(delivery.body)["payment_id"])
