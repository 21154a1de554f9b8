"""The effect path as running services for integration tests, and probes that say when it is idle.

Ingest, orders, bonuses and email are each their own aiohttp app (as in production), against
real PostgreSQL, RabbitMQ and the aiosmtpd sink of `tests.conftest`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, DeliveryMode
from aiohttp import web
from aiohttp.test_utils import TestClient

from services.bonuses.app import create_app as bonuses_app
from services.email.app import create_app as email_app
from services.ingest.app import create_app as ingest_app
from services.orders.app import create_app as orders_app
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.process.web import REGISTRY
from shared.queries import orders as orders_sql
from shared.vocabulary import ATTEMPTS, FIRST_FAILED_AT, LAST_ERROR, LAST_FAILED_AT, ORIGINAL_QUEUE
from tests.conftest import TEST_SECRETS, SmtpSink
from tests.helpers import delivery, eventually

SECRET = TEST_SECRETS[0]
EMAIL_FROM = "shop@example.test"
UNAVAILABLE_RETRY_S = 10.0

# Small batches, two at a time: four messages in hand per instance still put concurrent
# copies of one payment on one worker, and batches of one instance next to each other.
BATCH = {"batch_size": 2, "batchers": 2}

APPS: dict[str, Callable[[Settings], web.Application]] = {
    "ingest": ingest_app,
    "orders": lambda settings: orders_app(settings, **BATCH),
    "bonuses": lambda settings: bonuses_app(settings, **BATCH),
    "email": lambda settings: email_app(settings, **BATCH),
}
# service -> the work queue it consumes (the worker label on its metrics is the service name)
WORK_QUEUE = {"orders": "orders", "bonuses": "bonuses", "email": "emails"}
# Outcomes after which a worker is done with a delivery ("retried" means it comes back; a
# "parked" one comes back as a new delivery once released).
FINAL_OUTCOMES = ("ok", "skipped_duplicate", "dead_lettered", "parked")


def system_settings(
    make_settings: Callable[..., Settings], smtp_port: int, **overrides: str
) -> Settings:
    """The services' settings: the test's SMTP sink, and any variable `overrides` names."""
    return make_settings(SMTP_PORT=str(smtp_port), EMAIL_FROM=EMAIL_FROM, **overrides)


@dataclass
class System:
    """Running services: one or more instances of each, by service name."""

    clients: dict[str, list[TestClient]]

    @property
    def ingest(self) -> TestClient:
        return self.clients["ingest"][0]

    def finished(self, service: str) -> int:
        """Deliveries the instances of a worker service are done with (acked or dead-lettered)."""
        return sum(self.finished_by_instance(service))

    def finished_by_instance(self, service: str) -> list[int]:
        return [
            sum(
                int(_sample(client, service, outcome))
                for outcome in FINAL_OUTCOMES  # a "retried" delivery is not finished yet
            )
            for client in self.clients.get(service, [])
        ]


def _sample(client: TestClient, worker: str, outcome: str) -> float:
    registry = client.app[REGISTRY] if client.app is not None else None
    assert registry is not None
    value = registry.get_sample_value(
        "payhooks_messages_processed_total", {"worker": worker, "outcome": outcome}
    )
    return value or 0.0


async def start_system(
    aiohttp_client: Any,
    settings: Settings,
    channel: AbstractChannel,
    topology: Topology,
    instances: dict[str, int] | None = None,
) -> System:
    """Start the services (one of each unless `instances` says otherwise) and wait until every
    worker instance consumes its queue, so no test races the consumers' start."""
    instances = instances if instances is not None else dict.fromkeys(APPS, 1)
    clients: dict[str, list[TestClient]] = {}
    for name, count in instances.items():
        for _ in range(count):
            app = APPS[name](settings)
            clients.setdefault(name, []).append(await aiohttp_client(app))
            await app[BROKER].wait_connected(10)
    consumers = {
        topology.work[WORK_QUEUE[name]].name: count
        for name, count in instances.items()
        if name in WORK_QUEUE
    }
    await eventually(
        lambda: consumer_counts(channel, consumers), lambda c: c == consumers, timeout_s=15
    )
    return System(clients)


async def consumer_counts(channel: AbstractChannel, queues: Iterable[str]) -> dict[str, int]:
    counts = {}
    for name in queues:
        queue = await channel.declare_queue(name, passive=True)
        counts[name] = queue.declaration_result.consumer_count or 0
    return counts


async def depths(channel: AbstractChannel, queues: Iterable[str]) -> dict[str, int]:
    """Ready messages per queue (not those a consumer holds unacked)."""
    result = {}
    for name in queues:
        queue = await channel.declare_queue(name, passive=True)
        result[name] = queue.declaration_result.message_count or 0
    return result


def dlqs(topology: Topology) -> list[str]:
    return [work.dlq for work in topology.work.values()]


async def register(
    db: Any, payment_id: str, amount: str = "100.00", status: str = "PENDING"
) -> None:
    """An order for `payment_id` (ord_<id>, user_<id>, USD), optionally already in `status`."""
    await orders_sql.register_order(
        db,
        orders_sql.NewOrder(
            order_id=f"ord_{payment_id}",
            payment_id=payment_id,
            user_id=f"user_{payment_id}",
            email=f"{payment_id}@customer.test",
            amount=Decimal(amount),
            currency="USD",
        ),
    )
    if status != "PENDING":
        await orders_sql.save_order_states(
            db, [orders_sql.OrderStateRow(payment_id, status, Decimal(0), None, [], [])]
        )


async def post(client: TestClient, payload: dict[str, Any], event_id: str | None = None) -> Any:
    """Deliver a webhook as X-Hub does: a 503 (PostgreSQL briefly out of connections when other
    suites share it) is retried with the same id until the deadline; the answer must be 200."""
    body, headers = delivery(payload, SECRET, event_id=event_id)
    deadline = time.monotonic() + UNAVAILABLE_RETRY_S
    while True:
        response = await client.post("/webhooks/xhub", data=body, headers=headers)
        if response.status != 503 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert response.status == 200, await response.text()
    return await response.json()


async def effects(db: Any, payment_id: str) -> dict[str, Any]:
    order = await db.fetchrow("SELECT status FROM orders WHERE payment_id = $1", payment_id)
    ledger = await db.fetch(
        "SELECT kind, points FROM bonus_ledger WHERE payment_id = $1 ORDER BY id", payment_id
    )
    emails = await db.fetch(
        "SELECT template FROM emails_sent WHERE payment_id = $1 AND NOT skipped ORDER BY template",
        payment_id,
    )
    return {
        "status": order["status"] if order is not None else None,
        "bonus": sum(r["points"] for r in ledger),
        "ledger": [r["kind"] for r in ledger],
        "emails": [r["template"] for r in emails],
    }


def smtp_messages(sink: SmtpSink, payment_id: str) -> list[str]:
    """Templates of the SMTP messages the sink received for a payment, sorted."""
    return sorted(
        str(m["X-Payhooks-Template"])
        for m in sink.messages
        if str(m["Message-ID"]).endswith(f".{payment_id}@example.test>")
    )


async def paid_once(db: Any, sink: SmtpSink, payment_id: str, event_id: str) -> None:
    """The orders worker applied `event_id` once, paying the order: one processed mark, one
    grant of 500 points, one success email recorded and one received by the SMTP sink."""
    processed = await db.fetchval(
        "SELECT count(*) FROM processed_events WHERE worker = 'orders' AND event_id = $1", event_id
    )
    assert processed == 1
    assert await effects(db, payment_id) == {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant"],
        "emails": ["payment_succeeded"],
    }
    assert smtp_messages(sink, payment_id) == ["payment_succeeded"]


def smtp_counts(sink: SmtpSink) -> Counter[str]:
    """SMTP messages received per Message-ID (one per (template, payment) is the rule)."""
    return Counter(str(m["Message-ID"]) for m in sink.messages)


_PROGRESS = """
SELECT
  (SELECT count(*) FROM inbox_unpublished) AS inbox_unpublished,
  (SELECT count(*) FROM inbox i WHERE NOT EXISTS (
      SELECT 1 FROM processed_events p WHERE p.worker = 'orders' AND p.event_id =
        CASE i.provider WHEN 'xhub' THEN i.event_id ELSE i.provider || ':' || i.event_id END)
  ) AS orders_pending,
  (SELECT count(*) FROM inbox) AS inbox,
  (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS outbox_unpublished,
  (SELECT count(*) FROM outbox o WHERE NOT EXISTS (
      SELECT 1 FROM processed_events p WHERE p.worker = 'bonuses' AND p.event_id = o.message_id)
  ) AS bonuses_pending,
  (SELECT count(*) FROM outbox) AS outbox
"""


async def progress(db: Any, system: System) -> dict[str, int]:
    row = await db.fetchrow(_PROGRESS)
    return {
        **{k: int(v) for k, v in row.items()},
        "orders_finished": system.finished("orders"),
        "bonuses_finished": system.finished("bonuses"),
        "email_finished": system.finished("email"),
    }


async def quiescent(
    db: Any, system: System, *, extra_orders_deliveries: int = 0, timeout_s: float = 20.0
) -> dict[str, int]:
    """Wait until everything stored has gone all the way through, and return the counts.

    Every inbox event is published and recorded by the orders worker, every outbox row is
    published and recorded by the bonuses worker, and each worker has finished at least as many
    deliveries as were sent to its queue (ingest publishes each event id once; the relay each
    outbox row once; `extra_orders_deliveries` counts copies a test published itself). The email
    worker keeps no per-message record, so its finished count is the only sign it is done.
    """

    def done(p: dict[str, int]) -> bool:
        return (
            p["inbox_unpublished"] == 0
            and p["orders_pending"] == 0
            and p["outbox_unpublished"] == 0
            and p["bonuses_pending"] == 0
            and p["orders_finished"] >= p["inbox"] + extra_orders_deliveries
            and p["bonuses_finished"] >= p["outbox"]
            and p["email_finished"] >= p["outbox"]
        )

    return await eventually(lambda: progress(db, system), done, timeout_s=timeout_s)


# Headers the worker runtime adds on failure; a requeued copy starts a fresh retry ladder.
_FAILURE_HEADERS = {ATTEMPTS, FIRST_FAILED_AT, LAST_FAILED_AT, LAST_ERROR, "reason"}


async def requeue_one(channel: AbstractChannel, dlq: str) -> AbstractIncomingMessage:
    """Move one message from a DLQ back to its original queue: the copy is confirmed on the
    work queue before the DLQ copy is acked (a crash in between duplicates, never loses)."""
    queue = await channel.get_queue(dlq, ensure=False)
    message = await queue.get(no_ack=False, fail=True)
    assert message is not None
    headers = dict(message.headers or {})
    original = _text(headers[ORIGINAL_QUEUE])
    copy = aio_pika.Message(
        message.body,
        headers={
            k: v for k, v in headers.items() if k not in _FAILURE_HEADERS and not k.startswith("x-")
        },
        message_id=message.message_id,
        type=message.type,
        content_type=message.content_type,
        delivery_mode=DeliveryMode.PERSISTENT,
    )
    await channel.default_exchange.publish(copy, routing_key=original, mandatory=True)
    await message.ack()
    return message


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def header(message: AbstractIncomingMessage, name: str) -> str:
    """A header as text (AMQP long strings may arrive as bytes)."""
    return _text((message.headers or {})[name])


async def get_one(channel: AbstractChannel, queue_name: str) -> AbstractIncomingMessage | None:
    queue = await channel.get_queue(queue_name, ensure=False)
    return await queue.get(no_ack=True, fail=False)


async def gather_posts(
    client: TestClient, posts: Iterable[tuple[dict[str, Any], str]]
) -> list[Any]:
    """Post (payload, event id) pairs all at once through ingest."""
    return list(await asyncio.gather(*(post(client, p, event_id=e) for p, e in posts)))
