"""An operator's pause and rate cap of a worker (`payhooks worker pause|resume|throttle`,
shared/worker/controls.py) on running workers with the real PostgreSQL, RabbitMQ and an SMTP
sink: a pause under load loses and reorders nothing and holds every replica within about a
second; it outlasts a dependency's pause and recovery; a cap holds over two replicas."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from services.bonuses.app import create_app as bonuses_app
from services.email.app import create_app as email_app
from services.ingest.app import create_app as ingest_app
from services.orders.app import create_app as orders_app
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.ops.operator_actions import (
    Edge,
    Operator,
    pause_worker_recorded,
    resume_worker_recorded,
    throttle_worker_recorded,
)
from shared.process.web import REGISTRY
from tests.conftest import SmtpSink, smtp_server
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    EMAIL_FROM,
    WORK_QUEUE,
    System,
    consumer_counts,
    depths,
    dlqs,
    effects,
    get_one,
    post,
    quiescent,
    register,
    smtp_messages,
)
from tests.proxy import TcpProxy

pytestmark = pytest.mark.timeout(150)

OPERATOR = Operator("alice", Edge.CLI)
# The production shapes (one batcher for orders: a payment's events in queue order), not the
# small concurrent batches of tests/integration/system.py.
FACTORIES: dict[str, Callable[[Settings], web.Application]] = {
    "ingest": ingest_app,
    "orders": orders_app,
    "bonuses": bonuses_app,
    "email": email_app,
    # Smaller batches: a prefetch of 16 each, so that both replicas hold part of a backlog.
    "email-small": lambda settings: email_app(settings, batch_size=4),
}


@pytest.fixture
async def controls(db: Any) -> AsyncIterator[Any]:
    await db.execute("TRUNCATE worker_controls")
    yield db
    await db.execute("TRUNCATE worker_controls")


class TimedSink(SmtpSink):
    """Keeps when each message arrived (monotonic seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.times.append(time.monotonic())
        return await super().handle_DATA(server, session, envelope)


async def start(
    aiohttp_client: Any,
    channel: Any,
    topology: Topology,
    instances: dict[str, tuple[Settings, int]],
) -> System:
    clients: dict[str, list[TestClient]] = {}
    for name, (settings, count) in instances.items():
        for _ in range(count):
            app = FACTORIES[name](settings)
            clients.setdefault(name, []).append(await aiohttp_client(app))
            await app[BROKER].wait_connected(10)
    consumers = {
        topology.work[WORK_QUEUE[name.removesuffix("-small")]].name: count
        for name, (_, count) in instances.items()
        if name.removesuffix("-small") in WORK_QUEUE
    }
    await eventually(
        lambda: consumer_counts(channel, consumers), lambda c: c == consumers, timeout_s=15
    )
    return System(clients)


async def readiness(client: TestClient) -> tuple[int, dict[str, Any]]:
    response = await client.get("/readyz")
    return response.status, await response.json()


def sample(client: TestClient, name: str, worker: str) -> float:
    assert client.app is not None
    return client.app[REGISTRY].get_sample_value(name, {"worker": worker}) or 0.0


async def held(client: TestClient) -> dict[str, Any]:
    """Wait until the replica shows the operator's pause: 200 (paused on purpose is ready,
    shared/worker/app.py), 503 while a dependency's pause is on too."""
    status, body = await eventually(
        lambda: readiness(client), lambda r: "operator_pause" in r[1], timeout_s=5.0
    )
    assert status == (503 if "paused" in body else 200), body
    return body


async def unheld(client: TestClient) -> None:
    await eventually(lambda: readiness(client), lambda r: "operator_pause" not in r[1])


async def transitions(db: Any, payment_id: str) -> list[tuple[str, str]]:
    rows = await db.fetch(
        "SELECT from_status, to_status FROM order_transitions WHERE payment_id = $1 ORDER BY id",
        payment_id,
    )
    return [(r["from_status"], r["to_status"]) for r in rows]


async def test_a_pause_under_load_loses_and_reorders_nothing(
    aiohttp_client: Any,
    make_settings: Any,
    channel: Any,
    topology: Topology,
    db: Any,
    controls: Any,
) -> None:
    sink = SmtpSink()
    with smtp_server(sink) as smtp_port:
        settings = make_settings(SMTP_PORT=str(smtp_port), EMAIL_FROM=EMAIL_FROM)
        system = await start(
            aiohttp_client,
            channel,
            topology,
            dict.fromkeys(("ingest", "orders", "bonuses", "email"), (settings, 1)),
        )
        orders = system.clients["orders"][0]
        ids = [f"pay_{uuid.uuid4().hex[:12]}" for _ in range(200)]
        for payment_id in ids:
            await register(db, payment_id)

        # Half the payments come once the pause holds: there is load left whatever the
        # machine's speed (a fast one finished all 400 events before the pause took hold).
        paused = asyncio.Event()
        later = set(ids[len(ids) // 2 :])

        async def pay_then_settle(payment_id: str) -> None:
            if payment_id in later:
                await paused.wait()
            # In this order, each acknowledged before the next: the orders queue has them so.
            await post(system.ingest, payment_event(payment_id, "paid"))
            await post(system.ingest, payment_event(payment_id, "settled"))

        load = asyncio.gather(*(pay_then_settle(p) for p in ids))
        await eventually(lambda: asyncio.sleep(0, system.finished("orders")), lambda n: n >= 80)
        paused_at = time.monotonic()
        await pause_worker_recorded(db, "orders", "deploying a fix", OPERATOR)
        body = await held(orders)
        seen_s = time.monotonic() - paused_at
        paused.set()
        assert body["operator_pause"]["by"] == "alice"
        assert body["operator_pause"]["reason"] == "deploying a fix"
        assert "paused" not in body  # no dependency's pause
        assert sample(orders, "payhooks_worker_operator_paused", "orders") == 1
        since = sample(orders, "payhooks_worker_operator_paused_since_timestamp_seconds", "orders")
        assert abs(since - time.time()) < 30
        await asyncio.sleep(0.5)  # a batch in hand when the pause came finishes
        finished = system.finished("orders")
        await asyncio.sleep(2.0)
        assert system.finished("orders") == finished, "a paused worker took work"
        # Half the payments come only now (the guard that the pause found work left, which a
        # fast machine once broke): ingest accepts them, and they wait in RabbitMQ.
        await load
        assert system.finished("orders") == finished
        await resume_worker_recorded(db, "orders", OPERATOR)
        await eventually(
            lambda: asyncio.sleep(0, system.finished("orders")),
            lambda n: n >= 2 * len(ids),
            timeout_s=60,
        )
        await eventually(
            lambda: asyncio.sleep(0, len(sink.messages)), lambda n: n >= len(ids), timeout_s=60
        )
        await quiescent(db, system, timeout_s=60)
        status, body = await readiness(orders)
        assert (status, "operator_pause" in body) == (200, False)
        assert sample(orders, "payhooks_worker_operator_paused", "orders") == 0
    for payment_id in ids:
        assert await transitions(db, payment_id) == [("PENDING", "PAID"), ("PAID", "SETTLED")]
        assert await effects(db, payment_id) == {
            "status": "SETTLED",
            "bonus": 500,
            "ledger": ["grant"],
            "emails": ["payment_succeeded"],
        }
        assert smtp_messages(sink, payment_id) == ["payment_succeeded"]
    for dlq in dlqs(topology):
        assert await get_one(channel, dlq) is None, dlq
    assert seen_s < 2.0, seen_s


@pytest.fixture
async def smtp_proxy() -> AsyncIterator[tuple[SmtpSink, TcpProxy]]:
    sink = SmtpSink()
    with smtp_server(sink) as port:
        async with TcpProxy("127.0.0.1", port) as proxy:
            yield sink, proxy


async def test_two_replicas_hold_within_a_second_and_the_pause_outlasts_an_smtp_outage(
    aiohttp_client: Any,
    make_settings: Any,
    smtp_proxy: tuple[SmtpSink, TcpProxy],
    channel: Any,
    topology: Topology,
    db: Any,
    controls: Any,
) -> None:
    sink, proxy = smtp_proxy
    settings = make_settings(SMTP_PORT=str(proxy.port), EMAIL_FROM=EMAIL_FROM)
    system = await start(
        aiohttp_client,
        channel,
        topology,
        {
            "ingest": (settings, 1),
            "orders": (settings, 1),
            "bonuses": (settings, 1),
            "email": (settings, 2),
        },
    )
    replicas = system.clients["email"]
    started = time.monotonic()
    await pause_worker_recorded(db, "emails", "quota reached", OPERATOR)
    for replica in replicas:
        await held(replica)
    assert time.monotonic() - started < 1.5  # NOTIFY: well within the re-read's second
    await resume_worker_recorded(db, "email", OPERATOR)
    for replica in replicas:
        await unheld(replica)

    # SMTP goes away: a replica that gets an email pauses for it (503); the operator pauses the
    # worker meanwhile; SMTP comes back and the probe ends the dependency's pause, not the
    # operator's: nothing more is taken until the operator resumes, and the email goes once.
    proxy.cut()
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    await register(db, payment_id)
    await post(system.ingest, payment_event(payment_id, "paid"))

    async def smtp_paused() -> list[int]:
        return [
            i
            for i, replica in enumerate(replicas)
            if [p["dependency"] for p in (await readiness(replica))[1].get("paused", [])]
            == ["smtp"]
        ]

    [waiting, *_] = await eventually(smtp_paused, lambda found: len(found) >= 1, timeout_s=20)
    status, _ = await readiness(replicas[waiting])
    assert status == 503
    await pause_worker_recorded(db, "email", "provider incident", OPERATOR)
    for replica in replicas:
        await held(replica)
    proxy.restore()
    for replica in replicas:  # (the other may have been handed the email and paused too)
        status, body = await eventually(
            lambda replica=replica: readiness(replica),  # type: ignore[misc]
            lambda r: "paused" not in r[1],
            timeout_s=20,
        )
        assert status == 200
        assert body["operator_pause"]["reason"] == "provider incident"
    # The probe that found SMTP back resumed nothing. (A batch a replica had in hand when the
    # pause came finishes; then nothing more is sent.)
    sent = smtp_messages(sink, payment_id)
    await asyncio.sleep(1.5)
    assert smtp_messages(sink, payment_id) == sent
    await resume_worker_recorded(db, "email", OPERATOR)
    await eventually(
        lambda: asyncio.sleep(0, smtp_messages(sink, payment_id)),
        lambda sent: sent == ["payment_succeeded"],
        timeout_s=20,
    )
    for dlq in dlqs(topology):
        assert await get_one(channel, dlq) is None, dlq


async def test_a_rate_cap_holds_over_two_email_replicas(
    aiohttp_client: Any,
    make_settings: Any,
    channel: Any,
    topology: Topology,
    db: Any,
    controls: Any,
) -> None:
    rate, count = 8.0, 48
    sink = TimedSink()
    with smtp_server(sink) as smtp_port:
        settings = make_settings(SMTP_PORT=str(smtp_port), EMAIL_FROM=EMAIL_FROM)
        system = await start(
            aiohttp_client,
            channel,
            topology,
            {
                "ingest": (settings, 1),
                "orders": (settings, 1),
                "bonuses": (settings, 1),
                "email-small": (settings, 2),
            },
        )
        replicas = system.clients["email-small"]
        # Paused while the emails pile up, so that the cap meets a backlog at once.
        await pause_worker_recorded(db, "email", "load the queue", OPERATOR)
        await throttle_worker_recorded(db, "email", rate, OPERATOR)
        for replica in replicas:
            await held(replica)
            _, body = await eventually(
                lambda replica=replica: readiness(replica),  # type: ignore[misc]
                lambda r: "rate_limit" in r[1],
            )
            assert body["rate_limit"]["per_second"] == rate
            assert sample(replica, "payhooks_worker_rate_limit_per_second", "email") == rate
        ids = [f"pay_{uuid.uuid4().hex[:12]}" for _ in range(count)]
        for payment_id in ids:
            await register(db, payment_id)
        await asyncio.gather(*(post(system.ingest, payment_event(p, "paid")) for p in ids))
        emails = topology.work["emails"].name
        await eventually(lambda: depths(channel, [emails]), lambda d: d[emails] == count)
        await resume_worker_recorded(db, "email", OPERATOR)
        await eventually(
            lambda: asyncio.sleep(0, len(sink.times)), lambda n: n >= count, timeout_s=60
        )
    times = sorted(sink.times)
    # The bucket holds one second's worth: at most `rate` more in any second than the rate,
    # and past the first bucketful the sends keep to the rate (20% slack: a message's send
    # comes a little after its token, more on a loaded 2-core machine).
    per_window = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert per_window <= 2 * rate + 2, per_window
    after_first = times[int(rate) :]
    span_s = after_first[-1] - after_first[0]
    assert span_s >= 0.8 * (len(after_first) - 1) / rate, span_s
    # Both replicas sent (RabbitMQ hands each half of the queue): the cap is shared.
    for replica in replicas:
        assert replica.app is not None
        ok = replica.app[REGISTRY].get_sample_value(
            "payhooks_messages_processed_total", {"worker": "email", "outcome": "ok"}
        )
        assert (ok or 0) > 0
    print(f"{len(after_first)} emails in {span_s:.2f} s at {rate:g}/s; busiest second {per_window}")  # noqa: T201


async def test_a_change_whose_notification_was_lost_is_read_within_a_second_or_two(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    channel: Any,
    topology: Topology,
    db: Any,
    controls: Any,
) -> None:
    settings = make_settings(SMTP_PORT=str(smtp[1]), EMAIL_FROM=EMAIL_FROM)
    system = await start(aiohttp_client, channel, topology, {"email": (settings, 1)})
    [replica] = system.clients["email"]
    # Written without its NOTIFY (as if the listener had been reconnecting): the re-read
    # every second finds it.
    await db.execute(
        "INSERT INTO worker_controls (worker, paused_at, paused_by, paused_reason)"
        " VALUES ('email', now(), 'bob', 'silent')"
    )
    started = time.monotonic()
    body = await held(replica)
    assert time.monotonic() - started < 2.5
    assert body["operator_pause"]["reason"] == "silent"
    emails = topology.work["emails"].name
    assert await consumer_counts(channel, [emails]) == {emails: 0}
    await db.execute(
        "UPDATE worker_controls SET paused_at = NULL, paused_by = NULL, paused_reason = NULL"
    )
    await unheld(replica)
    await eventually(lambda: consumer_counts(channel, [emails]), lambda c: c == {emails: 1})
