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


# The inverse: a canonical event as the Stripe event payhooks maps back onto it (the
# simulator's and `payhooks send`'s, never ingest's). Stripe has no settlement event: a
# canonical `settled` has no Stripe form (ValueError), and the simulator never asks for one
# (`Provider.has_settlement`).
API_VERSION_SENT: Final = "2024-06-20"
_INTENT_EVENTS: Final[dict[str, tuple[str, str]]] = {
    # canonical status -> (Stripe type, PaymentIntent status)
    "paid": ("payment_intent.succeeded", "succeeded"),
    "failed": ("payment_intent.payment_failed", "requires_payment_method"),
    "expired": ("payment_intent.canceled", "canceled"),
    "cancelled": ("payment_intent.canceled", "canceled"),
}


def minor_units(amount: Any, currency: str) -> int:
    """payhooks' decimal string as Stripe's integer amount: "10.50" USD -> 1050, "1050" JPY ->
    1050; ValueError for an amount the currency's exponent cannot hold exactly."""
    minor = Decimal(str(amount)).scaleb(exponent(currency))
    if minor != minor.to_integral_value() or minor < 0:
        raise ValueError(f"{amount!r} {currency} is no whole number of minor units")
    return int(minor)


def _seconds(created_at: Any) -> int:
    if not isinstance(created_at, str):
        raise ValueError("the canonical event needs a created_at")
    return int(datetime.fromisoformat(created_at).timestamp())


def to_stripe(event_id: str, event: Mapping[str, Any]) -> dict[str, Any]:
    """A canonical event (X-Hub's body shape) as the Stripe event `canonical` maps back onto
    it: payment.status_changed paid / failed / expired / cancelled as payment_intent.*,
    refunded as charge.refunded in full (no refunds list: a full refund), refund.completed
    and refund.failed as refund.updated / refund.failed; ValueError for anything else
    (settled above all: Stripe has none)."""
    kind, status = event.get("event"), event.get("status")
    payment_id = event.get("payment_id")
    currency = str(event.get("currency") or "USD")
    minor = minor_units(event.get("amount", "0"), currency)
    created = _seconds(event.get("created_at"))
    metadata = {"order_id": event["external_id"]} if "external_id" in event else {}
    common: dict[str, Any] = {
        "amount": minor,
        "currency": currency.lower(),
        "created": created,
        "livemode": False,
        "metadata": metadata,
    }
    obj: dict[str, Any]
    if kind == STATUS_CHANGED and isinstance(status, str) and status in _INTENT_EVENTS:
        stripe_type, intent_status = _INTENT_EVENTS[status]
        obj = {
            "id": payment_id,
            "object": "payment_intent",
            **common,
            "amount_received": minor if status == "paid" else 0,
            "status": intent_status,
            "cancellation_reason": None,
            "canceled_at": None,
            "last_payment_error": None,
        }
        if stripe_type == "payment_intent.canceled":
            obj["canceled_at"] = created
            obj["cancellation_reason"] = (
                "abandoned" if status == "expired" else "requested_by_customer"
            )
        if status == "failed":
            obj["last_payment_error"] = {
                "type": "card_error",
                "code": "card_declined",
                "decline_code": "generic_decline",
                "message": "Your card was declined.",
            }
    elif kind == STATUS_CHANGED and status == "refunded":
        stripe_type = "charge.refunded"
        obj = {
            "id": f"ch_{payment_id}",
            "object": "charge",
            **common,
            "amount_captured": minor,
            "amount_refunded": minor,
            "captured": True,
            "paid": True,
            "payment_intent": payment_id,
            "refunded": True,
            "status": "succeeded",
        }
    elif kind in (REFUND_COMPLETED, REFUND_FAILED):
        failed = kind == REFUND_FAILED
        stripe_type = "refund.failed" if failed else "refund.updated"
        obj = {
            "id": event.get("refund_id"),
            "object": "refund",
            **common,
            "charge": f"ch_{payment_id}",
            "payment_intent": payment_id,
            "status": "failed" if failed else "succeeded",
            "failure_reason": "unknown" if failed else None,
        }
    else:
        raise ValueError(f"Stripe sends no event for {kind} {status!r}")
    return {
        "id": event_id,
        "object": "event",
        "api_version": API_VERSION_SENT,
        "created": created,
        "data": {"object": obj},
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "type": stripe_type,
    }


def encode(event_id: str, event: Mapping[str, Any]) -> bytes:
    """`to_stripe` as the body Stripe posts (the event id, `evt_...`, is the body's `id`)."""
    return orjson.dumps(to_stripe(event_id, event))
