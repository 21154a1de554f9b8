"""An outage of PostgreSQL, RabbitMQ or SMTP longer than the whole retry ladder (the tests':
0.2, 0.4 s) dead-letters nothing: the worker pauses, says why, and processes every message
once the dependency is back; a message that is itself bad still reaches the DLQ with its
reason meanwhile. The servers are the real ones, reached through a TcpProxy the test cuts
(the machine's shared PostgreSQL and RabbitMQ keep running)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from shared.amqp.topology import Topology
from shared.config import Settings
from shared.process.web import REGISTRY
from shared.vocabulary import REASON
from tests.conftest import TEST_AMQP_URL, RefusingSink, SmtpSink, smtp_server
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    EMAIL_FROM,
    System,
    dlqs,
    effects,
    get_one,
    header,
    post,
    quiescent,
    register,
    smtp_messages,
    start_system,
)
from tests.proxy import TcpProxy, proxy_to, via

pytestmark = pytest.mark.timeout(90)

PAYMENTS = 6
# Five times the ladder: long enough that a message charged for the outage would be dead.
OUTAGE_S = 3.0
WORKERS = ("orders", "bonuses", "email")
PAID = {"status": "PAID", "bonus": 500, "ledger": ["grant"], "emails": ["payment_succeeded"]}


@pytest.fixture
async def db_proxy(migrated_database: str) -> AsyncIterator[TcpProxy]:
    """Requested before aiohttp_client: closed after the services have stopped."""
    proxy = await proxy_to(migrated_database, 5432)
    yield proxy
    await proxy.close()


@pytest.fixture
async def amqp_proxy() -> AsyncIterator[TcpProxy]:
    proxy = await proxy_to(TEST_AMQP_URL, 5672)
    yield proxy
    await proxy.close()


@pytest.fixture
async def smtp_proxy() -> AsyncIterator[tuple[SmtpSink, TcpProxy]]:
    sink = SmtpSink()
    with smtp_server(sink) as port:
        async with TcpProxy("127.0.0.1", port) as proxy:
            yield sink, proxy


async def start(
    aiohttp_client: Any,
    amqp: Any,
    topology: Topology,
    ingest: Settings,
    workers: Settings,
) -> System:
    """Ingest on `ingest`'s settings (the real servers), the three workers on `workers`'."""
    front = await start_system(aiohttp_client, ingest, amqp, topology, {"ingest": 1})
    back = await start_system(aiohttp_client, workers, amqp, topology, dict.fromkeys(WORKERS, 1))
    return System({**front.clients, **back.clients})


async def readiness(client: TestClient) -> tuple[int, dict[str, Any]]:
    response = await client.get("/readyz")
    return response.status, await response.json()


async def paused_for(system: System, worker: str, dependency: str) -> dict[str, Any]:
    """Wait until `worker` says on /readyz that it is paused for `dependency`."""
    client = system.clients[worker][0]
    status, body = await eventually(
        lambda: readiness(client),
        lambda r: [p["dependency"] for p in r[1].get("paused", [])] == [dependency],
        timeout_s=15,
    )
    assert status == 503
    assert sample(system, worker, "payhooks_worker_paused", dependency=dependency) == 1
    [paused] = body["paused"]
    return dict(paused)


def sample(system: System, worker: str, name: str, **labels: str) -> float:
    app = system.clients[worker][0].app
    assert app is not None
    return app[REGISTRY].get_sample_value(name, {"worker": worker, **labels}) or 0.0


def retried(system: System) -> dict[str, float]:
    return {
        w: sample(system, w, "payhooks_messages_processed_total", outcome="retried")
        for w in WORKERS
    }


async def no_dead_letters(amqp: Any, topology: Topology) -> None:
    for dlq in dlqs(topology):
        assert await get_one(amqp, dlq) is None, dlq


async def payments(db: Any, system: System, n: int = PAYMENTS) -> list[str]:
    ids = [f"pay_{uuid.uuid4().hex[:12]}" for _ in range(n)]
    for payment_id in ids:
        await register(db, payment_id)
    for payment_id in ids:
        await post(system.ingest, payment_event(payment_id, "paid"))
    return ids


def pauses(logs: list[MutableMapping[str, Any]], worker: str) -> list[str]:
    return [
        line["event"]
        for line in logs
        if line["event"] in ("worker.paused", "worker.resumed") and line["worker"] == worker
    ]


async def test_a_database_away_longer_than_the_ladder_dead_letters_nothing(
    db_proxy: TcpProxy,
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    sink, smtp_port = smtp
    proxy = db_proxy
    direct = make_settings(SMTP_PORT=str(smtp_port), EMAIL_FROM=EMAIL_FROM)
    workers = make_settings(
        DATABASE_URL=via(direct.database_url, proxy),
        SMTP_PORT=str(smtp_port),
        EMAIL_FROM=EMAIL_FROM,
    )
    system = await start(aiohttp_client, amqp, topology, direct, workers)
    with capture_logs() as logs:
        proxy.cut()
        ids = await payments(db, system)
        paused = await paused_for(system, "orders", "postgresql")
        assert paused["error"].startswith(("ConnectionResetError", "ConnectionRefused"))
        await asyncio.sleep(OUTAGE_S)
        await no_dead_letters(amqp, topology)
        proxy.restore()
        await quiescent(db, system, timeout_s=30)
        status, body = await readiness(system.clients["orders"][0])
    assert (status, body.get("paused")) == (200, None)
    # One line when it paused, one when it resumed: no storm while it waited.
    assert pauses(logs, "orders") == ["worker.paused", "worker.resumed"]
    for payment_id in ids:
        assert await effects(db, payment_id) == PAID
        assert smtp_messages(sink, payment_id) == ["payment_succeeded"]
    await no_dead_letters(amqp, topology)
    assert retried(system) == dict.fromkeys(WORKERS, 0)
    assert sample(system, "orders", "payhooks_worker_paused", dependency="postgresql") == 0


async def test_a_broker_connection_cut_longer_than_the_ladder_dead_letters_nothing(
    amqp_proxy: TcpProxy,
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    sink, smtp_port = smtp
    proxy = amqp_proxy
    direct = make_settings(SMTP_PORT=str(smtp_port), EMAIL_FROM=EMAIL_FROM)
    workers = make_settings(
        AMQP_URL=via(direct.amqp_url, proxy), SMTP_PORT=str(smtp_port), EMAIL_FROM=EMAIL_FROM
    )
    system = await start(aiohttp_client, amqp, topology, direct, workers)
    first = await payments(db, system, 2)
    await quiescent(db, system, timeout_s=30)
    proxy.cut()
    ids = await payments(db, system)  # ingest's broker is up: they wait in `orders`
    await asyncio.sleep(OUTAGE_S)
    await no_dead_letters(amqp, topology)
    proxy.restore()
    await quiescent(db, system, timeout_s=40)  # aio-pika reconnects every 5 s
    for payment_id in first + ids:
        assert await effects(db, payment_id) == PAID
        assert smtp_messages(sink, payment_id) == ["payment_succeeded"]
    await no_dead_letters(amqp, topology)


async def test_an_smtp_server_refusing_longer_than_the_ladder_delays_mail_and_loses_none(
    aiohttp_client: Any,
    make_settings: Any,
    smtp_proxy: tuple[SmtpSink, TcpProxy],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    sink, proxy = smtp_proxy
    settings = make_settings(SMTP_PORT=str(proxy.port), EMAIL_FROM=EMAIL_FROM)
    system = await start(aiohttp_client, amqp, topology, settings, settings)
    with capture_logs() as logs:
        proxy.cut()
        ids = await payments(db, system)
        paused = await paused_for(system, "email", "smtp")
        assert paused["error"].startswith("SmtpUnavailableError: SMTP 127.0.0.1:")
        await asyncio.sleep(OUTAGE_S)
        await no_dead_letters(amqp, topology)
        assert sink.messages == []
        proxy.restore()
        await quiescent(db, system, timeout_s=30)
        await eventually(
            lambda: asyncio.sleep(0, len(sink.messages)), lambda n: n == PAYMENTS, timeout_s=20
        )
    assert pauses(logs, "email") == ["worker.paused", "worker.resumed"]
    for payment_id in ids:
        assert await effects(db, payment_id) == PAID
        assert smtp_messages(sink, payment_id) == ["payment_succeeded"]
    await no_dead_letters(amqp, topology)
    assert retried(system)["email"] == 0


async def test_an_email_the_server_rejects_still_reaches_the_dlq_with_its_reason(
    aiohttp_client: Any,
    make_settings: Any,
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    rejected = f"pay_{uuid.uuid4().hex[:12]}"
    sink = RefusingSink(f"{rejected}@customer.test")
    with smtp_server(sink) as port:
        settings = make_settings(SMTP_PORT=str(port), EMAIL_FROM=EMAIL_FROM)
        system = await start(aiohttp_client, amqp, topology, settings, settings)
        await register(db, rejected)
        ids = await payments(db, system, 2)
        await post(system.ingest, payment_event(rejected, "paid"))
        dlq = topology.work["emails"].dlq
        dead = await eventually(lambda: get_one(amqp, dlq), lambda m: m is not None, timeout_s=15)
        status, body = await readiness(system.clients["email"][0])
    assert dead is not None
    assert header(dead, REASON) == "retries_exhausted"
    assert "RCPT TO: 550 no such user" in header(dead, "error")
    assert header(dead, "error").startswith("SmtpRejectedError")
    assert (status, body.get("paused")) == (200, None)  # never paused for it
    for payment_id in ids:
        assert smtp_messages(sink, payment_id) == ["payment_succeeded"]
