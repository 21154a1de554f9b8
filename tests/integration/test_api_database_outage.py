"""The api while PostgreSQL is cut off or stalled: 503 JSON with Retry-After, never a 500.

The real PostgreSQL keeps running; the api reaches it through a TcpProxy (tests/proxy.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from services.api.app import create_app
from shared.config import Settings
from tests.conftest import TEST_DATABASE_URL
from tests.proxy import TcpProxy, proxy_to, via

TOKEN = {"Authorization": "Bearer test-admin-token"}
ORDER = {
    "order_id": "ord_outage_1",
    "payment_id": "pay_outage_1",
    "user_id": "user_outage_1",
    "email": "buyer@example.test",
    "amount": "100.00",
    "currency": "USD",
}
# A refused or reset connection answers at once; a stalled one at the statement timeout plus
# asyncpg's wait for its cancel request (shared/db.py COMMAND_TIMEOUT_S, twice).
CUT_ANSWER_WITHIN_S = 2.0
STALL_ANSWER_WITHIN_S = 12.0


@pytest.fixture
async def pg() -> AsyncIterator[TcpProxy]:
    proxy = await proxy_to(TEST_DATABASE_URL, 5432)
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.fixture
async def api(
    aiohttp_client: Any, make_settings: Callable[..., Settings], pg: TcpProxy, db: Any, amqp: Any
) -> AsyncIterator[TestClient]:
    settings = make_settings(DATABASE_URL=via(make_settings().database_url, pg))
    client: TestClient = await aiohttp_client(create_app(settings))
    yield client
    pg.restore()  # a stalled proxy would hold the app's shutdown


async def _assert_unavailable(
    client: TestClient, method: str, path: str, within_s: float, **kwargs: Any
) -> None:
    started = time.monotonic()
    response = await client.request(method, path, headers=TOKEN, **kwargs)
    elapsed_s = time.monotonic() - started

    assert response.status == 503, (path, await response.text())
    assert response.content_type == "application/problem+json"
    problem = await response.json()
    assert "PostgreSQL" in problem["error"]
    assert problem["code"] == "unavailable"
    assert int(response.headers["Retry-After"]) > 0
    assert elapsed_s < within_s, f"{path} answered after {elapsed_s:.1f}s"


async def test_database_cut_off_is_503_json_with_retry_after(api: TestClient, pg: TcpProxy) -> None:
    # A pooled connection exists before the outage, as in a running api.
    assert (await api.post("/api/orders", json=ORDER, headers=TOKEN)).status == 201
    pg.cut()

    await _assert_unavailable(api, "GET", "/api/orders/ord_outage_1", CUT_ANSWER_WITHIN_S)
    new_order = {**ORDER, "order_id": "ord_2", "payment_id": "pay_2"}
    await _assert_unavailable(api, "POST", "/api/orders", CUT_ANSWER_WITHIN_S, json=new_order)
    await _assert_unavailable(api, "GET", "/api/users/user_outage_1/bonus", CUT_ANSWER_WITHIN_S)

    pg.restore()
    assert (await api.get("/api/orders/ord_outage_1", headers=TOKEN)).status == 200


async def test_database_stall_is_503_json_with_retry_after(api: TestClient, pg: TcpProxy) -> None:
    assert (await api.post("/api/orders", json=ORDER, headers=TOKEN)).status == 201
    pg.stall()

    await _assert_unavailable(api, "GET", "/api/orders/ord_outage_1", STALL_ANSWER_WITHIN_S)


async def test_database_refusing_connections_is_503(
    aiohttp_client: Any, make_settings: Callable[..., Settings], amqp: Any
) -> None:
    proxy = await proxy_to(TEST_DATABASE_URL, 5432)
    proxy.cut()  # every new connection is reset at once, as by a server that is down
    try:
        settings = make_settings(DATABASE_URL=via(make_settings().database_url, proxy))
        client: TestClient = await aiohttp_client(create_app(settings))

        await _assert_unavailable(client, "GET", "/api/payments/pay_nothing", CUT_ANSWER_WITHIN_S)
    finally:
        await proxy.close()


async def test_connections_terminated_under_load_are_503_never_500(
    aiohttp_client: Any, make_settings: Callable[..., Settings], db: Any, amqp: Any
) -> None:
    # `make chaos` (issue 39): every database connection terminated every 0.5 s for 20 s gave
    # three 500s from the api (register, read). Here: the api's connections, every 0.1 s.
    client: TestClient = await aiohttp_client(create_app(make_settings()))
    statuses: Counter[int] = Counter()
    stop = asyncio.Event()

    async def terminate() -> None:
        while not stop.is_set():
            await db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            await asyncio.sleep(0.1)

    async def requests(n: int) -> None:
        for i in range(40):
            order = {**ORDER, "order_id": f"ord_t{n}_{i}", "payment_id": f"pay_t{n}_{i}"}
            for method, path, body in (
                ("POST", "/api/orders", order),
                ("GET", f"/api/orders/{order['order_id']}", None),
                ("GET", f"/api/payments/{order['payment_id']}", None),
            ):
                response = await client.request(method, path, json=body, headers=TOKEN)
                statuses[response.status] += 1
                if response.status == 503:
                    assert response.headers["Retry-After"]
                    assert response.content_type == "application/problem+json"

    killer = asyncio.create_task(terminate())
    try:
        await asyncio.gather(*(requests(n) for n in range(4)))
    finally:
        stop.set()
        await killer
    assert statuses[500] == 0, statuses
    assert set(statuses) <= {200, 201, 404, 503}, statuses
