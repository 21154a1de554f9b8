"""Stripe's PaymentIntent (`GET /v1/payment_intents/{id}`, its latest charge and the charge's
refunds expanded) as the reconciler's ProviderPayment, read strictly: an answer we cannot use
is a ProviderResponseError, never a guess.

  succeeded, its latest charge refunded in full  refunded
  succeeded                                      paid (amount_received)
  canceled                                       expired (automatic, abandoned) or cancelled
  requires_payment_method after a failed attempt failed
  anything else (processing, requires_action, requires_capture, ...)  pending: no change

Stripe has no settlement status on a PaymentIntent (payouts are per balance, not per
payment), so the reconciler never says settled for Stripe (docs/providers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final
from urllib.parse import quote

import orjson

from shared.providers.base import ProviderPayment, ProviderResponseError
from shared.providers.stripe.events import EXPIRED_REASONS, major_units, minor_units

# Pinned so that the answer's shape does not follow the account's default API version (from
# 2022-11-15 a charge's refunds come only when expanded, as asked here).
API_VERSION: Final = "2024-06-20"
_EXPAND: Final = "expand%5B%5D=latest_charge.refunds"


def payment_path(payment_id: str) -> str:
    return f"/v1/payment_intents/{quote(payment_id, safe='')}?{_EXPAND}"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _moment(seconds: int | None) -> datetime | None:
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _refunds(charge: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    refunds = charge.get("refunds")
    listed = refunds.get("data") if isinstance(refunds, dict) else None
    return [r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else []


def parse_payment_intent(body: bytes, payment_id: str) -> ProviderPayment:
    def bad(why: str) -> ProviderResponseError:
        return ProviderResponseError(f"Stripe's answer for PaymentIntent {payment_id!r} {why}")

    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise bad("is not JSON") from None
    if not isinstance(data, dict) or data.get("object") != "payment_intent":
        raise bad("is not a PaymentIntent")
    if data.get("id") != payment_id:
        raise bad("names another payment")
    status, currency = data.get("status"), data.get("currency")
    if not isinstance(status, str) or not status:
        raise bad("has no usable status")
    if not isinstance(currency, str) or not currency.strip():
        raise bad("has no usable currency")
    amount, received = _int(data.get("amount")), _int(data.get("amount_received"))
    if amount is None or amount < 0 or (received is not None and received < 0):
        raise bad("has no usable amount")
    created = _moment(_int(data.get("created")))
    if created is None:
        raise bad("has no usable created")
    charge = data.get("latest_charge")
    charge = charge if isinstance(charge, dict) else {}

    canonical, minor, at = "pending", amount, created
    if status == "succeeded":
        minor = received if received is not None else amount
        at = _moment(_int(charge.get("created"))) or created
        if charge.get("refunded") is True:
            canonical = "refunded"
            times = [_int(r.get("created")) for r in _refunds(charge)]
            at = _moment(max((t for t in times if t is not None), default=None)) or at
        else:
            canonical = "paid"
    elif status == "canceled":
        reason = data.get("cancellation_reason")
        canonical = "expired" if reason in EXPIRED_REASONS else "cancelled"
        at = _moment(_int(data.get("canceled_at"))) or created
    elif status == "requires_payment_method" and isinstance(data.get("last_payment_error"), dict):
        canonical = "failed"
    return ProviderPayment(
        payment_id=payment_id,
        status=canonical,
        amount=Decimal(major_units(minor, currency)),
        currency=currency.upper(),
        updated_at=at,
    )


# The inverse, for the simulator's fake API: the route it serves and a ProviderPayment as
# the PaymentIntent (its latest charge and refunds expanded) parse_payment_intent reads back.
ROUTE: Final = "/v1/payment_intents/{payment_id}"


def answer(payment: ProviderPayment) -> bytes:
    """`payment` as Stripe answers `payment_path`: paid as succeeded, refunded as succeeded
    with its latest charge refunded in full (one refund), expired / cancelled as canceled
    (abandoned / requested_by_customer), failed as requires_payment_method after a failed
    attempt, anything else (Stripe has no settled) as processing: no change."""
    minor = minor_units(payment.amount, payment.currency)
    at = int(payment.updated_at.timestamp())
    status = payment.status
    intent: dict[str, Any] = {
        "id": payment.payment_id,
        "object": "payment_intent",
        "amount": minor,
        "amount_received": 0,
        "currency": payment.currency.lower(),
        "created": at,
        "status": "processing",
        "cancellation_reason": None,
        "canceled_at": None,
        "last_payment_error": None,
        "latest_charge": None,
        "livemode": False,
    }
    if status in ("paid", "refunded"):
        refunded = status == "refunded"
        refunds = (
            [
                {
                    "id": f"re_{payment.payment_id}",
                    "object": "refund",
                    "amount": minor,
                    "currency": payment.currency.lower(),
                    "created": at,
                    "payment_intent": payment.payment_id,
                    "status": "succeeded",
                }
            ]
            if refunded
            else []
        )
        intent.update(status="succeeded", amount_received=minor)
        intent["latest_charge"] = {
            "id": f"ch_{payment.payment_id}",
            "object": "charge",
            "amount": minor,
            "amount_captured": minor,
            "amount_refunded": minor if refunded else 0,
            "currency": payment.currency.lower(),
            "created": at,
            "payment_intent": payment.payment_id,
            "refunded": refunded,
            "refunds": {
                "object": "list",
                "data": refunds,
                "has_more": False,
                "total_count": len(refunds),
            },
        }
    elif status in ("expired", "cancelled"):
        reason = "abandoned" if status == "expired" else "requested_by_customer"
        intent.update(status="canceled", cancellation_reason=reason, canceled_at=at)
    elif status == "failed":
        intent.update(
            status="requires_payment_method",
            last_payment_error={"type": "card_error", "code": "card_declined"},
        )
    return orjson.dumps(intent)
