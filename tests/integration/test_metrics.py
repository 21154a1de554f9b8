"""/metrics of every service: valid Prometheus text with the SPEC section 7 names, counters
that move by exactly what a test caused, and the api's queue and backlog gauges."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from services.api.app import create_app as api_app
from services.ingest.accept import outgoing
from shared.amqp.broker import BROKER
from shared.amqp.outgoing import to_message
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.queries import outbox as outbox_sql
from shared.queries import parked as parked_sql
from tests.conftest import SmtpSink
from tests.helpers import delivery, eventually, payment_event, signed_headers
from tests.integration.system import (
    SECRET,
    System,
    depths,
    post,
    progress,
    register,
    start_system,
    system_settings,
)
from tests.integration.test_dlq import Letter, new_id, put_dead_letters

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

# Family name (without the _total a counter's samples carry) -> type, per service.
EXPECTED_FAMILIES = {
    "ingest": {
        "payhooks_webhooks_received": "counter",
        "payhooks_ingest_duration_seconds": "histogram",
        "payhooks_publish_confirm_duration_seconds": "histogram",
    },
    "orders": {
        "payhooks_messages_processed": "counter",
        "payhooks_processing_duration_seconds": "histogram",
    },
    "bonuses": {
        "payhooks_messages_processed": "counter",
        "payhooks_processing_duration_seconds": "histogram",
        "payhooks_bonus_points_granted": "counter",
    },
    "email": {
        "payhooks_messages_processed": "counter",
        "payhooks_processing_duration_seconds": "histogram",
        "payhooks_emails_sent": "counter",
    },
    "api": {
        "payhooks_queue_messages": "gauge",
        "payhooks_queue_oldest_message_age_seconds": "gauge",
        "payhooks_outbox_backlog": "gauge",
    },
}


OWN_PREFIXES = ("payhooks_", "process_", "python_")


async def scrape(client: TestClient) -> tuple[dict[str, str], Samples]:
    """Family types and every sample of a service's /metrics, parsed as Prometheus does."""
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    families = list(text_string_to_metric_families(await response.text()))
    samples = {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}
    return {f.name: f.type for f in families}, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def metrics_settings(make_settings: Any, smtp: tuple[SmtpSink, int]) -> Settings:
    return system_settings(make_settings, smtp[1])


@pytest.fixture
async def api(
    aiohttp_client: Any, metrics_settings: Settings, db: Any, channel: AbstractChannel
) -> TestClient:
    app = api_app(metrics_settings, monitor_interval_s=0.05)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


@pytest.fixture
async def system(
    aiohttp_client: Any,
    metrics_settings: Settings,
    channel: AbstractChannel,
    topology: Topology,
    db: Any,
) -> System:
    return await start_system(aiohttp_client, metrics_settings, channel, topology)


def clients(system: System, api: TestClient) -> dict[str, TestClient]:
    return {name: found[0] for name, found in system.clients.items()} | {"api": api}


async def test_every_services_metrics_parse_and_carry_the_spec_metrics(
    system: System, api: TestClient
) -> None:
    for service, client in clients(system, api).items():
        families, samples = await scrape(client)

        for name, kind in EXPECTED_FAMILIES[service].items():
            assert families.get(name) == kind, (service, name, families)
        # Ours, and the process and platform collectors' (test below).
        assert all(name.startswith(OWN_PREFIXES) for name in families), (service, families)
        if service == "ingest":
            outcomes = {
                dict(labels)["outcome"]
                for name, labels in samples
                if name == "payhooks_webhooks_received_total"
            }
            assert outcomes >= {
                "accepted",
                "duplicate",
                "malformed",
                "invalid_signature",
                "stale",
                "too_large",
                "unavailable",
            }
        if service in ("orders", "bonuses", "email"):
            outcomes = {
                dict(labels)["outcome"]
                for name, labels in samples
                if name == "payhooks_messages_processed_total" and dict(labels)["worker"] == service
            }
            assert outcomes >= {"ok", "skipped_duplicate", "retried", "dead_lettered"}


async def test_every_service_exposes_build_info_process_metrics_and_no_created_series(
    system: System, api: TestClient
) -> None:
    version = importlib.metadata.version("payhooks")
    for service, client in clients(system, api).items():
        families, samples = await scrape(client)

        build_info = {
            labels: v for (name, labels), v in samples.items() if name == "payhooks_build_info"
        }
        assert build_info == {frozenset({("version", version)}): 1.0}, (service, build_info)
        assert families.get("process_resident_memory_bytes") == "gauge", service
        assert value(samples, "process_resident_memory_bytes") > 0, service
        assert families.get("python_info") == "gauge", service
        assert not [name for name, _ in samples if name.endswith("_created")], service


async def wait_until_done(
    db: Any, system: System, *, orders: int, transitions: int
) -> dict[str, int]:
    """Wait until the orders worker finished `orders` deliveries and the bonuses and email
    workers `transitions` each (an unknown payment's event is parked, never recorded as
    processed, so tests.integration.system.quiescent does not apply)."""

    def done(p: dict[str, int]) -> bool:
        return (
            p["orders_finished"] >= orders
            and p["outbox"] == transitions
            and p["outbox_unpublished"] == 0
            and p["bonuses_finished"] >= transitions
            and p["email_finished"] >= transitions
        )

    return await eventually(lambda: progress(db, system), done, timeout_s=20)


async def post_raw(client: TestClient, body: bytes, headers: Mapping[str, str]) -> int:
    response = await client.post("/webhooks/xhub", data=body, headers=dict(headers))
    return response.status


async def test_counters_move_by_exactly_what_the_test_caused(
    system: System, api: TestClient, db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    before = {name: (await scrape(client))[1] for name, client in clients(system, api).items()}
    paid = {new_id("pay"): new_id("evt") for _ in range(3)}
    for payment_id in paid:
        await register(db, payment_id)
    unknown = new_id("pay")
    refunded = next(iter(paid))

    # ingest: 4 accepted, 2 duplicates, 1 invalid signature, 1 malformed
    for payment_id, event_id in paid.items():
        await post(system.ingest, payment_event(payment_id, "paid"), event_id)
    first_payment, first_event = next(iter(paid.items()))
    for _ in range(2):
        await post(system.ingest, payment_event(first_payment, "paid"), first_event)
    await post(system.ingest, payment_event(unknown, "paid"), new_id("evt"))
    body, headers = delivery(payment_event(new_id("pay")), "not-the-secret")
    assert await post_raw(system.ingest, body, headers) == 401
    malformed = b'{"event": "payment.status_changed",'
    assert await post_raw(system.ingest, malformed, signed_headers(malformed, SECRET)) == 400
    # orders: the first event once more, straight to the exchange, as a redelivery would be
    await wait_until_done(db, system, orders=4, transitions=3)
    copy = outgoing(
        "xhub",
        first_event,
        "payment.status_changed",
        orjson.dumps(payment_event(first_payment, "paid")),
    )
    exchange = await channel.get_exchange(topology.exchange, ensure=False)
    await exchange.publish(to_message(copy), copy.routing_key, mandatory=True)
    # then a refund: a clawback and a refund email
    await post(system.ingest, payment_event(refunded, "refunded"), new_id("evt"))
    await wait_until_done(db, system, orders=6, transitions=4)

    after = {name: (await scrape(client))[1] for name, client in clients(system, api).items()}
    ingest = {
        outcome: moved(
            before["ingest"],
            after["ingest"],
            "payhooks_webhooks_received_total",
            provider="xhub",
            outcome=outcome,
        )
        for outcome in ("accepted", "duplicate", "invalid_signature", "malformed", "stale")
    }
    assert ingest == {
        "accepted": 5,
        "duplicate": 2,
        "invalid_signature": 1,
        "malformed": 1,
        "stale": 0,
    }
    assert moved(before["ingest"], after["ingest"], "payhooks_ingest_duration_seconds_count") == 9
    worker_outcomes = {
        worker: {
            outcome: moved(
                before[worker],
                after[worker],
                "payhooks_messages_processed_total",
                worker=worker,
                outcome=outcome,
            )
            for outcome in ("ok", "skipped_duplicate", "retried", "dead_lettered", "parked")
        }
        for worker in ("orders", "bonuses", "email")
    }
    # The unknown payment's event is parked, not retried (its park running out later is the
    # parked relay's, not a delivery's outcome).
    nothing_parked = {"retried": 0, "dead_lettered": 0, "parked": 0}
    assert worker_outcomes == {
        "orders": {"ok": 4, "skipped_duplicate": 1, "retried": 0, "dead_lettered": 0, "parked": 1},
        "bonuses": {"ok": 4, "skipped_duplicate": 0, **nothing_parked},
        "email": {"ok": 4, "skipped_duplicate": 0, **nothing_parked},
    }
    assert (
        moved(
            before["orders"],
            after["orders"],
            "payhooks_processing_duration_seconds_count",
            worker="orders",
        )
        == 6
    )
    assert moved(before["bonuses"], after["bonuses"], "payhooks_bonus_points_granted_total") == 1500
    assert {
        template: moved(
            before["email"], after["email"], "payhooks_emails_sent_total", template=template
        )
        for template in ("payment_succeeded", "payment_refunded")
    } == {"payment_succeeded": 3, "payment_refunded": 1}
    # Labels stay bounded: no event or payment id ever becomes a label value.
    for samples in after.values():
        for _, labels in samples:
            assert not any(v.startswith(("evt_", "pay_")) for _, v in labels), labels


async def test_api_gauges_show_queue_depths_dlq_age_and_backlogs(
    api: TestClient, channel: AbstractChannel, topology: Topology, db: Any
) -> None:
    work = topology.work
    an_hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    await put_dead_letters(
        channel,
        work["orders"],
        [Letter(failed_at=an_hour_ago + dt.timedelta(minutes=10)), Letter(failed_at=an_hour_ago)],
    )
    await put_dead_letters(channel, work["emails"], [Letter(failed_at=an_hour_ago)])
    for _ in range(3):  # waiting on a work queue no worker consumes
        await channel.default_exchange.publish(
            to_message(outgoing("xhub", new_id("evt"), "order.paid", b"{}")),
            work["bonuses"].name,
            mandatory=True,
        )
    await outbox_sql.add_many_to_outbox(db, [(new_id("evt") + ":order.paid", "order.paid", b"{}")])
    for _ in range(2):  # events waiting for their orders (no orders worker runs to time them out)
        await parked_sql.park(
            db,
            parked_sql.ParkedEvent(new_id("evt"), "xhub", new_id("pay"), "e", "e", b"{}", {}),
        )

    def reflects(samples: Samples) -> bool:
        return (
            value(samples, "payhooks_queue_messages", queue="orders.dlq") == 2
            and value(samples, "payhooks_queue_messages", queue="bonuses") == 3
            and value(samples, "payhooks_outbox_backlog") == 1
            and value(samples, "payhooks_parked_events") == 2
        )

    samples = await eventually(lambda: _samples(api), reflects)

    # Labels are the SPEC queue names, without the deployment's AMQP_PREFIX.
    queues = ("orders", "orders.dlq", "bonuses", "bonuses.dlq", "emails", "emails.dlq", "unrouted")
    assert {q: value(samples, "payhooks_queue_messages", queue=q) for q in queues} == {
        "orders": 0,
        "orders.dlq": 2,
        "bonuses": 3,
        "bonuses.dlq": 0,
        "emails": 0,
        "emails.dlq": 1,
        "unrouted": 0,
    }
    ages = {
        q: value(samples, "payhooks_queue_oldest_message_age_seconds", queue=q)
        for q in ("orders.dlq", "bonuses.dlq", "emails.dlq")
    }
    assert 3600 <= ages["orders.dlq"] < 3660
    assert 3600 <= ages["emails.dlq"] < 3660
    assert ages["bonuses.dlq"] == 0
    assert value(samples, "payhooks_inbox_unpublished") == 0
    assert 0 < value(samples, "payhooks_parked_events_oldest_seconds") < 60
    # The monitor reads the DLQs over and over: they must still hold every message (the
    # monitor may hold them for a moment while it reads them).
    dlqs = {work["orders"].dlq: 2, work["emails"].dlq: 1}
    await eventually(lambda: depths(channel, dlqs), lambda d: d == dlqs)


async def test_api_gauge_counts_the_consumers_of_each_work_queue(
    api: TestClient, channel: AbstractChannel, topology: Topology
) -> None:
    def consumers(samples: Samples) -> dict[str, float]:
        return {
            q: value(samples, "payhooks_queue_consumers", queue=q)
            for q in ("orders", "bonuses", "emails")
        }

    # Nothing consumes yet; the monitor's own passive declares are no consumers. The gauge is
    # set (to 0), not absent, so an alert can tell "no consumer" from "not measured".
    samples = await eventually(
        lambda: _samples(api),
        lambda s: ("payhooks_queue_consumers", frozenset({("queue", "bonuses")})) in s,
    )
    assert consumers(samples) == {"orders": 0, "bonuses": 0, "emails": 0}

    async def ack(message: AbstractIncomingMessage) -> None:
        await message.ack()

    bonuses = await channel.declare_queue(topology.work["bonuses"].name, passive=True)
    tags = [await bonuses.consume(ack) for _ in range(2)]
    await eventually(
        lambda: _samples(api), lambda s: consumers(s) == {"orders": 0, "bonuses": 2, "emails": 0}
    )
    for tag in tags:
        await bonuses.cancel(tag)
    await eventually(lambda: _samples(api), lambda s: consumers(s)["bonuses"] == 0)
    # DLQs and unrouted are read, never consumed: no consumer gauge for them.
    assert not [
        key
        for key in samples
        if key[0] == "payhooks_queue_consumers"
        and dict(key[1])["queue"] not in ("orders", "bonuses", "emails")
    ]


async def _samples(client: TestClient) -> Samples:
    return (await scrape(client))[1]
