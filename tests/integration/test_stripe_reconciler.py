"""The reconciler asking a local fake of Stripe's API (`GET /v1/payment_intents/{id}`, never
the network) about Stripe payments, with the real workers: a lost payment_intent.succeeded is
repaired once, a refund found at Stripe refunds the order, without STRIPE_API_KEY Stripe's
payments are not asked about (nor at X-Hub), and Stripe's errors are counted, not applied."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from services.reconciler.app import create_app as reconciler_service
from services.reconciler.jobs import reconcile_once
from shared.amqp.broker import Broker
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.db import create_pool
from shared.metrics import ProviderMetrics, ReconcilerMetrics
from shared.providers.registry import BY_NAME
from shared.providers.xhub.client import ProviderClient, ProviderPolicy
from shared.queries.schedule import Timing
from tests.conftest import SmtpSink
from tests.helpers import eventually
from tests.integration.provider import API_KEY, FakeProvider
from tests.integration.system import System, effects, register
from tests.stripe_events import payment_intent, stripe_event

TIMING = Timing(after_s=0.001, interval_s=60, horizon_s=30 * 86_400)
STRIPE_KEY = "sk_test_payhooks_fake_stripe"


class FakeStripe:
    """Stripe's PaymentIntents API as far as the reconciler asks it."""

    def __init__(self) -> None:
        self.url = ""
        self.intents: dict[str, dict[str, Any]] = {}
        self.failures: list[int] = []
        self.asked: list[str] = []
        self.requests: list[web.Request] = []

    async def get(self, request: web.Request) -> web.Response:
        payment_id = request.match_info["payment_id"]
        self.asked.append(payment_id)
        self.requests.append(request)
        if request.headers.get("Authorization") != f"Bearer {STRIPE_KEY}":
            error = {"type": "invalid_request_error", "message": "Invalid API Key provided"}
            return web.json_response({"error": error}, status=401)
        if self.failures:
            error = {"type": "api_error", "message": "boom"}
            return web.json_response({"error": error}, status=self.failures.pop(0))
        intent = self.intents.get(payment_id)
        if intent is None:
            error = {
                "code": "resource_missing",
                "message": f"No such payment_intent: '{payment_id}'",
                "param": "intent",
                "type": "invalid_request_error",
            }
            return web.json_response({"error": error}, status=404)
        return web.Response(body=orjson.dumps(intent), content_type="application/json")


@pytest.fixture
async def stripe_api() -> Any:
    fake = FakeStripe()
    app = web.Application()
    app.router.add_get("/v1/payment_intents/{payment_id}", fake.get)
    server = TestServer(app)
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    yield fake
    await server.close()


def run_with(settings: Settings, topology: Topology, xhub_url: str, stripe_url: str | None) -> Any:
    """A reconciler pass runner: X-Hub's client, and Stripe's when `stripe_url` is given (as
    services/reconciler/app.py builds them when STRIPE_API_KEY is set)."""

    async def make() -> Any:
        pool = await create_pool(settings.database_url)
        broker = Broker(settings.amqp_url, topology)
        await broker.start()
        await broker.wait_connected(10)
        registry = CollectorRegistry()
        provider_metrics = ProviderMetrics.create(registry)
        policy = ProviderPolicy(backoff_base_s=0.01, backoff_max_s=0.05, rate_per_s=1000)
        xhub = ProviderClient(xhub_url, API_KEY, metrics=provider_metrics, policy=policy)
        others = {}
        api = BY_NAME["stripe"].payment_api
        assert api is not None
        if stripe_url is not None:
            others["stripe"] = ProviderClient.for_api(
                "stripe", api, stripe_url, STRIPE_KEY, provider_metrics
            )
        for client in (xhub, *others.values()):
            await client.start()
        metrics = ReconcilerMetrics.create(registry)

        async def run() -> int:
            return await reconcile_once(pool, broker, {"xhub": xhub, **others}, metrics, TIMING)

        async def close() -> None:
            for client in (xhub, *others.values()):
                await client.close()
            await broker.close()
            await pool.close()

        run.registry = registry  # type: ignore[attr-defined]
        run.close = close  # type: ignore[attr-defined]
        return run

    return make


@pytest.fixture
async def reconciler(
    settings: Settings, topology: Topology, provider: FakeProvider, stripe_api: FakeStripe
) -> Any:
    run = await run_with(settings, topology, provider.url, stripe_api.url)()
    yield run
    await run.close()


async def stripe_named(
    db: Any, payment_id: str, event_type: str = "charge.dispute.created", n: int = 1
) -> None:
    """A stored Stripe webhook that names the payment (the reconciler asks Stripe about
    payments Stripe's webhooks named), its order as if an hour had passed."""
    event_id = f"evt_{n}_{payment_id}"
    body = orjson.dumps(stripe_event(event_type, event_id=event_id, payment_id=payment_id))
    await db.execute(
        "INSERT INTO inbox (provider, event_id, event_type, payment_id, body, headers)"
        " VALUES ('stripe', $1, $2, $3, $4, '{}')",
        event_id,
        event_type,
        payment_id,
        body,
    )
    await make_stale(db, payment_id)


async def make_stale(db: Any, payment_id: str) -> None:
    await db.execute(
        "UPDATE orders SET updated_at = now() - interval '1 hour', reconciled_at = NULL,"
        " next_check_at = NULL WHERE payment_id = $1",
        payment_id,
    )


def checked(run: Any, *results: str) -> dict[str, float | None]:
    return {
        r: run.registry.get_sample_value("payhooks_reconcile_checked_total", {"result": r})
        for r in results
    }


async def test_a_lost_payment_intent_succeeded_is_repaired_from_stripes_api(
    system: System,
    smtp: tuple[SmtpSink, int],
    db: Any,
    provider: FakeProvider,
    stripe_api: FakeStripe,
    reconciler: Any,
) -> None:
    await register(db, "pi_lost_paid")
    await stripe_named(db, "pi_lost_paid")
    stripe_api.intents["pi_lost_paid"] = payment_intent("pi_lost_paid", "succeeded")

    assert await reconciler() == 1

    done = {"status": "PAID", "bonus": 500, "ledger": ["grant"], "emails": ["payment_succeeded"]}
    assert await eventually(lambda: effects(db, "pi_lost_paid"), lambda e: e == done) == done
    assert provider.asked == []  # X-Hub is not asked about a Stripe payment
    [request] = stripe_api.requests
    assert request.headers["Stripe-Version"] == "2024-06-20"
    assert request.query.getall("expand[]") == ["latest_charge.refunds"]
    assert checked(reconciler, "repaired")["repaired"] == 1
    # Counted as Stripe's request, X-Hub's at 0 (an alert on a refused key names its provider).
    requests = {
        provider: reconciler.registry.get_sample_value(
            "payhooks_provider_requests_total", {"provider": provider, "outcome": "ok"}
        )
        for provider in ("stripe", "xhub")
    }
    assert requests == {"stripe": 1, "xhub": 0}

    # Asked again: Stripe still says succeeded, nothing more happens.
    await stripe_named(db, "pi_lost_paid", "charge.dispute.closed", 2)
    await reconciler()
    assert await effects(db, "pi_lost_paid") == done
    assert len(smtp[0].messages) == 1


async def test_a_refund_found_at_stripe_refunds_the_order_and_claws_back(
    system: System, db: Any, stripe_api: FakeStripe, reconciler: Any
) -> None:
    await register(db, "pi_lost_refund")
    await stripe_named(db, "pi_lost_refund")
    stripe_api.intents["pi_lost_refund"] = payment_intent("pi_lost_refund", "succeeded")
    await reconciler()
    await eventually(lambda: effects(db, "pi_lost_refund"), lambda e: e["bonus"] == 500)

    # Refunded in full at Stripe since (its charge.refunded webhook lost too).
    stripe_api.intents["pi_lost_refund"] = payment_intent(
        "pi_lost_refund", "succeeded", refunded=10_000, at=int(time.time()) - 7200
    )
    await make_stale(db, "pi_lost_refund")
    await reconciler()

    refunded = {
        "status": "REFUNDED",
        "bonus": 0,
        "ledger": ["grant", "clawback"],
        "emails": ["payment_refunded", "payment_succeeded"],
    }
    assert await eventually(lambda: effects(db, "pi_lost_refund"), lambda e: e == refunded)


async def test_a_canceled_payment_intent_cancels_a_pending_order(
    system: System, db: Any, stripe_api: FakeStripe, reconciler: Any
) -> None:
    await register(db, "pi_lost_cancel")
    await stripe_named(db, "pi_lost_cancel")
    stripe_api.intents["pi_lost_cancel"] = payment_intent(
        "pi_lost_cancel", "canceled", cancellation_reason="abandoned"
    )

    await reconciler()

    found = await eventually(
        lambda: effects(db, "pi_lost_cancel"), lambda e: e["status"] == "CANCELLED"
    )
    assert found["bonus"] == 0


async def test_stripes_errors_are_counted_and_change_nothing(
    db: Any, amqp: Any, stripe_api: FakeStripe, reconciler: Any
) -> None:
    await register(db, "pi_unknown_to_stripe")
    await stripe_named(db, "pi_unknown_to_stripe")

    await reconciler()  # a 404 (resource_missing)

    assert checked(reconciler, "not_found")["not_found"] == 1
    status = await db.fetchval(
        "SELECT status FROM orders WHERE payment_id = 'pi_unknown_to_stripe'"
    )
    assert status == "PENDING"

    await register(db, "pi_flaky")
    await stripe_named(db, "pi_flaky")
    stripe_api.intents["pi_flaky"] = payment_intent("pi_flaky", "processing")
    stripe_api.failures = [500, 429]  # retried by the shared client, then answered
    await reconciler()
    assert stripe_api.asked.count("pi_flaky") == 3
    assert checked(reconciler, "in_sync")["in_sync"] == 1  # processing: nothing to repair


async def test_without_stripes_key_its_payments_are_not_asked_about(
    db: Any,
    settings: Settings,
    topology: Topology,
    provider: FakeProvider,
    stripe_api: FakeStripe,
) -> None:
    run = await run_with(settings, topology, provider.url, None)()
    try:
        await register(db, "pi_no_key")
        await stripe_named(db, "pi_no_key")
        stripe_api.intents["pi_no_key"] = payment_intent("pi_no_key", "succeeded")

        assert await run() == 1

        assert stripe_api.asked == provider.asked == []  # neither Stripe nor X-Hub
        assert checked(run, "no_provider_api")["no_provider_api"] == 1
    finally:
        await run.close()


def test_the_reconciler_service_builds_stripes_client_from_its_key(
    make_settings: Any,
) -> None:
    with_key = make_settings(
        XHUB_API_URL="http://127.0.0.1:9", XHUB_API_KEY="k", STRIPE_API_KEY=STRIPE_KEY
    )
    assert with_key.provider_apis == {"stripe": ("https://api.stripe.com", STRIPE_KEY)}
    reconciler_service(with_key)  # builds (no I/O until it starts)
