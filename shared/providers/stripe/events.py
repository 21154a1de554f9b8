"""Stripe events (https://docs.stripe.com/api/events/object) as payhooks' canonical events
(X-Hub's body shape, SPEC section 3). Stripe's `type` is mapped onto a canonical event type,
which is the routing key; a type payhooks has no canonical event for (disputes, any other)
is kept as `stripe.` + Stripe's type, which no worker binds (`stripe.refund.created` can never
be taken for payhooks' `refund.*`): stored, unrouted, visible (docs/providers.md).

  payment_intent.succeeded        payment.status_changed paid (amount_received)
  payment_intent.payment_failed   payment.status_changed failed
  payment_intent.canceled         payment.status_changed expired (cancellation_reason
                                  automatic/abandoned) or cancelled (any other reason)
  charge.refunded                 refund.completed, the charge's latest refund (its id and
                                  amount); without the refunds list (API versions from
                                  2022-11-15), a full refund (`refunded: true`) is
                                  payment.status_changed refunded, a partial one unmapped
  refund.created, refund.updated  refund.completed when the refund succeeded (its id and
                                  amount: partial refunds on any API version)
  charge.refund.updated, refund.updated, refund.failed
                                  refund.failed when the refund failed
  anything else                   stripe.<type>, unrouted

The payment id is the PaymentIntent's (`data.object.id` for payment_intent.*, the object's
`payment_intent` for charges, refunds and disputes); money goes from Stripe's minor units to
a decimal string by the currency's exponent (zero-decimal currencies such as JPY have none)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

import orjson

from shared.providers.base import Headline, MalformedWebhookError
from shared.providers.stripe import LIVEMODE_VARIABLE

UNMAPPED_PREFIX: Final = "stripe."
STATUS_CHANGED: Final = "payment.status_changed"
REFUND_COMPLETED: Final = "refund.completed"
REFUND_FAILED: Final = "refund.failed"

# https://docs.stripe.com/currencies#zero-decimal
ZERO_DECIMAL: Final = frozenset(
    {
        "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA",
        "PYG", "RWF", "UGX", "VND", "VUV", "XAF", "XOF", "XPF",
    }
)  # fmt: skip
# https://docs.stripe.com/currencies#three-decimal
THREE_DECIMAL: Final = frozenset({"BHD", "JOD", "KWD", "OMR", "TND"})
# Cancelled by Stripe itself, not by anyone's decision: the payment expired.
EXPIRED_REASONS: Final = frozenset({"automatic", "abandoned"})
# Events whose object is a Refund.
REFUND_EVENTS: Final = frozenset(
    {"charge.refund.updated", "refund.created", "refund.updated", "refund.failed"}
)


def exponent(currency: str) -> int:
    """Digits after the decimal point in Stripe's minor units of `currency`."""
    code = currency.upper()
    return 0 if code in ZERO_DECIMAL else 3 if code in THREE_DECIMAL else 2


def major_units(minor: int, currency: str) -> str:
    """Stripe's integer amount as payhooks' decimal string: 1050 USD -> "10.50",
    1050 JPY -> "1050", 1050 KWD -> "1.050"."""
    places = exponent(currency)
    return format(Decimal(minor).scaleb(-places), f".{places}f")


def _object(payload: Mapping[str, Any]) -> dict[str, Any]:
    data = payload.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    if not isinstance(obj, dict):
        raise MalformedWebhookError('body has no "data.object"')
    return obj


def _payment_id(event_type: str, obj: Mapping[str, Any]) -> Any:
    if event_type.startswith("payment_intent."):
        return obj.get("id")
    return obj.get("payment_intent")  # charges, refunds, disputes


def _latest_refund(charge: Mapping[str, Any]) -> dict[str, Any] | None:
    refunds = charge.get("refunds")
    listed = refunds.get("data") if isinstance(refunds, dict) else None
    if not isinstance(listed, list):
        return None
    found = [r for r in listed if isinstance(r, dict) and isinstance(r.get("id"), str)]
    if not found:
        return None
    # Stripe lists the newest first; `created` decides when both are given.
    return max(found, key=_created)


def _created(obj: Mapping[str, Any]) -> int:
    created = obj.get("created")
    return created if isinstance(created, int) and not isinstance(created, bool) else 0


def canonical_type(event_type: str, obj: Mapping[str, Any]) -> str:
    """The canonical event type (the routing key) of a Stripe event: `stripe.` + Stripe's
    own for one payhooks does not apply."""
    if event_type in (
        "payment_intent.succeeded",
        "payment_intent.payment_failed",
        "payment_intent.canceled",
    ):
        return STATUS_CHANGED
    if event_type == "charge.refunded":
        if _latest_refund(obj) is not None:
            return REFUND_COMPLETED
        if obj.get("refunded") is True:
            return STATUS_CHANGED
    if event_type in REFUND_EVENTS:
        status = obj.get("status")
        if status == "failed":
            return REFUND_FAILED
        if status == "succeeded" and event_type in ("refund.created", "refund.updated"):
            return REFUND_COMPLETED
    return unmapped(event_type)


def unmapped(event_type: str) -> str:
    """The routing key of a Stripe event payhooks does not apply."""
    return UNMAPPED_PREFIX + event_type


def headline(payload: Mapping[str, Any]) -> Headline:
    event_type = payload.get("type")
    if not isinstance(event_type, str) or not event_type.strip():
        raise MalformedWebhookError('body has no "type"')
    event_id = payload.get("id")
    if not isinstance(event_id, str) or not event_id.strip():
        raise MalformedWebhookError('body has no "id"')
    obj = _object(payload)
    return Headline(canonical_type(event_type, obj), _payment_id(event_type, obj), event_id)


MODES: Final = ("live", "test", "any")


def parse_mode(raw: str) -> str:
    """STRIPE_LIVEMODE: live, test or any."""
    mode = raw.strip().lower()
    if mode not in MODES:
        raise ValueError("must be live, test or any")
    return mode


def screen(payload: Mapping[str, Any], head: Headline, options: Mapping[str, str]) -> Headline:
    """An event of the mode this deployment does not apply (STRIPE_LIVEMODE=live and a
    test-mode event, or the reverse; a `livemode` that is no boolean is neither) is kept
    under `stripe.` + Stripe's type: stored, unrouted, applied by no worker."""
    mode = options.get(LIVEMODE_VARIABLE, "any")
    if mode == "any" or payload.get("livemode") is (mode == "live"):
        return head
    return Headline(unmapped(str(payload.get("type"))), head.payment_id, head.event_id)


def _created_at(payload: Mapping[str, Any]) -> str | None:
    created = payload.get("created")
    if isinstance(created, bool) or not isinstance(created, int):
        return None
    try:
        return datetime.fromtimestamp(created, UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return None


def _money(amount: Any, currency: Any) -> dict[str, str]:
    """`amount` and `currency` as the canonical event has them, or nothing (the orders worker
    then refuses a money event without them, into a DLQ where an operator sees it)."""
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        return {}
    if not isinstance(currency, str) or not currency.strip():
        return {}
    return {"amount": major_units(amount, currency), "currency": currency.upper()}


def canonical(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A Stripe event (verified, well-formed) as payhooks' canonical event."""
    event_type = str(payload.get("type"))
    obj = _object(payload)
    kind = canonical_type(event_type, obj)
    event: dict[str, Any] = {"event": kind, "payment_id": _payment_id(event_type, obj)}
    if (created_at := _created_at(payload)) is not None:
        event["created_at"] = created_at
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("order_id"), str):
        event["external_id"] = metadata["order_id"]
    if event_type == "payment_intent.succeeded":
        event["status"] = "paid"
        event.update(_money(obj.get("amount_received"), obj.get("currency")))
    elif event_type == "payment_intent.payment_failed":
        event["status"] = "failed"
    elif event_type == "payment_intent.canceled":
        reason = obj.get("cancellation_reason")
        event["status"] = "expired" if reason in EXPIRED_REASONS else "cancelled"
    elif kind == REFUND_COMPLETED:
        refund = obj if event_type in REFUND_EVENTS else _latest_refund(obj) or {}
        event["refund_id"] = refund.get("id")
        event.update(_money(refund.get("amount"), refund.get("currency", obj.get("currency"))))
    elif kind == STATUS_CHANGED:  # charge.refunded in full, without its refunds list
        event["status"] = "refunded"
        event.update(_money(obj.get("amount_refunded"), obj.get("currency")))
    elif kind == REFUND_FAILED:
        event["refund_id"] = obj.get("id")
        event.update(_money(obj.get("amount"), obj.get("currency")))
    event["stripe_type"] = event_type
    return event


def canonical_body(body: bytes) -> bytes:
    """A stored (hence verified and well-formed) body as the message body the workers read.
    A body that is somehow not a Stripe event is passed on as it is: the orders worker
    dead-letters what it cannot read, where an operator sees it."""
    try:
        payload = orjson.loads(body)
        if not isinstance(payload, dict):
            return body
        return orjson.dumps(canonical(payload))
    except (orjson.JSONDecodeError, MalformedWebhookError):
        return body
