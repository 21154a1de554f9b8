"""The simulator plays Stripe: what its adapter encodes and signs verifies with the official
`stripe` package and maps back through the adapter to the same canonical event (every event
the simulator's flows emit, and the rest the encoder knows); no `settled` for Stripe; the fake
API answers Stripe's question in Stripe's shape, which the reconciler's reading reads back."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
import stripe
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from services.sim import scenario
from services.sim.api import PaymentBook, create_app, start_api
from services.sim.deliverer import playable_providers
from services.sim.summary import expect
from shared.metrics import ProviderMetrics
from shared.providers.base import ProviderPayment
from shared.providers.stripe import SIGNATURE_HEADER
from shared.providers.stripe.adapter import STRIPE
from shared.providers.stripe.events import canonical, minor_units
from shared.providers.stripe.payments import answer, parse_payment_intent, payment_path
from shared.providers.xhub.client import PaymentNotFoundError, ProviderClient
from shared.providers.xhub.events import status_changed
from shared.vocabulary import OrderStatus

SECRET = "whsec_the_simulators_stripe_secret"
AT = "2026-12-01T10:00:01+00:00"


def _paid(status: str, **extra: Any) -> dict[str, Any]:
    return status_changed("pay_1", status, "100.00", "USD", AT, external_id="ord_1", **extra)


SIM_EVENTS = [_paid(s) for s in ("paid", "refunded", "expired")]
OTHER_EVENTS = [
    _paid("failed"),
    _paid("cancelled"),
    {"event": "refund.completed", "payment_id": "pay_1", "refund_id": "re_1",
     "amount": "40.00", "currency": "USD", "created_at": AT, "external_id": "ord_1"},
    {"event": "refund.failed", "payment_id": "pay_1", "refund_id": "re_2",
     "amount": "40.00", "currency": "USD", "created_at": AT, "external_id": "ord_1"},
]  # fmt: skip


def _signed(event: dict[str, Any], now: float) -> tuple[bytes, dict[str, str]]:
    assert STRIPE.encode is not None
    assert STRIPE.signed_headers is not None
    body = STRIPE.encode("evt_1", event)
    return body, STRIPE.signed_headers(STRIPE.parse_secrets(SECRET)[0], "evt_1", body, now)


def test_stripe_can_be_played() -> None:
    assert "stripe" in playable_providers()


@pytest.mark.parametrize(
    "event", SIM_EVENTS + OTHER_EVENTS, ids=lambda e: e.get("status", e["event"])
)
def test_what_the_sim_sends_verifies_with_the_official_package_and_maps_back(
    event: dict[str, Any],
) -> None:
    body, headers = _signed(event, time.time())  # the package checks the timestamp's age
    assert headers[SIGNATURE_HEADER].startswith("t=")
    verified = stripe.Webhook.construct_event(body, headers[SIGNATURE_HEADER], SECRET)
    assert verified["id"] == "evt_1"
    back = canonical(orjson.loads(body))
    assert back.pop("stripe_type") == verified["type"]
    if event.get("status") in ("failed", "expired", "cancelled"):
        # Stripe's failed and canceled intents carry no amount payhooks reads.
        assert back == {k: v for k, v in event.items() if k not in ("amount", "currency")}
    else:
        assert back == event
    # And ingest's own check takes it.
    keys = STRIPE.parse_secrets(SECRET)
    stamp = headers[SIGNATURE_HEADER].split(",")[0].removeprefix("t=")
    assert STRIPE.matching_secret(keys, "evt_1", stamp, body, headers[SIGNATURE_HEADER]) == 0


def test_a_tampered_body_or_another_secret_does_not_verify() -> None:
    body, headers = _signed(SIM_EVENTS[0], time.time())
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(
            body.replace(b"10000", b"99900"), headers[SIGNATURE_HEADER], SECRET
        )
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(body, headers[SIGNATURE_HEADER], "whsec_someone_else")


def test_stripe_has_no_settled_event() -> None:
    assert STRIPE.encode is not None
    with pytest.raises(ValueError, match="settled"):
        STRIPE.encode("evt_1", _paid("settled"))
    with pytest.raises(ValueError, match="minor units"):
        minor_units("10.001", "USD")
    assert minor_units("1050", "JPY") == 1050


def test_the_sim_sends_stripe_no_settle_step_and_expects_paid() -> None:
    flows = {"settled": 1.0, "settled_refunded": 1.0}
    config = scenario.ScenarioConfig(
        payments=20, providers=("xhub", "stripe"), flows=flows, lost_rate=0, seed=3
    )
    plan = scenario.generate(config)
    for p in plan.payments:
        settles = p.provider == "xhub"
        assert ("settled" in p.statuses) is settles
        if p.flow == "settled":
            assert expect(p).status is (OrderStatus.SETTLED if settles else OrderStatus.PAID)
        else:
            assert expect(p).status is OrderStatus.REFUNDED
    assert STRIPE.encode is not None
    for w in (w for p in plan.payments if p.provider == "stripe" for w in p.events):
        canonical(orjson.loads(STRIPE.encode(w.event_id, w.payload)))  # each one encodes


def test_a_stripe_payment_whose_webhooks_were_all_lost_is_not_expected_repaired() -> None:
    config = scenario.ScenarioConfig(payments=80, providers=("stripe",), lost_rate=0.4, seed=5)
    plan = scenario.generate(config)
    all_lost = [p for p in plan.payments if not p.sent_events]
    some_sent = [p for p in plan.payments if p.sent_events and p.events[-1] in p.lost_events]
    assert all_lost
    assert some_sent
    assert all(not p.repairable and expect(p).status is OrderStatus.PENDING for p in all_lost)
    assert all(p.repairable for p in some_sent)
    assert any(expect(p).needs_repair for p in some_sent)


@pytest.mark.parametrize("status", ["paid", "refunded", "expired", "cancelled", "failed"])
def test_the_answer_reads_back_as_the_same_payment(status: str) -> None:
    at = datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC)
    payment = ProviderPayment("pay_1", status, Decimal("100.00"), "USD", at)
    assert parse_payment_intent(answer(payment), "pay_1") == payment


async def test_the_fake_api_answers_each_provider_on_its_own_route() -> None:
    book = PaymentBook()
    at = datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC)
    book.set_status("pay_s", "refunded", Decimal("100.00"), "USD", at, "stripe")
    book.set_status("pay_x", "paid", Decimal("100.00"), "USD", at, "xhub")
    app = create_app(book, "xhub-key", {"stripe": "sk_test_sim"})
    async with TestClient(TestServer(app)) as client:
        stripe_auth = {"Authorization": "Bearer sk_test_sim"}
        r = await client.get(payment_path("pay_s"), headers=stripe_auth)
        assert r.status == 200
        read = parse_payment_intent(await r.read(), "pay_s")
        assert read.status == "refunded"
        assert (await client.get(payment_path("pay_x"), headers=stripe_auth)).status == 404
        assert (
            await client.get(payment_path("pay_s"), headers={"Authorization": "Bearer xhub-key"})
        ).status == 401
        xhub_auth = {"Authorization": "Bearer xhub-key"}
        assert (await client.get("/payments/pay_x", headers=xhub_auth)).status == 200
        assert (await client.get("/payments/pay_s", headers=xhub_auth)).status == 404


async def test_the_reconcilers_stripe_client_reads_the_fake_api() -> None:
    """The reconciler's own client (Stripe's path with expand[], Stripe-Version, the Bearer
    key) against the simulator's API: every status the simulator holds reads back."""
    book = PaymentBook()
    at = datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC)
    statuses = ("paid", "refunded", "expired", "cancelled", "failed")
    for status in statuses:
        book.set_status(f"pay_{status}", status, Decimal("100.00"), "USD", at, "stripe")
    runner, url = await start_api(book, "xhub-key", keys={"stripe": "sk_test_sim"})
    api = STRIPE.payment_api
    assert api is not None
    client = ProviderClient.for_api(
        "stripe", api, url, "sk_test_sim", ProviderMetrics.create(CollectorRegistry())
    )
    await client.start()
    try:
        for status in statuses:
            payment = await client.get_payment(f"pay_{status}")
            assert (payment.status, payment.amount, payment.currency) == (
                status,
                Decimal("100.00"),
                "USD",
            )
        with pytest.raises(PaymentNotFoundError):
            await client.get_payment("pay_nobody")
    finally:
        await client.close()
        await runner.cleanup()
