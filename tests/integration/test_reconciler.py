"""The reconciler against a real local provider API and the real workers: a lost webhook is
repaired once, a late real webhook changes nothing twice, provider errors never stop it, two
reconcilers do one repair."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from services.reconciler.jobs import reconcile_once
from shared.broker import Broker
from shared.config import Settings
from shared.db import create_pool
from shared.metrics import ProviderMetrics, ReconcilerMetrics
from shared.provider import ProviderClient, ProviderPolicy
from shared.topology import Topology
from tests.conftest import SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    effects,
    post,
    register,
    start_system,
    system_settings,
)

API_KEY = "test-provider-key"


class FakeProvider:
    """The provider's payments API: statuses set by the test, failures on demand."""

    def __init__(self) -> None:
        self.payments: dict[str, dict[str, str]] = {}
        self.failures: list[int] = []  # statuses to answer before the real one
        self.hits = 0
        self.asked: list[str] = []  # payment ids, once per request

    async def get(self, request: web.Request) -> web.Response:
        self.hits += 1
        self.asked.append(request.match_info["payment_id"])
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return web.json_response({"error": "unauthorized"}, status=401)
        if self.failures:
            return web.json_response({"error": "boom"}, status=self.failures.pop(0))
        payment = self.payments.get(request.match_info["payment_id"])
        if payment is None:
            return web.json_response({"error": "not found"}, status=404)
        return web.json_response(payment)

    def set(self, payment_id: str, status: str, amount: str = "100.00") -> None:
        self.payments[payment_id] = {
            "payment_id": payment_id,
            "status": status,
            "amount": amount,
            "currency": "USD",
            "updated_at": datetime.now(UTC).isoformat(),
        }


@pytest.fixture
async def provider() -> Any:
    fake = FakeProvider()
    app = web.Application()
    app.router.add_get("/payments/{payment_id}", fake.get)
    server = TestServer(app)
    await server.start_server()
    fake.url = str(server.make_url(""))  # type: ignore[attr-defined]
    yield fake
    await server.close()


@pytest.fixture
async def reconciler(settings: Settings, topology: Topology, provider: Any) -> Any:
    """What one reconciler process holds: pool, broker, provider client, metrics."""
    pool = await create_pool(settings.database_url)
    broker = Broker(settings.amqp_url, topology)
    await broker.start()
    await broker.wait_connected(10)
    registry = CollectorRegistry()
    client = ProviderClient(
        provider.url,
        API_KEY,
        metrics=ProviderMetrics.create(registry),
        policy=ProviderPolicy(backoff_base_s=0.01, backoff_max_s=0.05, rate_per_s=1000),
    )
    await client.start()
    metrics = ReconcilerMetrics.create(registry)

    async def run() -> int:
        # Stale after 1 ms (tests backdate updated_at), asked about again after a minute.
        return await reconcile_once(pool, broker, client, metrics, after_s=0.001, again_after_s=60)

    run.registry = registry  # type: ignore[attr-defined]
    yield run
    await client.close()
    await broker.close()
    await pool.close()


async def make_stale(db: Any, payment_id: str) -> None:
    """As if an hour passed since the order's last change and its last reconciliation."""
    await db.execute(
        "UPDATE orders SET updated_at = now() - interval '1 hour', reconciled_at = NULL"
        " WHERE payment_id = $1",
        payment_id,
    )


async def test_lost_webhook_is_repaired_once_and_the_late_webhook_changes_nothing(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
    provider: FakeProvider,
    reconciler: Any,
) -> None:
    system = await start_system(
        aiohttp_client, system_settings(make_settings, smtp[1]), amqp, topology
    )
    await register(db, "pay_lost")
    await make_stale(db, "pay_lost")
    provider.set("pay_lost", "paid")

    await reconciler()

    done = {"status": "PAID", "bonus": 500, "ledger": ["grant"], "emails": ["payment_succeeded"]}
    assert await eventually(lambda: effects(db, "pay_lost"), lambda e: e == done) == done
    repairs = reconciler.registry.get_sample_value(
        "payhooks_reconcile_repairs_total", {"from": "PENDING", "to": "PAID"}
    )
    assert repairs == 1
    transitions = await db.fetch(
        "SELECT event_id FROM order_transitions WHERE payment_id = 'pay_lost'"
    )
    assert [t["event_id"].split(":")[0] for t in transitions] == ["reconcile"]

    # The real webhook, days late: accepted, and no second bonus or email.
    await post(system.ingest, payment_event("pay_lost", "paid"))
    await asyncio.sleep(1.0)  # give the workers time to (not) act on it
    assert await effects(db, "pay_lost") == done
    assert len(smtp[0].messages) == 1

    # Asking again changes nothing either: the order is no longer stale.
    await make_stale(db, "pay_lost")
    await reconciler()
    assert (
        reconciler.registry.get_sample_value(
            "payhooks_reconcile_repairs_total", {"from": "PENDING", "to": "PAID"}
        )
        == 1
    )


async def test_provider_errors_are_retried_and_a_404_leaves_the_order_alone(
    db: Any, amqp: Any, topology: Topology, provider: FakeProvider, reconciler: Any
) -> None:
    await register(db, "pay_flaky")
    await register(db, "pay_unknown")
    await make_stale(db, "pay_flaky")
    await make_stale(db, "pay_unknown")
    provider.set("pay_flaky", "paid")
    provider.failures = [500, 503]  # the first two calls fail, then the client's retry works

    checked = await reconciler()

    assert checked == 2
    registry = reconciler.registry
    assert (
        registry.get_sample_value("payhooks_reconcile_checked_total", {"result": "not_found"}) == 1
    )
    assert (
        registry.get_sample_value("payhooks_reconcile_checked_total", {"result": "repaired"}) == 1
    )
    assert (
        registry.get_sample_value("payhooks_provider_requests_total", {"outcome": "server_error"})
        == 2
    )
    order = await db.fetchrow("SELECT status FROM orders WHERE payment_id = 'pay_unknown'")
    assert order["status"] == "PENDING"


async def test_two_reconcilers_at_once_send_one_repair(
    settings: Settings,
    topology: Topology,
    db: Any,
    amqp: Any,
    provider: FakeProvider,
    reconciler: Any,
) -> None:
    await register(db, "pay_twice")
    await make_stale(db, "pay_twice")
    provider.set("pay_twice", "settled")

    counts = await asyncio.gather(reconciler(), reconciler())

    assert sorted(counts) == [0, 1]  # one of them claimed the order, the other found nothing
    queue = await amqp.get_queue(topology.work["orders"].name, ensure=False)
    message = await queue.get(no_ack=True, fail=False)
    assert message is not None
    assert message.message_id.startswith("reconcile:pay_twice:settled")
    assert await queue.get(no_ack=True, fail=False) is None


async def test_paid_order_whose_refund_webhook_was_lost_is_refunded_and_the_bonus_clawed_back(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
    provider: FakeProvider,
    reconciler: Any,
) -> None:
    """SPEC 6, "PAID but never SETTLED": the provider refunded the payment, the webhook never
    arrived; the reconciler asks about the PAID order and the refund's effects follow."""
    system = await start_system(
        aiohttp_client, system_settings(make_settings, smtp[1]), amqp, topology
    )
    await register(db, "pay_refund_lost")
    await post(system.ingest, payment_event("pay_refund_lost", "paid"))
    paid = {"status": "PAID", "bonus": 500, "ledger": ["grant"], "emails": ["payment_succeeded"]}
    await eventually(lambda: effects(db, "pay_refund_lost"), lambda e: e == paid)
    await make_stale(db, "pay_refund_lost")
    provider.set("pay_refund_lost", "refunded")

    await reconciler()

    refunded = {
        "status": "REFUNDED",
        "bonus": 0,
        "ledger": ["grant", "clawback"],
        "emails": ["payment_refunded", "payment_succeeded"],
    }
    assert await eventually(lambda: effects(db, "pay_refund_lost"), lambda e: e == refunded)
    repairs = reconciler.registry.get_sample_value(
        "payhooks_reconcile_repairs_total", {"from": "PAID", "to": "REFUNDED"}
    )
    assert repairs == 1


async def test_paid_orders_are_asked_about_daily_and_only_for_thirty_days(
    db: Any, amqp: Any, topology: Topology, provider: FakeProvider, reconciler: Any
) -> None:
    for payment_id, changed, asked in (
        ("pay_paid_due", "2 hours", None),  # never asked: due
        ("pay_paid_asked", "2 hours", "1 hour"),  # asked an hour ago: not again today
        ("pay_paid_yesterday", "3 days", "25 hours"),  # asked yesterday: due again
        ("pay_paid_old", "31 days", None),  # past the horizon: left alone
        ("pay_settled", "2 hours", None),  # settled: nothing left to learn
    ):
        await register(db, payment_id, status="SETTLED" if payment_id == "pay_settled" else "PAID")
        await db.execute(
            "UPDATE orders SET updated_at = now() - $2::text::interval,"
            " reconciled_at = now() - $3::text::interval WHERE payment_id = $1",
            payment_id,
            changed,
            asked,
        )
        provider.set(payment_id, "paid")

    assert await reconciler() == 2
    assert sorted(provider.asked) == ["pay_paid_due", "pay_paid_yesterday"]
