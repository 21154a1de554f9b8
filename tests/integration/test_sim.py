"""End to end through the simulator: payments with duplicates, reordering, concurrency and lost
webhooks (single ones, any in a flow), delivered by the simulator's deliverer to the real
ingest, worked by orders, bonuses and email, and repaired by reconcile_once against the
simulator's API."""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from bench.processes import free_port
from services.reconciler.jobs import reconcile_once
from services.sim import run as sim_run
from services.sim import scenario
from services.sim.api import PaymentBook, start_api
from services.sim.deliverer import Deliverer, Result, SimWebhook
from services.sim.delivery_rules import FailReason
from services.sim.summary import actual_effects, expect_from_webhooks, mismatches, summarize
from shared.amqp.broker import Broker
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.db import create_pool
from shared.errors import EXIT_OK
from shared.metrics import ProviderMetrics, ReconcilerMetrics
from shared.providers.xhub.client import ProviderClient, ProviderPolicy
from shared.providers.xhub.signatures import verify
from shared.queries import orders as orders_sql
from shared.queries.schedule import Timing
from shared.vocabulary import OrderStatus
from tests.conftest import TEST_SECRETS, SmtpSink
from tests.helpers import eventually
from tests.integration.system import depths, dlqs, smtp_counts, start_system, system_settings
from tests.proxy import TcpProxy

# Due after 1 ms (the orders are fresh), asked again after a minute, within 30 days.
TIMING = Timing(after_s=0.001, interval_s=60, horizon_s=30 * 86_400)

API_KEY = "sim-provider-key"
# The run: 500 payments, duplicates, reordering, concurrency 20, 5 % of the webhooks
# lost; the flows whose lost last webhooks leave the order PENDING or PAID.
CONFIG = scenario.ScenarioConfig(
    payments=500,
    flows=dict.fromkeys(("paid", "settled", "refunded", "expired"), 1.0),
    duplicate_rate=0.2,
    reorder_rate=0.3,
    lost_rate=0.05,
    concurrency=20,
    merchants=3,
    seed=5,
)
# Refunds after settlement and payments after expiry with a fifth of their webhooks lost
# (issue 37): a lost last webhook leaves the order SETTLED or CANCELLED, a final state.
FINAL_STATES = scenario.ScenarioConfig(
    payments=80,
    flows={"settled_refunded": 1.0, "expired_paid": 1.0},
    duplicate_rate=0.2,
    reorder_rate=0.3,
    lost_rate=0.2,
    concurrency=20,
    merchants=3,
    seed=6,
)
# Provider time runs 100x faster: the fast ladder's 1..256 s pauses take 0.01..2.56 s, the
# circuit breaker's 5-minute pause 3 s.
TIME_SCALE = 100.0
OUTAGE_S = 2.0


async def _outage(proxy: TcpProxy, after_s: float) -> None:
    """Ingest unreachable for a while in the middle of the run (connections refused/reset)."""
    await asyncio.sleep(after_s)
    proxy.cut()
    await asyncio.sleep(OUTAGE_S)
    proxy.restore()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("outage", [False, True], ids=["steady", "ingest_outage"])
async def test_simulated_traffic_ends_in_the_expected_state(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
    outage: bool,
) -> None:
    plan = scenario.generate(CONFIG)
    behind = {expect_from_webhooks(p).status for p in plan.payments if p.lost}
    assert behind >= {OrderStatus.PENDING, OrderStatus.PAID}, "repairs from PENDING and PAID"
    await _run(plan, aiohttp_client, make_settings, smtp, amqp, topology, db, outage=outage)


@pytest.mark.timeout(90)
async def test_lost_refunds_after_settlement_and_lost_payments_after_expiry_are_repaired(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    plan = scenario.generate(FINAL_STATES)
    repairs = {(expect_from_webhooks(p).status, p.final_status) for p in plan.payments if p.lost}
    assert repairs >= {(OrderStatus.SETTLED, "refunded"), (OrderStatus.CANCELLED, "paid")}
    await _run(plan, aiohttp_client, make_settings, smtp, amqp, topology, db, outage=False)


async def _run(
    plan: scenario.Plan,
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
    *,
    outage: bool,
) -> None:
    """Deliver the plan, check what the webhooks alone achieved, reconcile, check the end."""
    settings: Settings = system_settings(make_settings, smtp[1])
    system = await start_system(aiohttp_client, settings, amqp, topology)
    to_repair = [p for p in plan.payments if p.events[-1].event_id in p.lost_ids]
    assert to_repair, "the seed must lose some last webhooks so reconciliation has work"
    assert any(p.lost and p not in to_repair for p in plan.payments), "and some covered ones"
    assert any(p.reordered for p in plan.payments)
    assert any(copy for _, copy in plan.sends)

    book = PaymentBook()
    scenario.publish_to_api(plan, book)
    runner, api_url = await start_api(book, API_KEY)
    pool = await create_pool(settings.database_url)
    broker = Broker(settings.amqp_url, topology)
    registry = CollectorRegistry()
    client = ProviderClient(
        api_url,
        API_KEY,
        metrics=ProviderMetrics.create(registry),
        policy=ProviderPolicy(backoff_base_s=0.01, backoff_max_s=0.05, rate_per_s=1000),
    )
    try:
        await broker.start()
        await broker.wait_connected(10)
        await client.start()
        assert await scenario.register_orders(pool, plan.payments) == len(plan.payments)

        ingest = system.ingest.server
        async with TcpProxy(ingest.host, ingest.port) as proxy:  # type: ignore[arg-type]
            # Every delivery goes through the proxy, which can take ingest off the network.
            ingest_url = f"http://{proxy.address}"
            breaker = asyncio.create_task(_outage(proxy, 0.2)) if outage else None
            async with Deliverer(
                ingest_url,
                TEST_SECRETS[0].encode(),
                time_scale=TIME_SCALE,
                concurrency=CONFIG.concurrency,
            ) as deliverer:
                records = await scenario.deliver(plan, deliverer)
            if breaker is not None:
                await breaker
        if outage:
            retried = [r for r in records if r.attempts > 1]
            assert retried, "the outage must have made the simulator retry"
        summary = summarize(records, plan.payments)
        results = {r.result for r in records}
        assert results <= {Result.DELIVERED, Result.LOST}, summary.render()
        assert summary.counts()["LOST"] == sum(len(p.lost_ids) for p in plan.payments)
        assert summary.counts()["needs_repair"] == len(to_repair)

        # Webhooks first: each payment gets where its webhooks take it (a lost webhook that a
        # later one covers changes nothing; a lost last one leaves the order behind).
        every = [p.payment_id for p in plan.payments]
        before = [expect_from_webhooks(p) for p in plan.payments]
        await eventually(
            lambda: actual_effects(db, every), lambda a: not mismatches(before, a), timeout_s=20
        )

        # Then reconciliation against the simulator's API repairs the ones left behind.
        metrics = ReconcilerMetrics.create(registry)
        checked = 0
        while True:
            batch = await reconcile_once(pool, broker, {"xhub": client}, metrics, TIMING, 100)
            checked += batch
            if batch < 100:
                break
        assert checked >= len(to_repair)
        actual = await eventually(
            lambda: actual_effects(db, every),
            lambda a: not mismatches(summary.expectations, a),
            timeout_s=15,
        )
        assert mismatches(summary.expectations, actual) == {}
        repairs = registry.get_sample_value(
            "payhooks_reconcile_checked_total", {"result": "repaired"}
        )
        assert repairs == len(to_repair)
        # One transition per repaired payment carries the reconciler's synthetic event id.
        assert await orders_sql.reconciled_transitions(db, every) == len(to_repair)

        # Every email reached SMTP once; nothing was dead-lettered.
        assert all(n == 1 for n in smtp_counts(smtp[0]).values())
        assert len(smtp[0].messages) == sum(len(a["emails"]) for a in actual.values())
        assert await depths(amqp, dlqs(topology)) == dict.fromkeys(dlqs(topology), 0)
    finally:
        await client.close()
        await broker.close()
        await pool.close()
        await runner.cleanup()


async def test_sim_command_checks_every_payment_and_prints_the_outcome_table(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`payhooks sim --check` (what `make demo` runs) against a running system: exit 0, the
    `check:` line and the table with payments, states, bonus, emails, repairs, dead letters."""
    settings: Settings = make_settings(
        SMTP_PORT=str(smtp[1]), EMAIL_FROM="shop@example.test", XHUB_API_KEY=API_KEY
    )
    system = await start_system(aiohttp_client, settings, amqp, topology)
    ingest = system.ingest.server
    args = argparse.Namespace(
        ingest_url=f"http://{ingest.host}:{ingest.port}",
        api_host="127.0.0.1",
        api_port=free_port(),
        payments=12,
        duplicates=0.2,
        reorder=0.2,
        lost=0.0,  # nothing for a reconciler to repair: none runs here
        concurrency=4,
        merchants=2,
        flows={"paid": 1, "refunded": 1},
        seed=3,
        time_scale=100.0,
        timeout=5.0,
        linger=1.0,
        check=True,
        check_timeout=20.0,
        json=False,
        burst=False,
    )
    assert await sim_run.command(settings, args) == EXIT_OK
    out = capsys.readouterr().out
    assert "check: 12/12 payments as expected" in out
    table = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1)
        for line in out[out.index("OUTCOME") :].splitlines()[1:]
        if line.strip()
    )
    assert table["payments"] == "12 (12 as expected)"
    assert table["lost webhooks"] == "0 (0 payments left for the reconciler)"
    assert table["repairs"].startswith("0 transitions")
    assert table["dead letters"] == "orders.dlq 0, bonuses.dlq 0, emails.dlq 0"
    # The table counts emails sent; a success email its refund overtook is recorded, skipped.
    emails = await db.fetchval("SELECT count(*) FROM emails_sent WHERE NOT skipped")
    assert str(emails) == str(sum(int(n) for n in re.findall(r"\d+", table["emails"])))


class Flaky:
    """An ingest stand-in answering a scripted list of statuses, then 200."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.seen: list[tuple[str, bool]] = []  # (event id, signature verifies)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        ok = verify(
            [TEST_SECRETS[0].encode()],
            request.headers["X-Webhook-Timestamp"],
            body,
            request.headers["X-Webhook-Signature"],
        )
        self.seen.append((request.headers["X-Webhook-Id"], ok))
        status = self.script.pop(0) if self.script else 200
        return web.json_response({}, status=status)


async def _deliver_to(
    aiohttp_server: Any, script: list[int], status: str, time_scale: float = 1000.0
) -> tuple[Flaky, Any]:
    flaky = Flaky(script)
    app = web.Application()
    app.router.add_post("/webhooks/xhub", flaky.handle)
    server = await aiohttp_server(app)
    webhook = SimWebhook(
        event_id="evt_1",
        merchant_id="m",
        payload={"event": "payment.status_changed", "payment_id": "p1", "status": status},
    )
    url = str(server.make_url("")).rstrip("/")
    async with Deliverer(url, TEST_SECRETS[0].encode(), time_scale=time_scale) as deliverer:
        record = await deliverer.deliver(webhook)
    return flaky, record


async def test_deliverer_follows_the_fast_ladder_and_signs_every_attempt(
    aiohttp_server: Any,
) -> None:
    flaky, record = await _deliver_to(aiohttp_server, [503, 500, 429], "paid")
    assert (record.result, record.attempts) == (Result.DELIVERED, 4)
    assert record.http_statuses == [503, 500, 429, 200]
    assert flaky.seen == [("evt_1", True)] * 4


async def test_deliverer_fails_a_non_money_4xx_at_once_and_slow_ladders_a_money_one(
    aiohttp_server: Any,
) -> None:
    _, record = await _deliver_to(aiohttp_server, [400], "expired")
    assert (record.result, record.attempts, record.reason) == (
        Result.FAILED,
        1,
        FailReason.CLIENT_ERROR,
    )
    # 15 min then 1 h of slow ladder at 1 simulated hour per 10 ms.
    _, record = await _deliver_to(aiohttp_server, [400, 404], "paid", time_scale=360_000.0)
    assert (record.result, record.attempts) == (Result.DELIVERED, 3)


async def test_deliverer_gives_up_after_ten_fast_attempts(aiohttp_server: Any) -> None:
    _, record = await _deliver_to(aiohttp_server, [502] * 10, "paid", time_scale=100_000.0)
    assert (record.result, record.attempts) == (Result.FAILED, 10)
    assert record.reason is FailReason.FAST_LADDER_EXHAUSTED
