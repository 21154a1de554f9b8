"""The support view of one payment: what came in, what changed, what it caused, what died."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from shared.db import Executor
from shared.ops.dlq import DeadLetter
from shared.ops.inbox_view import webhook_json
from shared.ops.order_input import order_json
from shared.providers.registry import message_of
from shared.queries import emails as emails_sql
from shared.queries import inbox as inbox_sql
from shared.queries import ledger as ledger_sql
from shared.queries import orders as orders_sql
from shared.queries import parked as parked_sql

REFUND_FAILURE_EVENTS = frozenset({"refund.failed", "refund.rejected"})


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


async def payment_view(
    conn: Executor, payment_id: str, dead_letters: Sequence[DeadLetter]
) -> dict[str, Any] | None:
    """Everything payhooks knows about a payment; None if it has never heard of it."""
    order = await orders_sql.order_for_payment(conn, payment_id)
    webhooks = await inbox_sql.webhooks_for_payment(conn, payment_id)
    parked = await parked_sql.for_payment(conn, payment_id)
    if order is None and not webhooks and not parked:
        return None
    dead = {d.event_id: d for d in dead_letters if d.payment_id == payment_id}
    events, refund_failures = [], []
    for row in webhooks:
        # As the workers saw it: the canonical event, under its message id (docs/providers.md).
        message_id, canonical = message_of(row["provider"], row["event_id"], row["body"])
        try:
            body = orjson.loads(canonical)
            status, refund_id = body.get("status"), body.get("refund_id")
        except (orjson.JSONDecodeError, AttributeError):
            status = refund_id = None
        if row["event_type"] in REFUND_FAILURE_EVENTS:  # money that did not go back: the
            refund_failures.append(  # merchant must know (seed 000)
                {
                    "event_id": row["event_id"],
                    "event": row["event_type"],
                    "refund_id": refund_id,
                    "received_at": _iso(row["received_at"]),
                }
            )
        # Besides what every view says about a webhook, the payment's status it reports.
        events.append({**webhook_json(row, dead.get(message_id)), "status": status})
    undecided = None
    if order is not None and order["undecided_since"] is not None:
        undecided = {"reason": order["undecided_reason"], "since": _iso(order["undecided_since"])}
    return {
        "order": order_json(order) if order is not None else None,
        # An event the state machine could not decide; the reconciler is asking the provider.
        "undecided": undecided,
        "events": events,
        "refund_failures": refund_failures,
        "transitions": [
            {
                "id": r["id"],
                "from": r["from_status"],
                "to": r["to_status"],
                "event_id": r["event_id"],
                "at": _iso(r["at"]),
                # Who moved the order: an event (a provider's, the reconciler's) or an
                # operator's resolution (actor, reason; forced: a move the machine forbids).
                "source": r["source"],
                "actor": r["actor"],
                "forced": r["forced"],
                "reason": r["reason"],
            }
            for r in await orders_sql.transitions_for_payment(conn, payment_id)
        ],
        "bonus": [
            {
                "kind": r["kind"],
                "points": r["points"],
                "user_id": r["user_id"],
                "event_id": r["event_id"],
                "transition_id": r["transition_id"],
                "created_at": _iso(r["created_at"]),
            }
            for r in await ledger_sql.ledger_for_payment(conn, payment_id)
        ],
        "emails": [
            {
                "template": r["template"],
                "message_id": r["message_id"],
                "recipient": r["recipient"],
                "sent_at": _iso(r["sent_at"]),
                "skipped": r["skipped"],
                "skip_reason": r["skip_reason"],  # after_refund, erased (migration 020)
            }
            for r in await emails_sql.emails_for_payment(conn, payment_id)
        ],
        # Events that came before the order (SPEC section 5): waiting, released by the order's
        # registration, or dead-lettered when their park ran out.
        "parked": [
            {
                "event_id": r["event_id"],
                "event": r["event_type"],
                "state": _parked_state(r),
                "parked_at": _iso(r["parked_at"]),
                "released_at": _iso(r["released_at"]),
                "dead_lettered_at": _iso(r["dead_lettered_at"]),
            }
            for r in parked
        ],
        "dead_letters": [d.as_json() for d in dead_letters if d.payment_id == payment_id],
    }


def _parked_state(row: Any) -> str:
    if row["released_at"] is not None:
        return "released"
    return "dead_lettered" if row["dead_lettered_at"] is not None else "parked"


async def user_bonus(conn: Executor, user_id: str) -> dict[str, Any]:
    entries = await ledger_sql.ledger_for_user(conn, user_id)
    return {
        "user_id": user_id,
        "balance": sum(r["points"] for r in entries),
        "entries": [
            {
                "payment_id": r["payment_id"],
                "kind": r["kind"],
                "points": r["points"],
                "created_at": _iso(r["created_at"]),
            }
            for r in entries
        ],
    }
