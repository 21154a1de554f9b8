"""Stripe's PaymentIntent as the reconciler reads it (shared/providers/stripe/payments.py):
its status (and its latest charge's refunds) as payhooks' canonical status."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest

from shared.providers.base import ProviderResponseError
from shared.providers.stripe.payments import parse_payment_intent, payment_path
from tests.stripe_events import payment_intent

AT = 1_723_123_450


def read(intent: dict[str, Any], payment_id: str = "pi_1") -> Any:
    return parse_payment_intent(orjson.dumps(intent), payment_id)


def test_the_path_asks_for_the_latest_charge_and_its_refunds() -> None:
    assert payment_path("pi_1") == "/v1/payment_intents/pi_1?expand%5B%5D=latest_charge.refunds"
    assert payment_path("pi/../x").startswith("/v1/payment_intents/pi%2F..%2Fx?")


def test_succeeded_is_paid_with_the_amount_received() -> None:
    payment = read(payment_intent("pi_1", "succeeded"))

    assert (payment.status, payment.amount, payment.currency) == ("paid", Decimal("100.00"), "USD")
    assert payment.updated_at == datetime.fromtimestamp(AT + 1, UTC)  # the charge's


def test_succeeded_and_refunded_in_full_is_refunded_at_the_refunds_time() -> None:
    payment = read(payment_intent("pi_1", "succeeded", refunded=10_000))

    assert payment.status == "refunded"
    assert payment.updated_at == datetime.fromtimestamp(AT + 3600, UTC)


def test_a_partial_refund_leaves_it_paid() -> None:
    assert read(payment_intent("pi_1", "succeeded", refunded=2_500)).status == "paid"


def test_a_zero_decimal_currency_is_read_in_whole_units() -> None:
    payment = read(payment_intent("pi_1", "succeeded", amount=1500, currency="jpy"))

    assert (payment.amount, payment.currency) == (Decimal("1500"), "JPY")


@pytest.mark.parametrize(
    ("reason", "status"),
    [("requested_by_customer", "cancelled"), ("abandoned", "expired"), ("automatic", "expired")],
)
def test_canceled_is_cancelled_or_expired(reason: str, status: str) -> None:
    payment = read(payment_intent("pi_1", "canceled", cancellation_reason=reason))

    assert payment.status == status
    assert payment.updated_at == datetime.fromtimestamp(AT + 60, UTC)


@pytest.mark.parametrize(
    ("stripe_status", "status"),
    [
        ("requires_payment_method", "failed"),  # after a failed attempt (last_payment_error)
        ("processing", "pending"),
        ("requires_action", "pending"),
        ("requires_capture", "pending"),
        ("requires_confirmation", "pending"),
    ],
)
def test_undecided_statuses_change_nothing(stripe_status: str, status: str) -> None:
    assert read(payment_intent("pi_1", stripe_status)).status == status


def test_an_unexpanded_latest_charge_is_still_paid() -> None:
    intent = payment_intent("pi_1", "succeeded")
    intent["latest_charge"] = "ch_1"

    assert read(intent).status == "paid"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"object": "charge"}, "not a PaymentIntent"),
        ({"id": "pi_2"}, "another payment"),
        ({"status": None}, "status"),
        ({"currency": ""}, "currency"),
        ({"amount": "100"}, "amount"),
        ({"amount": -1}, "amount"),
        ({"created": None}, "created"),
    ],
)
def test_an_answer_we_cannot_use_is_a_response_error(change: dict[str, Any], why: str) -> None:
    intent = payment_intent("pi_1", "succeeded") | change

    with pytest.raises(ProviderResponseError, match=why):
        read(intent)


def test_a_body_that_is_no_json_is_a_response_error() -> None:
    with pytest.raises(ProviderResponseError, match="not JSON"):
        parse_payment_intent(b"<html>", "pi_1")
