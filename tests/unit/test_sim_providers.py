"""The simulator's provider hook: each adapter's `encode` and `signed_headers` send a canonical
event as that provider does (Standard Webhooks' verified by the official `standardwebhooks`
package and by ingest's own check; X-Hub's as before), payments dealt among providers, a
provider without an API expected where its sent webhooks bring it, DLQ letters by provider."""

from __future__ import annotations

import base64
import datetime as dt
import time

import orjson
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from services.sim import scenario
from services.sim.api import PaymentBook
from services.sim.deliverer import playable_providers
from services.sim.summary import expect, expected_final_status
from shared.ops.dlq import DeadLetter
from shared.ops.dlq_moves import FILTERS, Selection
from shared.providers import registry
from shared.providers.standard.adapter import STANDARD
from shared.providers.xhub.adapter import XHUB
from shared.providers.xhub.events import status_changed
from shared.providers.xhub.signatures import verify
from shared.vocabulary import OrderStatus

SECRET = "whsec_" + base64.b64encode(b"the simulator's standard key").decode()
EVENT = status_changed(
    "pay_1", "paid", "100.00", "USD", "2026-12-01T10:00:00+00:00", external_id="ord_1"
)
NOW = 1_796_000_000.0


def _standard_signed(event_id: str = "evt_1", now: float = NOW) -> tuple[bytes, dict[str, str]]:
    assert STANDARD.encode is not None
    assert STANDARD.signed_headers is not None
    body = STANDARD.encode(event_id, EVENT)
    key = STANDARD.parse_secrets(SECRET)[0]
    return body, STANDARD.signed_headers(key, event_id, body, now)


def test_every_provider_in_the_registry_can_be_played() -> None:
    assert set(playable_providers()) >= {"xhub", "standard"}


def test_standard_signed_by_the_sim_verifies_with_the_official_package() -> None:
    body, headers = _standard_signed(now=time.time())  # the package checks the timestamp's age
    payload = Webhook(SECRET).verify(body, headers)
    assert payload["type"] == "payment.status_changed"
    assert payload["data"]["payment_id"] == "pay_1"
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace(b"100.00", b"999.00"), headers)


def test_standard_signed_by_the_sim_verifies_with_ingests_check() -> None:
    body, headers = _standard_signed()
    keys = STANDARD.parse_secrets(SECRET)
    assert STANDARD.id_header is not None
    assert STANDARD.timestamp_header is not None
    matched = STANDARD.matching_secret(
        keys,
        headers[STANDARD.id_header],
        headers[STANDARD.timestamp_header],
        body,
        headers[STANDARD.signature_header],
    )
    assert matched == 0


def test_standards_encoding_is_the_inverse_of_its_canonical_event() -> None:
    body, _ = _standard_signed()
    assert STANDARD.headline(orjson.loads(body)).payment_id == "pay_1"
    assert STANDARD.canonical_body is not None
    assert orjson.loads(STANDARD.canonical_body(body)) == EVENT
    assert orjson.loads(body)["timestamp"] == EVENT["created_at"]


def test_xhub_is_encoded_and_signed_as_before() -> None:
    assert XHUB.encode is not None
    assert XHUB.signed_headers is not None
    body = XHUB.encode("evt_1", EVENT)
    headers = XHUB.signed_headers(b"secret", "evt_1", body, NOW)
    assert orjson.loads(body) == EVENT
    assert XHUB.id_header is not None
    assert XHUB.timestamp_header is not None
    assert headers[XHUB.id_header] == "evt_1"
    assert verify([b"secret"], headers[XHUB.timestamp_header], body, headers[XHUB.signature_header])


def test_payments_are_dealt_round_robin_among_the_providers() -> None:
    config = scenario.ScenarioConfig(payments=10, providers=("xhub", "standard"), seed=1)
    plan = scenario.generate(config)
    assert [p.provider for p in plan.payments] == ["xhub", "standard"] * 5
    assert all(w.provider == p.provider for p in plan.payments for w in p.events)
    assert len({p.payment_id for p in plan.payments}) == 10
    with pytest.raises(ValueError, match="providers"):
        scenario.ScenarioConfig(providers=("nobody",))


def test_a_provider_without_an_api_is_expected_where_its_sent_webhooks_bring_it() -> None:
    config = scenario.ScenarioConfig(
        payments=60, providers=("xhub", "standard"), lost_rate=0.3, seed=4
    )
    plan = scenario.generate(config)
    book = PaymentBook()
    scenario.publish_to_api(plan, book)
    assert set(book.payments) == {p.payment_id for p in plan.payments if p.provider == "xhub"}
    behind = [
        p for p in plan.payments if p.provider == "standard" and p.events[-1] in p.lost_events
    ]
    assert behind
    for p in behind:
        e = expect(p)
        assert not e.needs_repair
        assert e.status is scenario_status(p.sent_statuses)
    lost_xhub = [p for p in plan.payments if p.provider == "xhub" and p.events[-1] in p.lost_events]
    assert any(expect(p).needs_repair for p in lost_xhub)


def scenario_status(statuses: tuple[str, ...]) -> OrderStatus:
    return expected_final_status(statuses)


def _letter(event_id: str, provider: str | None) -> DeadLetter:
    return DeadLetter(
        id=event_id,
        event_id=event_id,
        event="payment.status_changed",
        payment_id="pay_1",
        reason="retries_exhausted",
        error=None,
        attempts=3,
        first_failed_at=None,
        last_failed_at=dt.datetime(2026, 12, 1, tzinfo=dt.UTC).isoformat(),
        original_queue="orders",
        requeued=0,
        body=b"{}",
        provider=provider,
    )


def test_dead_letters_filter_by_provider() -> None:
    assert "provider" in FILTERS
    selection = Selection.parse(provider="standard")
    assert not selection.says_nothing
    assert selection.matches(_letter("standard:evt_1", "standard"))
    assert not selection.matches(_letter("evt_1", "xhub"))
    assert selection.as_json() == {"provider": "standard"}


def test_a_message_id_names_its_provider() -> None:
    assert registry.provider_of("standard:evt_1") == "standard"
    assert registry.provider_of("evt_1") == "xhub"
    assert registry.provider_of(registry.worker_id("standard", "x")) == "standard"
