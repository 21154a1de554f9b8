"""The reconciler against a real local provider API and the real workers: a lost webhook is
repaired once, a late real webhook changes nothing twice, provider errors never stop it, two
reconcilers do one repair."""

from __future__ import annotations

import asyncio
import socket
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from services.reconciler import schedule
from services.reconciler.app import create_app as reconciler_service
from services.reconciler.app import payment_clients
from services.reconciler.jobs import Reconciler, reconcile_once
from shared.amqp.broker import Broker
from shared.amqp.topology import Topology
from shared.config import ConfigError, Settings
from shared.db import create_pool
from shared.metrics import ProviderMetrics, ReconcilerMetrics
from shared.process.web import REGISTRY
from shared.providers.xhub.client import ProviderClient, ProviderPolicy
from shared.queries import orders as orders_sql
from shared.queries import schedule as schedule_sql
from shared.queries.schedule import Timing
from tests.conftest import SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.provider import API_KEY, FakeProvider
from tests.integration.system import (
    System,
    effects,
    post,
    quiescent,
    register,
)

# Due 1 ms after a change (tests backdate updated_at), again after a minute at the soonest.
TIMING = Timing(after_s=0.001, interval_s=60, horizon_s=30 * 86_400)


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
        return await reconcile_once(pool, broker, {"xhub": client}, metrics, TIMING)

    run.registry = registry  # type: ignore[attr-defined]
    yield run
    await client.close()
    await broker.close()
    await pool.close()


async def make_stale(db: Any, payment_id: str) -> None:
    """As if an hour passed since the order's last change and its last reconciliation."""
    await db.execute(
        "UPDATE orders SET updated_at = now() - interval '1 hour', reconciled_at = NULL,"
        " next_check_at = NULL WHERE payment_id = $1",
        payment_id,
    )


async def test_lost_webhook_is_repaired_once_and_the_late_webhook_changes_nothing(
    system: System,
    smtp: tuple[SmtpSink, int],
    db: Any,
    provider: FakeProvider,
    reconciler: Any,
) -> None:
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
        registry.get_sample_value(
            "payhooks_provider_requests_total", {"provider": "xhub", "outcome": "server_error"}
        )
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
    system: System,
    db: Any,
    provider: FakeProvider,
    reconciler: Any,
) -> None:
    """SPEC 6, "PAID but never SETTLED": the provider refunded the payment, the webhook never
    arrived; the reconciler asks about the PAID order and the refund's effects follow."""
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


async def test_orders_in_every_state_are_asked_about_and_rescheduled(
    db: Any, amqp: Any, topology: Topology, provider: FakeProvider, reconciler: Any
) -> None:
    """SPEC 6: every state is asked about after its last change, final ones included (a
    SETTLED payment can still be refunded, a CANCELLED one paid), then at growing intervals
    until the horizon."""
    for payment_id, status, changed, next_check, reversed_refunds in (
        ("pay_new", "PENDING", "2 hours", None, []),  # never asked since its change: due
        ("pay_paid_new", "PAID", "2 hours", None, []),  # waiting for settlement: due
        ("pay_paid_due", "PAID", "3 days", "-1 hour", []),  # due again
        ("pay_paid_later", "PAID", "3 days", "23 hours", []),  # asked lately: not yet
        ("pay_paid_old", "PAID", "31 days", None, []),  # past the 30-day horizon
        ("pay_paid_reversed", "PAID", "2 hours", None, ["r1"]),  # a refund again is possible
        ("pay_settled", "SETTLED", "2 hours", None, []),  # can still be refunded
        ("pay_cancelled", "CANCELLED", "20 days", None, []),  # can still be paid
        ("pay_refunded", "REFUNDED", "1 day", "-1 minute", []),  # can still be reversed
        ("pay_done", "SETTLED", "40 days", "infinity", []),  # asked at the horizon: never again
    ):
        await register(db, payment_id, status=status)
        await db.execute(
            "UPDATE orders SET updated_at = now() - $2::text::interval,"
            " next_check_at = CASE WHEN $3::text = 'infinity' THEN 'infinity'"
            " ELSE now() + $3::text::interval END, reversed_refund_ids = $4"
            " WHERE payment_id = $1",
            payment_id,
            changed,
            next_check,
            reversed_refunds,
        )
        provider.set(payment_id, status.lower())

    assert await reconciler() == 7
    assert sorted(provider.asked) == [
        "pay_cancelled",
        "pay_new",
        "pay_paid_due",
        "pay_paid_new",
        "pay_paid_reversed",
        "pay_refunded",
        "pay_settled",
    ]
    ahead = {
        r["payment_id"]: float(r["ahead_s"])
        for r in await db.fetch(
            "SELECT payment_id, extract(epoch FROM next_check_at - now()) AS ahead_s"
            " FROM orders WHERE payment_id = ANY($1::text[])",
            provider.asked,
        )
    }
    hour, day = 3_600, 86_400

    def about(seconds: float) -> Any:
        return pytest.approx(seconds, abs=10)

    # Unpaid money: again after a quarter of its age (2 hours), at least RECONCILE_INTERVAL.
    assert ahead["pay_new"] == about(0.5 * hour)
    # Any other state: again after as long as it has been unchanged, within the horizon.
    for payment_id in ("pay_paid_new", "pay_paid_reversed", "pay_settled"):
        assert ahead[payment_id] == about(2 * hour)
    assert ahead["pay_paid_due"] == about(3 * day)
    assert ahead["pay_refunded"] == about(day)
    assert ahead["pay_cancelled"] == about(10 * day)  # not 20: the horizon is day 30
    assert await reconciler() == 0  # nothing is due twice in a row


async def test_the_last_question_is_at_the_horizon(db: Any, reconciler: Any) -> None:
    """An order rescheduled close to its horizon is asked there once more, then never."""
    await register(db, "pay_horizon", status="SETTLED")
    await db.execute(
        "UPDATE orders SET updated_at = now() - interval '30 days 1 minute',"
        " next_check_at = now() - interval '2 minutes' WHERE payment_id = 'pay_horizon'"
    )

    assert await reconciler() == 1
    assert await db.fetchval(
        "SELECT next_check_at = 'infinity' FROM orders WHERE payment_id = 'pay_horizon'"
    )


async def claimed_in_order(db: Any, size: int) -> list[str]:
    return [r["payment_id"] for r in await schedule.claim(db, size, TIMING)]


async def backdate(db: Any, payment_id: str, status: str, changed: str, due: str | None) -> None:
    """An order last changed `changed` ago, due `due` ago (None: never asked since)."""
    await register(db, payment_id, status=status)
    await db.execute(
        "UPDATE orders SET updated_at = now() - $2::text::interval,"
        " next_check_at = now() - $3::text::interval WHERE payment_id = $1",
        payment_id,
        changed,
        due,
    )


async def test_undecided_money_is_asked_before_every_other_state(db: Any) -> None:
    """SPEC 6: however many older orders are due, a flagged order, then PENDING and
    AMOUNT_MISMATCH, come before settlement checks and rechecks; within a class the most
    overdue first; the others keep a tenth of each claim."""
    for i in range(20):
        await backdate(db, f"pay_old_paid_{i}", "PAID", "20 days", None)
        await backdate(db, f"pay_old_settled_{i}", "SETTLED", "20 days", "1 day")
    await backdate(db, "pay_pending_late", "PENDING", "3 hours", "10 minutes")
    await backdate(db, "pay_pending_later", "PENDING", "1 hour", "1 minute")
    await backdate(db, "pay_mismatch", "AMOUNT_MISMATCH", "2 hours", None)
    await register(db, "pay_flagged", status="REFUNDED")
    await orders_sql.flag_undecided(db, "pay_flagged", "reversal_before_refund")

    first = await claimed_in_order(db, 10)

    # flagged, then the money class most overdue first (pay_mismatch was due 2 hours ago
    # less 1 ms), then the rest of the nine tenths goes unused by money: settlement and
    # rechecks follow, the oldest due first.
    assert first[:4] == ["pay_flagged", "pay_mismatch", "pay_pending_late", "pay_pending_later"]
    assert all(p.startswith("pay_old_paid_") for p in first[4:])
    assert len(first) == 10


async def test_a_flood_of_undecided_money_leaves_a_tenth_to_the_other_classes(db: Any) -> None:
    for i in range(30):
        await backdate(db, f"pay_cart_{i}", "PENDING", "3 hours", "1 minute")
    for i in range(3):
        await backdate(db, f"pay_to_settle_{i}", "PAID", "20 days", None)

    claimed = await claimed_in_order(db, 20)

    assert sum(p.startswith("pay_cart_") for p in claimed) == 18
    assert sum(p.startswith("pay_to_settle_") for p in claimed) == 2


async def test_a_failing_provider_ends_the_pass_and_the_rest_stay_due(
    db: Any, amqp: Any, topology: Topology, provider: FakeProvider, reconciler: Any
) -> None:
    """Backoff on provider errors: the first order's retries fail, so the pass stops instead
    of asking about every other order too; those are due again next pass."""
    for i in range(5):
        await register(db, f"pay_down_{i}")
        await make_stale(db, f"pay_down_{i}")
        provider.set(f"pay_down_{i}", "paid")
    provider.failures = [503] * 100

    assert await reconciler() == 0

    assert len(set(provider.asked)) == 1  # one order, its retries; none of the others
    provider.failures = []
    assert await reconciler() == 5  # the four never asked and the failed one, all due


@pytest.mark.parametrize(
    ("provider_amount", "status", "expected"),
    [("99.995", "paid", "AMOUNT_MISMATCH"), ("100.004", "paid", "AMOUNT_MISMATCH"),
     ("100.00", "Paid", "PAID")],
)  # fmt: skip
async def test_the_synthetic_event_carries_the_provider_amount_and_status_exactly(
    system: System,
    db: Any,
    provider: FakeProvider,
    reconciler: Any,
    provider_amount: str,
    status: str,
    expected: str,
) -> None:
    """No rounding on the way (99.995 must not become a matching 100.00, which would grant a
    bonus for an underpayment); the provider's status is read case-insensitively."""
    await register(db, "pay_exact")
    await make_stale(db, "pay_exact")
    provider.set("pay_exact", status, amount=provider_amount)

    await reconciler()

    got = await eventually(
        lambda: db.fetchval("SELECT status FROM orders WHERE payment_id = 'pay_exact'"),
        lambda s: s != "PENDING",
    )
    assert got == expected
    await asyncio.sleep(0.3)  # the effects that follow a transition, if any, have run
    bonus = await db.fetchval(
        "SELECT coalesce(sum(points), 0) FROM bonus_ledger WHERE payment_id = 'pay_exact'"
    )
    assert bonus == (500 if expected == "PAID" else 0)


# --- refunds the webhooks left wrong, and events the state machine could not decide ----------

REFUNDED_AT = "2026-11-30T11:00:00+00:00"


async def refunded_order(system: Any, db: Any, payment_id: str) -> None:
    """An order paid, then refunded at REFUNDED_AT (provider time), with both effects done."""
    await register(db, payment_id)
    await post(system.ingest, payment_event(payment_id, "paid"))
    await quiescent(db, system)  # the orders worker may take two messages in either order
    await post(system.ingest, payment_event(payment_id, "refunded", created_at=REFUNDED_AT))
    await quiescent(db, system)
    assert (await effects(db, payment_id))["ledger"] == ["grant", "clawback"]


async def test_refunded_order_whose_reversal_webhook_was_lost_is_paid_again_with_its_bonus(
    system: System,
    db: Any,
    provider: FakeProvider,
    reconciler: Any,
) -> None:
    """The provider reversed the refund (its payment says paid again, changed after the
    refund); the refund.reversed webhook never came. REFUNDED orders are asked about too."""
    await refunded_order(system, db, "pay_reversal_lost")
    await make_stale(db, "pay_reversal_lost")
    provider.set("pay_reversal_lost", "paid")  # updated now: after the refund

    await reconciler()

    paid_again = {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant", "clawback", "restore"],
        "emails": ["payment_refunded", "payment_succeeded"],
    }
    assert await eventually(lambda: effects(db, "pay_reversal_lost"), lambda e: e == paid_again)
    repairs = reconciler.registry.get_sample_value(
        "payhooks_reconcile_repairs_total", {"from": "REFUNDED", "to": "PAID"}
    )
    assert repairs == 1


async def test_a_provider_still_paid_from_before_the_refund_leaves_a_refunded_order(
    system: System,
    db: Any,
    provider: FakeProvider,
    reconciler: Any,
) -> None:
    """A provider whose payment status does not follow refunds says "paid" with a time before
    the refund: no evidence of a reversal, the order stays REFUNDED."""
    await refunded_order(system, db, "pay_still_paid")
    await make_stale(db, "pay_still_paid")
    provider.set("pay_still_paid", "paid")
    provider.payments["pay_still_paid"]["updated_at"] = "2026-11-30T10:00:00+00:00"

    assert await reconciler() == 1
    await asyncio.sleep(0.5)  # a repair, had one been sent, would have been applied
    assert (await effects(db, "pay_still_paid"))["status"] == "REFUNDED"
    in_sync = reconciler.registry.get_sample_value(
        "payhooks_reconcile_checked_total", {"result": "in_sync"}
    )
    assert in_sync == 1


@pytest.fixture
async def reconciler_app(
    aiohttp_client: Any, make_settings: Any, provider: FakeProvider, smtp: tuple[SmtpSink, int]
) -> Any:
    """The reconciler service itself, whose interval is far too long to matter: only the
    orders worker's flag can make it ask about an order during the test."""
    settings = make_settings(
        XHUB_API_URL=provider.url, XHUB_API_KEY=API_KEY, RECONCILE_INTERVAL="3600"
    )
    return await aiohttp_client(reconciler_service(settings))


async def undecided(db: Any, payment_id: str) -> Any:
    return await db.fetchrow(
        "SELECT status, undecided_since, undecided_reason FROM orders WHERE payment_id = $1",
        payment_id,
    )


@pytest.mark.parametrize(
    ("provider_says", "final", "ledger"),
    [
        ("refunded", "REFUNDED", ["grant", "clawback"]),  # the model's safe choice was right
        ("paid", "PAID", ["grant", "clawback", "restore"]),  # the refund was reversed
    ],
)
async def test_a_reversal_not_provably_after_the_refund_is_asked_about_at_once(
    system: System,
    db: Any,
    provider: FakeProvider,
    reconciler_app: Any,
    provider_says: str,
    final: str,
    ledger: list[str],
) -> None:
    """Seed 004: "if the state can't be determined, ask the provider". A refund.reversed
    dated before the refund that made the order REFUNDED is undecidable (D6): the order stays
    REFUNDED, is flagged, and the reconciler asks at once (not at its next interval); the
    answer decides, and the flag goes."""
    payment_id = f"pay_undecided_{provider_says}"
    await refunded_order(system, db, payment_id)
    provider.set(payment_id, provider_says)  # updated now: after the refund
    reversal = {
        "event": "refund.reversed",
        "payment_id": payment_id,
        "refund_id": "r-early",
        "amount": "100.00",
        "currency": "USD",
        "created_at": "2026-11-30T10:30:00+00:00",  # before REFUNDED_AT
    }
    await post(system.ingest, reversal)

    assert await eventually(lambda: asyncio.sleep(0, provider.asked), lambda a: payment_id in a)
    row = await eventually(
        lambda: undecided(db, payment_id), lambda r: r["undecided_since"] is None, timeout_s=10
    )
    assert row["status"] == final
    assert await eventually(lambda: effects(db, payment_id), lambda e: e["ledger"] == ledger)
    orders_registry = system.clients["orders"][0].app[REGISTRY]
    assert (
        orders_registry.get_sample_value(
            "payhooks_orders_undecided_events_total", {"reason": "reversal_before_refund"}
        )
        == 1
    )


async def test_an_undecided_order_the_provider_cannot_settle_stays_flagged(
    system: System,
    db: Any,
    provider: FakeProvider,
    reconciler_app: Any,
) -> None:
    """A paid of the wrong amount on a PAID order (D2), and a provider that also says the
    wrong amount: nothing the model may do on its own; the order stays PAID and flagged (the
    PayhooksOrderUndecided alert ages it) and the payment view says so."""
    payment_id = "pay_undecided_amount"
    await register(db, payment_id)
    await post(system.ingest, payment_event(payment_id, "paid"))
    await quiescent(db, system)
    provider.set(payment_id, "paid", amount="90.00")
    await post(system.ingest, payment_event(payment_id, "settled", amount="90.00"))

    assert await eventually(lambda: asyncio.sleep(0, provider.asked), lambda a: payment_id in a)
    await asyncio.sleep(0.3)
    row = await undecided(db, payment_id)
    assert (row["status"], row["undecided_reason"]) == ("PAID", "amount_mismatch_ignored")
    assert row["undecided_since"] is not None
    registry = reconciler_app.app[REGISTRY]
    assert await eventually(
        lambda: asyncio.sleep(
            0,
            registry.get_sample_value("payhooks_reconcile_checked_total", {"result": "undecided"}),
        ),
        lambda v: v == 1,
    )


async def test_a_repair_the_broker_did_not_take_is_asked_again_when_its_lease_runs_out(
    db: Any, topology: Topology, provider: FakeProvider
) -> None:
    """The broker blinked as the repair was published: the order is not pushed to its next
    growing interval (days, for an old SETTLED one) but due again after the claim's lease;
    the orders the provider did answer about go to their next interval."""
    await register(db, "pay_unpublished", status="SETTLED")
    await register(db, "pay_in_sync", status="SETTLED")
    for payment_id in ("pay_unpublished", "pay_in_sync"):
        await db.execute(
            "UPDATE orders SET updated_at = now() - interval '10 days', next_check_at = NULL"
            " WHERE payment_id = $1",
            payment_id,
        )
    provider.set("pay_unpublished", "refunded")  # a lost refund: a repair to publish
    provider.set("pay_in_sync", "settled")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    broker = Broker(f"amqp://guest:guest@127.0.0.1:{closed_port}/", topology)  # never there
    registry = CollectorRegistry()
    client = ProviderClient(
        provider.url, API_KEY, metrics=ProviderMetrics.create(registry),
        policy=ProviderPolicy(rate_per_s=1000),
    )  # fmt: skip
    await client.start()
    try:
        metrics = ReconcilerMetrics.create(registry)
        assert await reconcile_once(db, broker, {"xhub": client}, metrics, TIMING) == 2
    finally:
        await client.close()
        await broker.close()

    ahead = {
        r["payment_id"]: float(r["ahead_s"])
        for r in await db.fetch(
            "SELECT payment_id, extract(epoch FROM next_check_at - now()) AS ahead_s"
            " FROM orders WHERE payment_id = ANY($1::text[])",
            ["pay_unpublished", "pay_in_sync"],
        )
    }
    assert ahead["pay_unpublished"] == pytest.approx(TIMING.lease_s, abs=10)
    assert ahead["pay_in_sync"] == pytest.approx(10 * 86_400, abs=10)
    assert metrics.checked.labels(result="publish_failed")._value.get() == 1


async def test_an_order_changed_while_it_was_asked_about_keeps_its_new_schedule(
    db: Any,
) -> None:
    """The orders worker changed the order between the claim and the answer (a webhook came):
    due RECONCILE_AFTER after that change, not at the answer's next interval."""
    await register(db, "pay_changed_meanwhile", status="PAID")
    await db.execute(
        "UPDATE orders SET updated_at = now() - interval '2 hours'"
        " WHERE payment_id = 'pay_changed_meanwhile'"
    )
    [row] = await schedule.claim(db, 10, TIMING)
    await orders_sql.save_order_states(
        db,
        [orders_sql.OrderStateRow("pay_changed_meanwhile", "SETTLED", Decimal(0), None, [], [])],
    )

    await schedule_sql.schedule_next(db, [row])

    assert (
        await db.fetchval(
            "SELECT next_check_at FROM orders WHERE payment_id = 'pay_changed_meanwhile'"
        )
        is None
    )


async def test_a_payment_known_only_from_a_provider_without_an_api_is_not_asked_about(
    db: Any, provider: FakeProvider, reconciler: Any
) -> None:
    """Standard Webhooks has no payments API (docs/providers.md): its payments' orders are
    rescheduled without a question to X-Hub's API, where they would only be a 404."""
    for payment_id in ("pay_std_quiet", "pay_std_and_xhub"):
        await register(db, payment_id)
        await make_stale(db, payment_id)
    stored = [("standard", "msg_1", "pay_std_quiet"), ("standard", "msg_2", "pay_std_and_xhub")]
    stored.append(("xhub", "evt_3", "pay_std_and_xhub"))
    for source, event_id, payment_id in stored:
        await db.execute(
            "INSERT INTO inbox (provider, event_id, event_type, payment_id, body, headers)"
            " VALUES ($1, $2, 'payment.status_changed', $3, '{}', '{}')",
            source,
            event_id,
            payment_id,
        )
    provider.set("pay_std_and_xhub", "paid")

    assert await reconciler() == 2

    assert provider.asked == ["pay_std_and_xhub"]  # only the payment X-Hub spoke of too
    checked = {
        result: reconciler.registry.get_sample_value(
            "payhooks_reconcile_checked_total", {"result": result}
        )
        for result in ("no_provider_api", "repaired", "not_found")
    }
    assert checked == {"no_provider_api": 1, "repaired": 1, "not_found": 0}
    quiet = await db.fetchrow(
        "SELECT status, next_check_at FROM orders WHERE payment_id = 'pay_std_quiet'"
    )
    assert quiet["status"] == "PENDING"
    assert quiet["next_check_at"] is not None  # asked again later, at growing intervals


def test_xhub_s_api_is_required_only_where_xhub_s_webhooks_are_accepted(
    make_settings: Any,
) -> None:
    """X-Hub's lost webhooks are repaired only by asking it: its secrets without its API stop
    the reconciler at start; a deployment without X-Hub runs it with the APIs it has."""
    metrics = ProviderMetrics.create(CollectorRegistry())
    with pytest.raises(ConfigError, match="XHUB_API_URL is required"):
        payment_clients(make_settings(), metrics)  # the tests' XHUB_WEBHOOK_SECRETS, no API
    without_xhub = make_settings(XHUB_WEBHOOK_SECRETS="")
    assert payment_clients(without_xhub, metrics) == {}
    stripe_only = make_settings(XHUB_WEBHOOK_SECRETS="", STRIPE_API_KEY="sk_test_key")
    assert list(payment_clients(stripe_only, metrics)) == ["stripe"]


async def test_a_reconciler_without_a_payment_api_asks_nothing_and_keeps_the_housekeeping(
    db: Any, settings: Settings, topology: Topology
) -> None:
    await register(db, "pay_nobody_to_ask")
    await make_stale(db, "pay_nobody_to_ask")
    # The partition of three days ahead gone: the housekeeping makes it again.
    ahead = await db.fetchval("SELECT (now() AT TIME ZONE 'UTC')::date + 3")
    await db.execute("SELECT payhooks_drop_inbox_partition($1)", ahead)
    part = f"inbox_p{ahead:%Y%m%d}"
    assert await db.fetchval("SELECT to_regclass($1)", part) is None
    pool = await create_pool(settings.database_url)
    broker = Broker(settings.amqp_url, topology)
    await broker.start()
    try:
        await broker.wait_connected(10)
        registry = CollectorRegistry()
        reconciler = Reconciler(pool, broker, {}, ReconcilerMetrics.create(registry), settings)
        await asyncio.wait_for(reconciler.run_pass(), 10)
    finally:
        await broker.close()
        await pool.close()

    assert await db.fetchval("SELECT to_regclass($1)::text", part) == part
    assert registry.get_sample_value("payhooks_reconcile_budget_calls_per_second") == 0
    row = await db.fetchrow(
        "SELECT status, next_check_at FROM orders WHERE payment_id = 'pay_nobody_to_ask'"
    )
    assert (row["status"], row["next_check_at"]) == ("PENDING", None)  # never claimed
