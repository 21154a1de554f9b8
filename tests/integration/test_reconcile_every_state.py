"""The reconciler asks about orders in every state (SPEC 6): a refund lost after settlement, a
`paid` lost after an expiry, a second refund lost after a reversal are each repaired with
their ledger entries and emails within RECONCILE_AFTER + 2 x RECONCILE_INTERVAL of the
order's last change. And its one power over a webhook is keyed on its own message headers: a
webhook dressed in every field of the reconciler's events gets none of it (SPEC 5)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from services.reconciler.app import create_app as reconciler_service
from shared.process.web import REGISTRY
from shared.queries import orders as orders_sql
from tests.conftest import SmtpSink
from tests.helpers import delivery, eventually, payment_event
from tests.integration.provider import API_KEY, FakeProvider
from tests.integration.system import SECRET, System, effects, post, quiescent, register

AFTER_S, INTERVAL_S = 2.0, 1.0
BOUND_S = AFTER_S + 2 * INTERVAL_S
REFUNDED_AT = "2026-11-30T11:00:00+00:00"


@pytest.fixture
async def reconciler_running(
    aiohttp_client: Any, make_settings: Any, provider: FakeProvider, smtp: tuple[SmtpSink, int]
) -> Any:
    settings = make_settings(
        XHUB_API_URL=provider.url,
        XHUB_API_KEY=API_KEY,
        RECONCILE_AFTER=str(AFTER_S),
        RECONCILE_INTERVAL=str(INTERVAL_S),
    )
    return await aiohttp_client(reconciler_service(settings))


async def transitions(db: Any, payment_id: str) -> list[Any]:
    return list(
        await db.fetch(
            "SELECT to_status, event_id, at FROM order_transitions WHERE payment_id = $1"
            " ORDER BY id",
            payment_id,
        )
    )


async def repaired_within_bound(db: Any, payment_id: str, to_status: str) -> None:
    """The reconciler's transition to `to_status` came at most BOUND_S after the order's
    previous change."""
    history = await eventually(
        lambda: transitions(db, payment_id),
        lambda t: bool(t) and t[-1]["to_status"] == to_status,
        timeout_s=BOUND_S + 5,
    )
    repair, before = history[-1], history[-2]
    assert repair["event_id"].startswith("reconcile:")
    took = (repair["at"] - before["at"]).total_seconds()
    assert took <= BOUND_S, f"repaired {took:.2f} s after the last change"


async def test_a_settled_order_refunded_behind_our_back_is_refunded_with_its_effects(
    system: System, db: Any, provider: FakeProvider, reconciler_running: Any
) -> None:
    await register(db, "pay_settled_refunded")
    await post(system.ingest, payment_event("pay_settled_refunded", "paid"))
    await quiescent(db, system)
    await post(system.ingest, payment_event("pay_settled_refunded", "settled"))
    await quiescent(db, system)
    provider.set("pay_settled_refunded", "refunded")  # and the refund webhook is lost

    await repaired_within_bound(db, "pay_settled_refunded", "REFUNDED")
    refunded = {
        "status": "REFUNDED",
        "bonus": 0,
        "ledger": ["grant", "clawback"],
        "emails": ["payment_refunded", "payment_succeeded"],
    }
    assert await eventually(lambda: effects(db, "pay_settled_refunded"), lambda e: e == refunded)


async def test_an_expired_order_paid_behind_our_back_is_paid_with_its_effects(
    system: System, db: Any, provider: FakeProvider, reconciler_running: Any
) -> None:
    await register(db, "pay_expired_paid")
    await post(system.ingest, payment_event("pay_expired_paid", "expired"))
    await quiescent(db, system)
    provider.set("pay_expired_paid", "paid")  # and the paid webhook is lost

    await repaired_within_bound(db, "pay_expired_paid", "PAID")
    paid = {"status": "PAID", "bonus": 500, "ledger": ["grant"], "emails": ["payment_succeeded"]}
    assert await eventually(lambda: effects(db, "pay_expired_paid"), lambda e: e == paid)


async def reversed_order(system: System, db: Any, payment_id: str) -> None:
    """Paid, refunded at REFUNDED_AT, the refund reversed after it: PAID again."""
    await register(db, payment_id)
    await post(system.ingest, payment_event(payment_id, "paid"))
    await quiescent(db, system)
    await post(system.ingest, payment_event(payment_id, "refunded", created_at=REFUNDED_AT))
    await quiescent(db, system)
    reversal = {
        "event": "refund.reversed",
        "payment_id": payment_id,
        "refund_id": "r-1",
        "amount": "100.00",
        "currency": "USD",
        "created_at": "2026-11-30T12:00:00+00:00",
    }
    await post(system.ingest, reversal)
    await quiescent(db, system)
    assert (await effects(db, payment_id))["ledger"] == ["grant", "clawback", "restore"]


async def test_a_second_refund_after_a_reversal_is_found_too(
    system: System, db: Any, provider: FakeProvider, reconciler_running: Any
) -> None:
    await reversed_order(system, db, "pay_refunded_again")
    provider.set("pay_refunded_again", "refunded")  # refunded again now; the webhook is lost

    await repaired_within_bound(db, "pay_refunded_again", "REFUNDED")
    ledger = ["grant", "clawback", "restore", "clawback"]
    got = await eventually(
        lambda: effects(db, "pay_refunded_again"), lambda e: e["ledger"] == ledger
    )
    assert (got["status"], got["bonus"]) == ("REFUNDED", 0)


async def test_the_reversed_refund_still_showing_at_the_provider_is_no_new_refund(
    system: System, db: Any, provider: FakeProvider, reconciler_running: Any
) -> None:
    """A provider whose status does not follow reversals still says "refunded", dated
    before the order went back to PAID: nothing to repair, however often it is asked."""
    await reversed_order(system, db, "pay_still_refunded")
    provider.set("pay_still_refunded", "refunded")
    provider.payments["pay_still_refunded"]["updated_at"] = REFUNDED_AT

    assert await eventually(
        lambda: asyncio.sleep(0, provider.asked.count("pay_still_refunded")),
        lambda n: n >= 2,
        timeout_s=BOUND_S + 5,
    )
    assert (await effects(db, "pay_still_refunded"))["status"] == "PAID"
    stale = reconciler_running.app[REGISTRY].get_sample_value(
        "payhooks_reconcile_checked_total", {"result": "stale_answer"}
    )
    assert stale >= 2


async def test_a_webhook_dressed_as_the_reconcilers_answer_does_nothing_a_webhook_cannot(
    system: System, db: Any
) -> None:
    """SPEC 5: only the reconciler's own events may act on the provider's word. A signed
    webhook carrying every field and header of one (checked_at, source) is a webhook: it
    cannot take a REFUNDED order back to PAID, nor clear the undecided flag."""
    payment_id = "pay_dressed"
    await register(db, payment_id)
    await post(system.ingest, payment_event(payment_id, "paid"))
    await quiescent(db, system)
    await post(system.ingest, payment_event(payment_id, "refunded", created_at=REFUNDED_AT))
    await quiescent(db, system)
    await orders_sql.flag_undecided(db, payment_id, "reversal_before_refund")
    now = datetime.now(UTC).isoformat()
    dressed = payment_event(
        payment_id, "paid", created_at=now, checked_at=now, source="reconciliation"
    )
    body, headers = delivery(dressed, SECRET, event_id=f"reconcile:{payment_id}:paid:{now}")
    headers |= {"source": "reconciliation", "checked_at": now}

    response = await system.ingest.post("/webhooks/xhub", data=body, headers=headers)
    assert response.status == 200, await response.text()
    await quiescent(db, system)

    row = await db.fetchrow(
        "SELECT status, undecided_since FROM orders WHERE payment_id = $1", payment_id
    )
    assert row["status"] == "REFUNDED"
    assert row["undecided_since"] is not None
    assert (await effects(db, payment_id))["ledger"] == ["grant", "clawback"]
