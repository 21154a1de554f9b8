"""Stripe deliveries through ingest's own checks (services/ingest/webhook.py with the
registry's STRIPE), signed by the official `stripe` package from PyPI, and Stripe's events
(tests/fixtures/stripe/) mapped onto payhooks' canonical ones."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson
import pytest
import stripe

from services.ingest.webhook import (
    MalformedWebhookError,
    RejectedWebhookError,
    Webhook,
    authenticate,
    parse_body,
    read_headers,
)
from shared.amqp.topology import is_routed
from shared.order_machine import STATUS_TARGETS
from shared.providers.registry import BY_NAME, message_of
from shared.providers.stripe import SIGNATURE_HEADER
from shared.providers.stripe.adapter import STRIPE
from shared.providers.stripe.events import canonical, canonical_body, major_units
from shared.providers.stripe.signatures import parse_secrets, signed_headers
from shared.providers.xhub.events import parse_event
from shared.vocabulary import OrderStatus
from tests.stripe_events import refund_entry, refunds_list, stripe_event

SECRET = "whsec_test_current0123456789abcdef"
OLD_SECRET = "whsec_test_previous0123456789abcdef"
OTHER_SECRET = "whsec_test_nobody_configured_this"
KEYS = parse_secrets(f"{SECRET},{OLD_SECRET}")
NOW_S = 1_723_123_460
TOLERANCE_S = 300
EVENT = stripe_event("payment_intent.succeeded", event_id="evt_1", payment_id="pi_1")
BODY = orjson.dumps(EVENT)


def official_header(body: bytes, *, secret: str = SECRET, timestamp: int = NOW_S) -> str:
    """Stripe-Signature as the official library's test helper makes it."""
    return str(
        stripe.WebhookSignature.generate_signature_header(
            body.decode(), secret, timestamp=timestamp
        )
    )


def receive(headers: dict[str, str], body: bytes, keys: tuple[bytes, ...] = KEYS) -> Webhook:
    """The whole no-I/O path the handler runs for /webhooks/stripe, in its order."""
    delivery = read_headers(headers, STRIPE)
    authenticate(delivery, body, keys, NOW_S, TOLERANCE_S, STRIPE)
    return parse_body(delivery, body, STRIPE)


def test_the_registry_serves_stripe_by_its_name() -> None:
    assert BY_NAME["stripe"] is STRIPE
    assert STRIPE.webhook_path == "/webhooks/stripe"
    assert STRIPE.secrets_variable == "STRIPE_WEBHOOK_SECRETS"


def test_a_delivery_signed_by_the_official_library_is_accepted() -> None:
    webhook = receive({SIGNATURE_HEADER: official_header(BODY)}, BODY)

    # The id is the body's evt_..., the routing key the canonical event type.
    assert webhook == Webhook("evt_1", "payment.status_changed", "pi_1", BODY)


def test_our_signature_is_one_the_official_library_verifies() -> None:
    headers = signed_headers(SECRET.encode(), "evt_1", BODY, NOW_S)
    event = stripe.Webhook.construct_event(
        BODY.decode(), headers[SIGNATURE_HEADER], SECRET, tolerance=10**10
    )
    assert event["id"] == "evt_1"
    stripe.WebhookSignature.verify_header(
        BODY.decode(), headers[SIGNATURE_HEADER], SECRET, tolerance=None
    )


def test_a_tampered_body_is_rejected() -> None:
    header = official_header(BODY)
    tampered = BODY.replace(b'"amount_received":2000', b'"amount_received":2')

    with pytest.raises(RejectedWebhookError) as e:
        receive({SIGNATURE_HEADER: header}, tampered)
    assert e.value.outcome == "invalid_signature"


def test_a_signature_under_a_secret_not_configured_is_rejected() -> None:
    with pytest.raises(RejectedWebhookError) as e:
        receive({SIGNATURE_HEADER: official_header(BODY, secret=OTHER_SECRET)}, BODY)
    assert e.value.outcome == "invalid_signature"


def test_the_secret_is_the_whole_whsec_string_as_stripe_keys_it() -> None:
    # Not base64-decoded after whsec_ (that is Standard Webhooks' rule, not Stripe's).
    assert KEYS[0] == SECRET.encode()


def test_the_timestamp_is_signed_too() -> None:
    header = official_header(BODY).replace(f"t={NOW_S}", f"t={NOW_S + 1}")

    with pytest.raises(RejectedWebhookError) as e:
        receive({SIGNATURE_HEADER: header}, BODY)
    assert e.value.outcome == "invalid_signature"


@pytest.mark.parametrize("offset_s", [-(TOLERANCE_S + 1), TOLERANCE_S + 1, -259_200, 86_400])
def test_a_stale_or_future_timestamp_is_rejected_as_stale(offset_s: int) -> None:
    header = official_header(BODY, timestamp=NOW_S + offset_s)

    with pytest.raises(RejectedWebhookError) as e:
        receive({SIGNATURE_HEADER: header}, BODY)
    assert e.value.outcome == "stale"
    assert e.value.signed is not None  # authentic: a clock problem, not a forgery


@pytest.mark.parametrize("offset_s", [-TOLERANCE_S, 0, TOLERANCE_S])
def test_a_timestamp_within_the_tolerance_is_accepted(offset_s: int) -> None:
    receive({SIGNATURE_HEADER: official_header(BODY, timestamp=NOW_S + offset_s)}, BODY)


@pytest.mark.parametrize(
    "header",
    [
        None,  # no Stripe-Signature at all
        "",
        "v1=" + "0" * 64,  # no t=
        f"t=soon,v1={'0' * 64}",
        "t=",
        "garbage",
    ],
)
def test_a_missing_or_unreadable_signature_header_is_an_invalid_signature(
    header: str | None,
) -> None:
    headers = {} if header is None else {SIGNATURE_HEADER: header}

    with pytest.raises(RejectedWebhookError) as e:
        receive(headers, BODY)
    assert e.value.outcome == "invalid_signature"
    # The official library refuses the same headers.
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.WebhookSignature.verify_header(BODY.decode(), header, SECRET, tolerance=None)


def test_a_header_without_v1_is_an_invalid_signature() -> None:
    v0_only = official_header(BODY).replace("v1=", "v0=")

    with pytest.raises(RejectedWebhookError) as e:
        receive({SIGNATURE_HEADER: v0_only}, BODY)
    assert e.value.outcome == "invalid_signature"


def test_several_v1_signatures_any_one_matching_is_enough_and_v0_is_ignored() -> None:
    ours = official_header(BODY).split(",v1=")[1]
    old = official_header(BODY, secret=OTHER_SECRET).split(",v1=")[1]
    header = f"t={NOW_S},v1={old},v0={'f' * 64},v1={ours}"

    assert receive({SIGNATURE_HEADER: header}, BODY).event_id == "evt_1"
    stripe.WebhookSignature.verify_header(BODY.decode(), header, SECRET, tolerance=None)


def test_rotation_an_older_configured_secret_matches_at_its_position() -> None:
    delivery = read_headers({SIGNATURE_HEADER: official_header(BODY, secret=OLD_SECRET)}, STRIPE)

    signed = authenticate(delivery, BODY, KEYS, NOW_S, TOLERANCE_S, STRIPE)
    assert signed.secret_index == 1


@pytest.mark.parametrize("raw", ["sk_live_abc", "whsec_", " , ", "whsec_a,pk_test_b"])
def test_secrets_that_are_no_endpoint_secrets_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="secret"):
        parse_secrets(raw)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"type": "payment_intent.succeeded", "data": {"object": {}}}, '"id"'),
        ({"id": "", "type": "x", "data": {"object": {}}}, '"id"'),
        ({"id": 7, "type": "x", "data": {"object": {}}}, '"id"'),
        ({"id": "evt_1", "data": {"object": {}}}, '"type"'),
        ({"id": "evt_1", "type": "charge.refunded", "data": {}}, "data.object"),
        ({"id": "evt_1", "type": "charge.refunded", "data": []}, "data.object"),
        ({"id": "evt_" + "x" * 300, "type": "t", "data": {"object": {}}}, "id"),
        ({"id": "evt_\n1", "type": "t", "data": {"object": {}}}, "id"),
    ],
)
def test_a_signed_body_that_is_no_stripe_event_is_malformed(
    body: dict[str, Any], error: str
) -> None:
    raw = orjson.dumps(body)

    with pytest.raises(MalformedWebhookError, match=error):
        receive({SIGNATURE_HEADER: official_header(raw)}, raw)


# --- the mapping onto the canonical events -----------------------------------------------------


def canonical_of(event: dict[str, Any]) -> dict[str, Any]:
    mapped: dict[str, Any] = orjson.loads(canonical_body(orjson.dumps(event)))
    return mapped


def test_payment_intent_succeeded_is_paid_with_the_amount_received() -> None:
    event = canonical_of(EVENT)

    assert event == {
        "event": "payment.status_changed",
        "payment_id": "pi_1",
        "external_id": "order_1",
        "status": "paid",
        "amount": "20.00",
        "currency": "USD",
        "created_at": "2024-08-08T13:24:16+00:00",
        "stripe_type": "payment_intent.succeeded",
    }
    parsed = parse_event(event)  # the orders worker reads it
    assert (parsed.status, parsed.amount, parsed.currency) == ("paid", Decimal("20.00"), "USD")


@pytest.mark.parametrize(
    ("minor", "currency", "major"),
    [
        (2000, "usd", "20.00"),
        (5, "eur", "0.05"),
        (0, "gbp", "0.00"),
        (1000, "jpy", "1000"),
        (50000, "KRW", "50000"),
        (1234, "vnd", "1234"),
        (1050, "kwd", "1.050"),
        (123456789012, "usd", "1234567890.12"),
    ],
)
def test_minor_units_become_a_decimal_string_by_the_currencys_exponent(
    minor: int, currency: str, major: str
) -> None:
    assert major_units(minor, currency) == major


def test_a_zero_decimal_currency_is_paid_in_whole_units() -> None:
    event = canonical_of(
        stripe_event("payment_intent.succeeded", amount=1000, amount_received=1000, currency="jpy")
    )
    assert (event["amount"], event["currency"]) == ("1000", "JPY")


def test_payment_failed_is_failed_and_leaves_money_out() -> None:
    event = canonical_of(stripe_event("payment_intent.payment_failed", payment_id="pi_2"))

    assert event["event"] == "payment.status_changed"
    assert (event["status"], event["payment_id"]) == ("failed", "pi_2")
    assert "amount" not in event


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        ("requested_by_customer", "cancelled"),
        ("duplicate", "cancelled"),
        ("fraudulent", "cancelled"),
        (None, "cancelled"),
        ("abandoned", "expired"),
        ("automatic", "expired"),
    ],
)
def test_canceled_is_cancelled_or_expired_both_a_cancelled_order(
    reason: str | None, status: str
) -> None:
    event = canonical_of(stripe_event("payment_intent.canceled", cancellation_reason=reason))

    assert event["status"] == status
    # Either way a non-money status: it moves a PENDING order only, never undoes a payment.
    assert STATUS_TARGETS[status] is OrderStatus.CANCELLED


def test_charge_refunded_is_its_latest_refund_completed() -> None:
    event = canonical_of(stripe_event("charge.refunded", payment_id="pi_1"))

    assert event["event"] == "refund.completed"
    assert event["refund_id"] == "re_3PpQhLJtLs0Gc6Rx0mNq2Xa1"
    assert (event["payment_id"], event["amount"], event["currency"]) == ("pi_1", "20.00", "USD")
    assert parse_event(event).refund_id == event["refund_id"]


def test_a_second_partial_refund_counts_its_own_amount_not_the_charges_total() -> None:
    # amount_refunded is the charge's running total: counting it per refund would double.
    first = refund_entry("re_1", 700, 1_723_127_000)
    second = refund_entry("re_2", 300, 1_723_128_000)
    event = canonical_of(
        stripe_event(
            "charge.refunded",
            amount_refunded=1000,
            refunded=False,
            refunds=refunds_list(first, second),  # listed out of order: `created` decides
        )
    )
    assert (event["refund_id"], event["amount"]) == ("re_2", "3.00")


def test_charge_refunded_without_its_refunds_list_is_a_whole_refund_when_refunded() -> None:
    # API versions from 2022-11-15 leave `refunds` out of a charge unless expanded.
    whole = stripe_event("charge.refunded", payment_id="pi_1", refunds=None)
    event = canonical_of(whole)
    assert event["event"] == "payment.status_changed"
    assert (event["status"], event["amount"]) == ("refunded", "20.00")

    partial = stripe_event("charge.refunded", refunds=None, refunded=False, amount_refunded=500)
    raw = orjson.dumps(partial)
    webhook = receive({SIGNATURE_HEADER: official_header(raw)}, raw)
    assert webhook.event_type == "stripe.charge.refunded"  # no refund id: unrouted, kept


def test_a_failed_refund_is_refund_failed() -> None:
    event = canonical_of(stripe_event("charge.refund.updated", payment_id="pi_1"))

    assert event["event"] == "refund.failed"
    assert (event["refund_id"], event["payment_id"]) == ("re_3PpQkTJtLs0Gc6Rx1c2Vb5Ww", "pi_1")


def test_a_refund_updated_otherwise_is_stripes_own_unrouted_event() -> None:
    raw = orjson.dumps(stripe_event("charge.refund.updated", status="succeeded"))

    assert receive({SIGNATURE_HEADER: official_header(raw)}, raw).event_type == (
        "stripe.charge.refund.updated"
    )


@pytest.mark.parametrize("kind", ["charge.dispute.created", "charge.dispute.closed"])
def test_disputes_keep_stripes_type_with_the_payment_intent(kind: str) -> None:
    # payhooks' canonical vocabulary has no dispute events: stored, routed to `unrouted`.
    raw = orjson.dumps(stripe_event(kind, payment_id="pi_1"))

    webhook = receive({SIGNATURE_HEADER: official_header(raw)}, raw)
    assert (webhook.event_type, webhook.payment_id) == (f"stripe.{kind}", "pi_1")
    assert canonical_of(orjson.loads(raw))["event"] == f"stripe.{kind}"


def test_any_other_event_is_stored_under_stripes_type() -> None:
    raw = orjson.dumps(
        {"id": "evt_9", "object": "event", "type": "customer.created", "data": {"object": {}}}
    )
    webhook = receive({SIGNATURE_HEADER: official_header(raw)}, raw)
    assert webhook.event_type == "stripe.customer.created"
    assert not is_routed(webhook.event_type)


@pytest.mark.parametrize("kind", ["refund.created", "refund.updated", "payment.created"])
def test_stripe_types_that_look_like_payhooks_own_are_never_routed_as_them(kind: str) -> None:
    # Stripe's refund.updated (pending) must not reach the orders worker as payhooks' refund.*
    raw = orjson.dumps(
        {"id": "evt_9", "type": kind, "data": {"object": {"object": "refund", "status": "pending"}}}
    )
    webhook = receive({SIGNATURE_HEADER: official_header(raw)}, raw)
    assert webhook.event_type == f"stripe.{kind}"
    assert not is_routed(webhook.event_type)


@pytest.mark.parametrize("kind", ["refund.created", "refund.updated"])
def test_a_succeeded_refund_object_is_refund_completed_with_its_own_amount(kind: str) -> None:
    # Partial refunds on API versions whose charge.refunded has no refunds list.
    event = stripe_event("refund.created", payment_id="pi_1", amount=700)
    event["type"] = kind
    mapped = canonical_of(event)

    assert mapped["event"] == "refund.completed"
    assert (mapped["refund_id"], mapped["payment_id"]) == ("re_3PpQkTJtLs0Gc6Rx1c2Vb5Ww", "pi_1")
    assert (mapped["amount"], mapped["currency"]) == ("7.00", "USD")


@pytest.mark.parametrize("kind", ["refund.updated", "refund.failed"])
def test_a_failed_refund_object_is_refund_failed(kind: str) -> None:
    event = stripe_event("refund.created", status="failed")
    event["type"] = kind

    assert canonical_of(event)["event"] == "refund.failed"


def test_the_workers_know_a_stripe_event_by_its_prefixed_id_and_canonical_body() -> None:
    message_id, body = message_of("stripe", "evt_1", BODY)

    assert message_id == "stripe:evt_1"
    assert orjson.loads(body) == canonical(EVENT)


def test_a_body_that_is_somehow_not_an_event_passes_unchanged() -> None:
    for raw in (b"not json", b"[]", b'{"type":"x"}'):
        assert canonical_body(raw) == raw


# --- livemode: STRIPE_LIVEMODE -------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "livemode", "applied"),
    [
        (None, False, True),  # unset: both modes applied
        (None, True, True),
        ("any", True, True),
        ("live", True, True),
        ("live", False, False),
        ("test", False, True),
        ("test", True, False),
        ("live", None, False),  # no boolean livemode: neither mode
    ],
)
def test_an_event_of_the_mode_not_applied_is_kept_under_stripes_type(
    mode: str | None, livemode: bool | None, applied: bool
) -> None:
    event = stripe_event("payment_intent.succeeded", event_id="evt_m", payment_id="pi_m")
    event["livemode"] = livemode
    raw = orjson.dumps(event)
    options = {} if mode is None else {"STRIPE_LIVEMODE": mode}

    delivery = read_headers({SIGNATURE_HEADER: official_header(raw)}, STRIPE)
    webhook = parse_body(delivery, raw, STRIPE, options)

    expected = "payment.status_changed" if applied else "stripe.payment_intent.succeeded"
    assert (webhook.event_id, webhook.event_type, webhook.payment_id) == (
        "evt_m",
        expected,
        "pi_m",
    )
