"""Ingest under overload: 200 only for what is stored and confirmed, 503 with Retry-After
for the rest before any work (a predicted wait past the budget, answered after a short hold;
at once: the acceptor's cap on waiting webhooks, RabbitMQ blocking publishers), never a wait
past the provider's budget. The breaker-release burst a healthy ingest must take whole is
test_ingest_burst.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from bench.raw_http import OneShotSender
from services.ingest.accept import AcceptorConfig
from services.ingest.admission import AdmissionConfig
from services.ingest.app import create_app
from services.ingest.endpoint import REFUSAL_HOLD_S
from services.sim.deliverer import TIMEOUT_S, Deliverer, Result, SimWebhook
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.providers.xhub.events import status_changed
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, drain, eventually, payment_event
from tests.rabbitmq_alarm import memory_alarm, unavailable_reason

URL = "/webhooks/xhub"
BUDGET_S = 10.0  # the provider's hard budget for any answer (SPEC section 3)
AT_ONCE_S = 0.5
# How late a held refusal may come: 300 answers due at one moment from one event loop on a
# busy 2-core machine (a chaos run beside the suite) leave late by up to about a second.
HOLD_SLACK_S = 1.5


@dataclass(frozen=True, slots=True)
class Answer:
    event_id: str
    status: int
    retry_after: str | None
    elapsed_s: float


async def _ingest(
    aiohttp_client: Any, settings: Settings, config: AcceptorConfig | None = None
) -> tuple[TestClient, web.Application]:
    app = create_app(settings, acceptor_config=config)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client, app


async def _post(client: TestClient, event_id: str | None = None) -> Answer:
    event_id = event_id or f"evt_{uuid.uuid4().hex}"
    body, headers = delivery(payment_event(), TEST_SECRETS[0], event_id=event_id)
    started = time.monotonic()
    async with client.post(URL, data=body, headers=headers) as response:
        await response.read()
        return Answer(
            event_id,
            response.status,
            response.headers.get("Retry-After"),
            time.monotonic() - started,
        )


def _sample(metrics_text: str, name: str, label: str) -> float:
    [line] = [line for line in metrics_text.splitlines() if line.startswith(name) and label in line]
    return float(line.rpartition(" ")[2])


def _unavailable_count(metrics_text: str) -> float:
    return _sample(metrics_text, "payhooks_webhooks_received_total", 'outcome="unavailable"')


async def test_webhooks_beyond_the_cap_on_waiting_ones_are_refused_at_once(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any
) -> None:
    config = AcceptorConfig(max_batch=4, max_in_flight=1, max_pending=4, db_timeout_s=1.0)
    client, _ = await _ingest(aiohttp_client, settings, config)
    # PostgreSQL holds every insert: one batch waits for it, four webhooks wait for a batch.
    await db.execute("BEGIN")
    await db.execute("LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
    try:
        answers = await asyncio.gather(*(_post(client) for _ in range(20)))
    finally:
        await db.execute("ROLLBACK")

    assert {a.status for a in answers} == {503}
    assert all(a.retry_after == "5" for a in answers)
    assert max(a.elapsed_s for a in answers) < BUDGET_S
    at_once = [a for a in answers if a.elapsed_s < AT_ONCE_S]
    assert len(at_once) >= 20 - 4 - 4, sorted(round(a.elapsed_s, 2) for a in answers)
    metrics = await (await client.get("/metrics")).text()
    assert _unavailable_count(metrics) == 20
    assert _sample(metrics, "payhooks_ingest_shed_total", 'reason="pending_cap"') >= 20 - 4 - 4
    assert (await _post(client)).status == 200  # the acceptor takes work again


async def test_under_overload_every_answer_is_a_stored_and_queued_200_or_a_503(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any, topology: Topology
) -> None:
    # An acceptor assumed to finish 5 webhooks/s, never measured (a measurement would span a
    # minute): a webhook with more than about 7 s of them ahead (35) is refused by its
    # predicted wait before any work, the cap on waiting webhooks far away, and answered
    # REFUSAL_HOLD_S after its arrival (the last test says why).
    admission = AdmissionConfig(assumed_rows_per_s=5.0, sample_s=60.0)
    config = AcceptorConfig(max_batch=8, max_in_flight=1, admission=admission)
    client, _ = await _ingest(aiohttp_client, settings, config)

    answers = await asyncio.gather(*(_post(client) for _ in range(300)))

    statuses = Counter(a.status for a in answers)
    assert set(statuses) == {200, 503}, statuses
    refused = [a for a in answers if a.status == 503]
    assert all(a.retry_after == "5" for a in refused)
    assert all(REFUSAL_HOLD_S - 0.1 < a.elapsed_s < REFUSAL_HOLD_S + HOLD_SLACK_S for a in refused)
    metrics = await (await client.get("/metrics")).text()
    shed = _sample(metrics, "payhooks_ingest_shed_total", 'reason="predicted_wait"')
    assert shed == len(refused)
    assert max(a.elapsed_s for a in answers) < BUDGET_S
    accepted = sorted(a.event_id for a in answers if a.status == 200)
    stored = await db.fetch("SELECT event_id FROM inbox ORDER BY event_id")
    assert [r["event_id"] for r in stored] == accepted  # nothing stored for a 503
    queued = await drain(amqp, topology.work["orders"].name)
    assert sorted(m.message_id or "" for m in queued) == accepted  # each queued once


async def test_a_broker_blocking_publishers_gets_503_at_once_and_readyz_says_why(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any, topology: Topology
) -> None:
    if reason := unavailable_reason():
        pytest.skip(reason)
    client, app = await _ingest(aiohttp_client, settings)
    before = await _post(client)
    assert before.status == 200

    with memory_alarm():
        # RabbitMQ blocks a connection when it next publishes after the alarm: that one's
        # batch gives up as soon as the connection.blocked arrives (or it slipped in, 200).
        first = await _post(client)
        if first.status == 200:
            first = await _post(client)
        blocked = app[BROKER].blocked
        then = await _post(client)
        ready = await client.get("/readyz")
        readiness = await ready.json()

    assert blocked
    assert (first.status, first.retry_after) == (503, "5")
    assert first.elapsed_s < 2.0, f"the blocked publish took {first.elapsed_s:.2f}s to give up"
    assert (then.status, then.retry_after) == (503, "5")
    assert then.elapsed_s < AT_ONCE_S
    assert ready.status == 503
    assert readiness["failing"] == ["rabbitmq_not_blocked"]

    async def readyz() -> int:
        async with client.get("/readyz") as response:
            return response.status

    await eventually(readyz, lambda status: status == 200, timeout_s=15)
    for event_id in (first.event_id, then.event_id):  # the provider's retries
        assert (await _post(client, event_id)).status == 200
    expected = sorted({before.event_id, first.event_id, then.event_id})
    queued = await drain(amqp, topology.work["orders"].name, settle_s=0.5)
    assert sorted(m.message_id or "" for m in queued) == expected


async def test_a_burst_beyond_the_predicted_wait_is_refused_after_its_first_successes(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any
) -> None:
    """X-Hub's breaker reopens when >= 80 % of >= 5 deliveries fail: refusals answered at once
    would be the first outcomes it records of a released backlog and reopen it. Held until
    the burst's first successes are in, they cost one attempt each, and the breaker stays
    closed."""
    # Assumed 10 webhooks/s, never measured: of 2,000 released at once, those with more than
    # about 7 s of that ahead (70) are refused; by their next attempt the queue has drained.
    admission = AdmissionConfig(assumed_rows_per_s=10.0, sample_s=60.0)
    client, _ = await _ingest(aiohttp_client, settings, AcceptorConfig(admission=admission))
    backlog = [
        SimWebhook(
            event_id=f"evt_{uuid.uuid4().hex}",
            merchant_id="m",
            payload=status_changed(f"pay_{n}", "paid", "100.00", "USD", "2026-12-05T10:00:00Z"),
        )
        for n in range(2_001)
    ]
    async with Deliverer(
        str(client.server.make_url("")),
        TEST_SECRETS[0].encode(),
        time_scale=100.0,
        breakers_open=True,
        sender=OneShotSender(TIMEOUT_S),
    ) as deliverer:
        records = await asyncio.gather(*(deliverer.deliver(w) for w in backlog))

    first = Counter(r.http_statuses[-1 if r.released_at is None else 0] for r in records)
    attempts = Counter(code for r in records for code in r.http_statuses)
    assert attempts[503] > 500, attempts  # the rule refused, on the first attempt
    assert set(attempts) == {200, 503}, attempts
    # Reopened at most once: with refusals answered at once it reopened 7 times
    # (docs/ingest-burst.md). Once is what a starved machine can cost: when the client and
    # ingest share one event loop on 2 busy cores, the burst's few admitted 200s can come
    # after 2 s, behind the first held refusals (seen when the suite ran beside make chaos).
    assert len(deliverer.releases) <= 2, (deliverer.releases, first)
    assert {r.result for r in records} == {Result.DELIVERED}
    metrics = await (await client.get("/metrics")).text()
    assert (
        _sample(metrics, "payhooks_ingest_shed_total", 'reason="predicted_wait"') == (attempts[503])
    )
    assert await db.fetchval("SELECT count(*) FROM inbox") == len(backlog)
