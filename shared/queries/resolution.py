"""An operator's resolution of an order: the provider events of a payment still on their way
to the orders worker, and the operator's transition."""

from __future__ import annotations

from dataclasses import dataclass

from shared.amqp.topology import message_id
from shared.db import Executor
from shared.queries.processed import processed_of

ORDERS_WORKER = "orders"
# The inbox's events the orders queue consumes (shared/amqp/topology.py BINDINGS["orders"]:
# payment.status_changed, refund.*); tests/unit/test_resolution.py holds the two together.
ORDERS_EVENTS_SQL = r"(event_type = 'payment.status_changed' OR event_type ~ '^refund\.[^.]+$')"


@dataclass(frozen=True, slots=True)
class InFlight:
    event_id: str
    event_type: str
    where: str  # "parked" or "queued" (stored, not yet processed by the orders worker)

    def as_json(self) -> dict[str, str]:
        return {"event_id": self.event_id, "event": self.event_type, "where": self.where}


async def in_flight(conn: Executor, payment_id: str) -> list[InFlight]:
    """The payment's provider events the orders worker has yet to take: parked (waiting for
    the order, or released and not yet processed) or stored in the inbox with no processed
    mark of the orders worker. Dead letters are among the latter; the caller tells them."""
    parked = await conn.fetch(
        "SELECT event_id, event_type FROM parked_events WHERE payment_id = $1"
        " AND released_at IS NULL AND dead_lettered_at IS NULL ORDER BY id",
        payment_id,
    )
    stored = await conn.fetch(
        "SELECT event_id, event_type FROM inbox WHERE payment_id = $1"
        f" AND {ORDERS_EVENTS_SQL} ORDER BY received_at, id",
        payment_id,
    )
    waiting = [InFlight(r["event_id"], r["event_type"], "parked") for r in parked]
    seen = {w.event_id for w in waiting}
    ids = {message_id(r["event_id"]): r for r in stored if r["event_id"] not in seen}
    done = await processed_of(conn, ORDERS_WORKER, list(ids)) if ids else set()
    waiting.extend(
        InFlight(r["event_id"], r["event_type"], "queued")
        for mid, r in ids.items()
        if mid not in done
    )
    return waiting


@dataclass(frozen=True, slots=True)
class OperatorTransition:
    payment_id: str
    from_status: str
    to_status: str
    event_id: str
    actor: str
    forced: bool
    reason: str


async def add_operator_transition(conn: Executor, t: OperatorTransition) -> int:
    """The operator's transition (its id, to which the ledger ties its entry)."""
    return int(
        await conn.fetchval(
            "INSERT INTO order_transitions"
            " (payment_id, from_status, to_status, event_id, source, actor, forced, reason)"
            " VALUES ($1, $2, $3, $4, 'operator', $5, $6, $7) RETURNING id",
            t.payment_id,
            t.from_status,
            t.to_status,
            t.event_id,
            t.actor,
            t.forced,
            t.reason,
        )
    )


async def clear_undecided(conn: Executor, payment_id: str) -> None:
    """The operator decided the order: it is no longer undecided (and due for the reconciler
    RECONCILE_AFTER from now, as any changed order)."""
    await conn.execute(
        "UPDATE orders SET undecided_since = NULL, undecided_at = NULL,"
        " undecided_reason = NULL, next_check_at = NULL WHERE payment_id = $1",
        payment_id,
    )
