"""Stripe events for tests: the payloads in tests/fixtures/stripe/ (shaped after Stripe's API
reference), with the ids, amounts and times a test needs set on them."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import orjson

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stripe"


@cache
def _fixture(event_type: str) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads((FIXTURES / f"{event_type}.json").read_bytes())
    return loaded


def stripe_event(
    event_type: str,
    *,
    event_id: str | None = None,
    payment_id: str | None = None,
    created: int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The fixture of `event_type` (a copy), its `id`, PaymentIntent id, `created` and any of
    `data.object`'s fields replaced."""
    event = copy.deepcopy(_fixture(event_type))
    obj = event["data"]["object"]
    if event_id is not None:
        event["id"] = event_id
    if created is not None:
        event["created"] = created
    if payment_id is not None:
        if event_type.startswith("payment_intent."):
            obj["id"] = payment_id
        else:
            obj["payment_intent"] = payment_id
            for refund in (obj.get("refunds") or {}).get("data", []):
                refund["payment_intent"] = payment_id
    obj.update(fields)
    return event


def refund_entry(
    refund_id: str, amount: int, created: int, currency: str = "usd"
) -> dict[str, Any]:
    """One entry of a charge's `refunds.data`, as the charge.refunded fixture holds it."""
    listed = _fixture("charge.refunded")["data"]["object"]["refunds"]["data"]
    entry: dict[str, Any] = copy.deepcopy(listed[0])
    entry.update(id=refund_id, amount=amount, created=created, currency=currency)
    return entry


def refunds_list(*entries: dict[str, Any]) -> dict[str, Any]:
    """A charge's `refunds` list object holding `entries` (newest first, as Stripe lists)."""
    return {"object": "list", "data": list(entries), "has_more": False, "total_count": len(entries)}


def payment_intent(
    payment_id: str,
    status: str,
    *,
    amount: int = 10_000,
    currency: str = "usd",
    refunded: int | None = None,
    cancellation_reason: str | None = None,
    at: int = 1_723_123_450,
) -> dict[str, Any]:
    """`GET /v1/payment_intents/{id}?expand[]=latest_charge.refunds` as Stripe answers it: the
    PaymentIntent of the fixtures, in `status`, its latest charge (with `refunded` minor
    units refunded in one refund) expanded when it has one."""
    intent: dict[str, Any] = copy.deepcopy(_fixture("payment_intent.succeeded")["data"]["object"])
    intent.update(
        id=payment_id,
        status=status,
        amount=amount,
        currency=currency,
        created=at,
        amount_received=amount if status == "succeeded" else 0,
        latest_charge=None,
    )
    if status == "canceled":
        intent.update(canceled_at=at + 60, cancellation_reason=cancellation_reason)
    if status == "requires_payment_method":
        failed = _fixture("payment_intent.payment_failed")["data"]["object"]
        intent["last_payment_error"] = copy.deepcopy(failed["last_payment_error"])
    if status == "succeeded":
        charge = copy.deepcopy(_fixture("charge.refunded")["data"]["object"])
        refunds = [refund_entry(f"re_{payment_id}", refunded, at + 3600)] if refunded else []
        charge.update(
            payment_intent=payment_id,
            amount=amount,
            amount_captured=amount,
            amount_refunded=refunded or 0,
            refunded=refunded == amount,
            currency=currency,
            created=at + 1,
            refunds=refunds_list(*refunds),
        )
        intent["latest_charge"] = charge
    return intent
