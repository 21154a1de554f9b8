"""`payhooks missing`, GET /api/missing and the console's page (issue 34 item 5): the payments
the reconciler could not decide and the event ids ingest refused (401, 5xx) that never came
in since, within a time window, through shared/ops/missing.py. Ingest writes the refused ids
(services/ingest/refusals.py) best-effort from a bounded buffer.

Real PostgreSQL and RabbitMQ; ingest and the api run as their own aiohttp apps."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from services.ingest.app import create_app as ingest_app
from shared.amqp.broker import BROKER
from shared.config import Settings
from shared.queries import orders as orders_sql
from tests.helpers import delivery, eventually, payment_event
from tests.integration.api_contract import documented, running_api
from tests.integration.system import SECRET, register
from tests.integration.test_cli_operators import cli_env, run_payhooks
from tests.integration.test_console import sign_in
from tests.integration.test_dlq import new_id

ANN = {"Authorization": "Bearer ann-token"}
LONG_AGO = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)


@pytest.fixture
def missing_settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(ADMIN_TOKENS="ann:operator:ann-token")


@pytest.fixture
async def ingest(
    aiohttp_client: Any, missing_settings: Settings, db: Any, channel: AbstractChannel
) -> TestClient:
    app = ingest_app(missing_settings)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


@pytest.fixture
async def api(aiohttp_client: Any, missing_settings: Settings, db: Any) -> TestClient:
    return await running_api(aiohttp_client, missing_settings)


async def refused_ids(db: Any) -> set[str]:
    return {r["event_id"] for r in await db.fetch("SELECT event_id FROM refused_webhooks")}


async def deliver(ingest: TestClient, event_id: str, secret: str) -> int:
    body, headers = delivery(payment_event(new_id("pay"), "paid"), secret, event_id=event_id)
    response = await ingest.post("/webhooks/xhub", data=body, headers=headers)
    return response.status


async def test_missing_lists_an_undecided_order_and_a_refused_event_id_within_the_window(
    ingest: TestClient, api: TestClient, db: Any, missing_settings: Settings
) -> None:
    refused, later_accepted = new_id("evt"), new_id("evt")
    assert await deliver(ingest, refused, "not-the-secret") == 401
    assert await deliver(ingest, later_accepted, "not-the-secret") == 401
    assert await deliver(ingest, later_accepted, SECRET) == 200
    await eventually(lambda: refused_ids(db), lambda ids: {refused, later_accepted} <= ids)
    row = await db.fetchrow(
        "SELECT status, outcome, refusals FROM refused_webhooks WHERE event_id = $1", refused
    )
    assert dict(row) == {"status": 401, "outcome": "invalid_signature", "refusals": 1}
    undecided = new_id("pay")
    await register(db, undecided)
    await orders_sql.flag_undecided(db, undecided, "currency_mismatch")
    cli = cli_env(missing_settings)
    now = dt.datetime.now(dt.UTC)
    since, until = now - dt.timedelta(hours=1), now + dt.timedelta(minutes=5)
    window = ["--since", since.isoformat(), "--until", until.isoformat()]

    run = await run_payhooks(cli, "missing", *window, "--json")

    assert run.code == 0, run.err
    found = run.json()
    assert [(u["payment_id"], u["reason"]) for u in found["undecided"]] == [
        (undecided, "currency_mismatch")
    ]
    # The id accepted after its refusal is in the inbox now: not missing.
    assert [(r["event_id"], r["status"], r["provider"]) for r in found["refused"]] == [
        (refused, 401, "xhub")
    ]
    text = await run_payhooks(cli, "missing", *window)
    assert refused in text.out
    assert undecided in text.out

    by_api = await api.get(
        "/api/missing", params={"since": window[1], "until": window[3]}, headers=ANN
    )
    assert by_api.status == 200
    assert await documented(by_api, "GET", "/api/missing") == found
    await sign_in(api, "ann-token")
    page = await (await api.get("/console/missing")).text()
    assert refused in page
    assert undecided in page

    # Outside the window: moved to long ago, neither is listed in the last hour...
    await db.execute("UPDATE refused_webhooks SET first_at = $1, last_at = $1", LONG_AGO)
    await db.execute(
        "UPDATE orders SET undecided_since = $1 WHERE payment_id = $2", LONG_AGO, undecided
    )
    empty = await run_payhooks(cli, "missing", *window, "--json")
    assert empty.code == 1
    assert empty.json()["undecided"] == empty.json()["refused"] == []
    # ... and both are in a window around then.
    around = ["--since", "2026-01-01T00:00:00Z", "--until", "2026-01-02T00:00:00Z", "--json"]
    back_then = (await run_payhooks(cli, "missing", *around)).json()
    assert [u["payment_id"] for u in back_then["undecided"]] == [undecided]
    assert [r["event_id"] for r in back_then["refused"]] == [refused]


async def test_missing_refuses_a_window_that_is_not_one(
    api: TestClient, missing_settings: Settings
) -> None:
    bad = await api.get("/api/missing", params={"since": "yesterday"}, headers=ANN)
    assert bad.status == 400
    assert (await documented(bad, "GET", "/api/missing"))["code"] == "invalid_request"
    backwards = await api.get(
        "/api/missing",
        params={"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
        headers=ANN,
    )
    assert backwards.status == 400
    run = await run_payhooks(cli_env(missing_settings), "missing", "--limit", "0")
    assert run.code == 2
    assert "--limit" in run.err


async def test_ingest_keeps_a_refused_id_and_nothing_else_of_the_webhook(
    ingest: TestClient, db: Any
) -> None:
    kept = new_id("evt")
    # An id that is not one is malformed (400) before its signature is looked at: never kept
    # (services/ingest/refusals.py keepable_id would drop it anyway).
    assert await deliver(ingest, "x" * 256, "not-the-secret") == 400
    assert await deliver(ingest, kept, "not-the-secret") == 401
    await eventually(lambda: refused_ids(db), lambda ids: kept in ids)
    assert await refused_ids(db) == {kept}
    columns = {
        r["column_name"]
        for r in await db.fetch(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'refused_webhooks'"
        )
    }
    assert not columns & {"body", "headers", "signature"}
