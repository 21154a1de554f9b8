"""Ingest while PostgreSQL or RabbitMQ is cut off or stalled (SPEC section 3, the 503 row).

The real servers keep running: the app reaches them through a TcpProxy (tests/proxy.py)
that the test cuts, stalls and restores. The tests read queues and rows directly, never
through the proxy.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from services.ingest.app import create_app
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from tests.conftest import TEST_AMQP_URL, TEST_DATABASE_URL, TEST_SECRETS, own_database
from tests.helpers import delivery, drain, eventually, payment_event, signed_headers
from tests.proxy import TcpProxy

SECRET = TEST_SECRETS[0]
URL = "/webhooks/xhub"
# The provider's hard budget for any answer (SPEC section 3).
BUDGET_S = 10.0
# aio-pika's robust connection retries every 5 s; leave room for one missed attempt.
RECONNECT_TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def migrated_database() -> Iterator[str]:
    """A database of this module's own (overrides conftest's).

    Every ingest app runs a sweeper that claims any unpublished row in its database; another
    module's ingest would publish (or its `db` fixture truncate) the rows these tests strand
    on purpose.
    """
    with own_database("outages") as url:
        yield url


def _via(url: str, proxy: TcpProxy) -> str:
    """`url` with its host and port replaced by the proxy's (credentials kept)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{proxy.address}" if credentials else proxy.address
    return urlunsplit(parts._replace(netloc=netloc))


async def _proxy_to(url: str, default_port: int) -> TcpProxy:
    parts = urlsplit(url)
    return await TcpProxy(parts.hostname or "127.0.0.1", parts.port or default_port).start()


@dataclass(frozen=True, slots=True)
class Proxies:
    pg: TcpProxy
    amqp: TcpProxy


@pytest.fixture
async def proxies() -> AsyncIterator[Proxies]:
    pg = await _proxy_to(TEST_DATABASE_URL, 5432)
    amqp = await _proxy_to(TEST_AMQP_URL, 5672)
    try:
        yield Proxies(pg, amqp)
    finally:
        await pg.close()
        await amqp.close()


IngestFactory = Callable[..., Awaitable[TestClient]]


@pytest.fixture
async def ingest(
    proxies: Proxies,
    aiohttp_client: Any,
    make_settings: Callable[..., Settings],
    amqp: Any,
) -> AsyncIterator[IngestFactory]:
    """Start an ingest app whose PostgreSQL and/or RabbitMQ path runs through a proxy."""

    async def start(
        *, pg: bool = False, broker: bool = False, env: dict[str, str] | None = None, **kwargs: Any
    ) -> TestClient:
        overrides = dict(env or {})
        if pg:
            overrides["DATABASE_URL"] = _via(make_settings().database_url, proxies.pg)
        if broker:
            overrides["AMQP_URL"] = _via(TEST_AMQP_URL, proxies.amqp)
        app = create_app(make_settings(**overrides), **kwargs)
        client: TestClient = await aiohttp_client(app)
        await app[BROKER].wait_connected(10)
        await _wait_ready(client)
        return client

    yield start
    # A stalled proxy would hang the apps' shutdown (it closes connections politely).
    proxies.pg.restore()
    proxies.amqp.restore()


async def _wait_ready(client: TestClient, timeout_s: float = RECONNECT_TIMEOUT_S) -> None:
    async def readyz() -> int:
        async with client.get("/readyz") as response:
            return response.status

    await eventually(readyz, lambda status: status == 200, timeout_s=timeout_s, interval_s=0.1)


async def _post(client: TestClient, event_id: str, body: bytes) -> tuple[ClientResponse, float]:
    """One delivery attempt (fresh timestamp, as the provider signs each attempt)."""
    headers = signed_headers(body, SECRET, event_id=event_id)
    started = time.monotonic()
    response = await client.post(URL, data=body, headers=headers)
    await response.read()
    return response, time.monotonic() - started


def _assert_unavailable(response: ClientResponse, elapsed_s: float) -> None:
    assert response.status == 503, response
    retry_after = response.headers.get("Retry-After", "")
    assert retry_after.isdigit(), f"Retry-After: {retry_after!r}"
    assert int(retry_after) > 0
    assert elapsed_s < BUDGET_S, f"answered after {elapsed_s:.2f}s"


async def _rows(db: Any, event_id: str) -> list[Any]:
    return list(await db.fetch("SELECT * FROM inbox WHERE event_id = $1", event_id))


async def _published(db: Any, event_id: str) -> bool:
    """Stored, and its publish confirmed (no longer among the unpublished)."""
    return bool(
        await db.fetchval(
            "SELECT NOT EXISTS (SELECT 1 FROM inbox_unpublished u WHERE u.id = i.id)"
            " FROM inbox i WHERE event_id = $1",
            event_id,
        )
    )


async def _message_ids(amqp: Any, topology: Topology, *, settle_s: float = 0.5) -> list[str]:
    messages = await drain(amqp, topology.work["orders"].name, settle_s=settle_s)
    return [m.message_id or "" for m in messages]


def _new_event() -> tuple[str, bytes]:
    event_id = f"evt_{uuid.uuid4().hex}"
    body, _ = delivery(payment_event(), SECRET, event_id=event_id)
    return event_id, body


async def test_broker_cut_answers_503_and_the_retry_publishes_once(
    ingest: IngestFactory, proxies: Proxies, db: Any, amqp: Any, topology: Topology
) -> None:
    client = await ingest(broker=True)
    event_id, body = _new_event()
    proxies.amqp.cut()

    response, elapsed_s = await _post(client, event_id, body)

    _assert_unavailable(response, elapsed_s)
    assert len(await _rows(db, event_id)) <= 1  # stored but unpublished is fine
    proxies.amqp.restore()
    await _wait_ready(client)
    retry, _ = await _post(client, event_id, body)
    assert retry.status == 200
    assert (await retry.json())["status"] in {"accepted", "duplicate"}
    assert await _message_ids(amqp, topology) == [event_id]
    assert len(await _rows(db, event_id)) == 1
    await eventually(lambda: _published(db, event_id), lambda published: published)


async def test_broker_stall_answers_503_and_the_retry_leaves_one_message(
    ingest: IngestFactory, proxies: Proxies, db: Any, amqp: Any, topology: Topology
) -> None:
    client = await ingest(broker=True)
    event_id, body = _new_event()
    proxies.amqp.stall()

    response, elapsed_s = await _post(client, event_id, body)

    _assert_unavailable(response, elapsed_s)
    # The stalled publish is delivered now: RabbitMQ may well route it after all.
    proxies.amqp.restore()
    await _wait_ready(client)
    retry, _ = await _post(client, event_id, body)
    assert retry.status == 200
    ids = await _message_ids(amqp, topology)
    assert ids == [event_id], f"SPEC: published once; {len(ids)} copies in the orders queue"
    assert len(await _rows(db, event_id)) == 1


@pytest.mark.parametrize("outage", ["cut", "stall"])
async def test_database_outage_answers_503_publishes_nothing_and_the_retry_is_stored_once(
    ingest: IngestFactory,
    proxies: Proxies,
    db: Any,
    amqp: Any,
    topology: Topology,
    outage: str,
) -> None:
    client = await ingest(pg=True)
    # A running service's pooled connection has the insert prepared already: under a stall
    # the held bytes are then the INSERT itself, not just its Parse.
    warm_id, warm_body = _new_event()
    assert (await _post(client, warm_id, warm_body))[0].status == 200
    assert await _message_ids(amqp, topology, settle_s=0.1) == [warm_id]
    event_id, body = _new_event()
    proxies.pg.cut() if outage == "cut" else proxies.pg.stall()

    response, elapsed_s = await _post(client, event_id, body)

    _assert_unavailable(response, elapsed_s)
    assert await _message_ids(amqp, topology, settle_s=0.2) == []
    assert await _rows(db, event_id) == []
    proxies.pg.restore()
    await _wait_ready(client)
    retry, _ = await _post(client, event_id, body)
    assert retry.status == 200
    # SPEC: a 200 comes only once the event is stored and confirmed by RabbitMQ; a stored
    # copy that was never confirmed is published by the retry ("published now").
    ids = await _message_ids(amqp, topology)
    rows = [
        {k: r[k] for k in ("received_at", "id")} | {"published": await _published(db, event_id)}
        for r in await _rows(db, event_id)
    ]
    assert ids == [event_id], f"retry answered {await retry.json()}; queue: {ids}; row: {rows}"
    assert len(await _rows(db, event_id)) == 1


async def test_sweeper_publishes_an_event_whose_publish_failed_and_was_never_retried(
    ingest: IngestFactory, proxies: Proxies, db: Any, amqp: Any, topology: Topology
) -> None:
    client = await ingest(
        broker=True,
        sweep_interval_s=0.2,
        sweep_after_s=1.0,
    )
    event_id, body = _new_event()
    proxies.amqp.cut()
    response, elapsed_s = await _post(client, event_id, body)
    _assert_unavailable(response, elapsed_s)
    assert len(await _rows(db, event_id)) == 1
    assert not await _published(db, event_id)

    proxies.amqp.restore()  # ...and the provider never retries

    await eventually(
        lambda: _published(db, event_id),
        lambda published: published,
        timeout_s=RECONNECT_TIMEOUT_S,
    )
    assert await _message_ids(amqp, topology) == [event_id]
    assert len(await _rows(db, event_id)) == 1


async def test_rotated_secrets_accept_both_and_a_retired_secret_is_401(
    ingest: IngestFactory, db: Any, amqp: Any, topology: Topology
) -> None:
    both = await ingest(env={"XHUB_WEBHOOK_SECRETS": "new,old"})
    only_new = await ingest(env={"XHUB_WEBHOOK_SECRETS": "new"})
    signed_new, signed_old, rejected = (f"evt_{uuid.uuid4().hex}" for _ in range(3))

    answers = [
        await both.post(URL, data=body, headers=headers)
        for body, headers in (
            delivery(payment_event(), "new", event_id=signed_new),
            delivery(payment_event(), "old", event_id=signed_old),
        )
    ]
    body, headers = delivery(payment_event(), "old", event_id=rejected)
    retired = await only_new.post(URL, data=body, headers=headers)

    assert [a.status for a in answers] == [200, 200]
    assert [(await a.json())["status"] for a in answers] == ["accepted", "accepted"]
    assert retired.status == 401
    assert await _rows(db, rejected) == []
    assert sorted(await _message_ids(amqp, topology)) == sorted([signed_new, signed_old])


@pytest.mark.parametrize(
    ("dependency", "fault"), [("pg", "cut"), ("amqp", "cut"), ("amqp", "stall")]
)
async def test_readyz_follows_a_cut_dependency_and_healthz_stays_up(
    ingest: IngestFactory, proxies: Proxies, dependency: str, fault: str
) -> None:
    client = await ingest(pg=dependency == "pg", broker=dependency == "amqp")
    proxy = proxies.pg if dependency == "pg" else proxies.amqp

    async def probe(path: str) -> int:
        async with client.get(path) as response:
            return response.status

    assert await probe("/readyz") == 200
    getattr(proxy, fault)()  # a black hole too: the check is a round trip the broker answers
    await eventually(lambda: probe("/readyz"), lambda status: status == 503)
    assert await probe("/healthz") == 200
    proxy.restore()
    await _wait_ready(client)
    assert await probe("/healthz") == 200
