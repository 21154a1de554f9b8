"""Scoped tokens and the audit trail: the shop's `orders` token is refused operator routes;
every operator action (api and cli) is recorded once with its actor."""

from __future__ import annotations

import getpass
import os
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from shared.amqp.topology import Topology
from shared.config import Settings
from tests.integration.api_contract import documented, running_api
from tests.integration.test_cli_operators import cli_env, run_payhooks
from tests.integration.test_dlq import Letter, new_id, put_dead_letters, queue_ids

SHOP = {"Authorization": "Bearer shop-token"}
ANN = {"Authorization": "Bearer ann-token"}
OLD = {"Authorization": "Bearer test-admin-token"}  # ADMIN_TOKEN, still set


@pytest.fixture
async def api(aiohttp_client: Any, make_settings: Any, db: Any, channel: Any) -> TestClient:
    tokens = "shop:orders:shop-token,ann:operator:ann-token"
    return await running_api(aiohttp_client, make_settings(ADMIN_TOKENS=tokens))


def order(order_id: str | None = None) -> dict[str, str]:
    return {
        "order_id": order_id or new_id("ord"),
        "payment_id": new_id("pay"),
        "user_id": "user_1",
        "email": "a@example.com",
        "amount": "10.00",
        "currency": "RUB",
    }


async def trail(db: Any) -> list[dict[str, Any]]:
    rows = await db.fetch("SELECT * FROM operator_actions ORDER BY id")
    return [dict(row) for row in rows]


async def test_the_shop_token_registers_orders_and_is_refused_operator_routes(
    api: TestClient, db: Any
) -> None:
    new = order()
    created = await api.post("/api/orders", json=new, headers=SHOP)
    again = await api.post("/api/orders", json=new, headers=SHOP)
    assert (created.status, again.status) == (201, 200)
    await documented(created, "POST", "/api/orders")
    got = await api.get(f"/api/orders/{new['order_id']}", headers=SHOP)
    assert got.status == 200
    assert (await api.get("/api/events", headers=SHOP)).status == 200
    refused = [
        ("POST", "/api/dlq/{queue}/requeue", "/api/dlq/orders/requeue", {"all": True}),
        ("GET", "/api/dlq", "/api/dlq", None),
        ("GET", "/api/dlq/{queue}", "/api/dlq/orders", None),
        ("GET", "/api/unrouted", "/api/unrouted", None),
        ("GET", "/api/audit", "/api/audit", None),
    ]
    for method, template, path, body in refused:
        answer = await api.request(method, path, json=body, headers=SHOP)
        assert answer.status == 403, path
        assert (await documented(answer, method, template))["code"] == "forbidden"
    # The registration is recorded once (not the idempotent 200), by the shop's token.
    [registered] = await trail(db)
    assert (registered["actor"], registered["source"], registered["action"]) == (
        "shop",
        "api",
        "order.register",
    )
    assert (registered["target"], registered["count"]) == (new["order_id"], 1)


async def test_an_api_requeue_is_recorded_with_its_selection_and_listed_by_the_api(
    api: TestClient, db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    letters = [Letter(reason="unknown_payment") for _ in range(2)]
    await put_dead_letters(channel, topology.work["orders"], letters)
    dry = await api.post(
        "/api/dlq/orders/requeue", json={"all": True, "dry_run": True}, headers=ANN
    )
    moved = await api.post(
        "/api/dlq/orders/requeue", json={"reason": "unknown_payment"}, headers=ANN
    )
    assert (dry.status, moved.status) == (200, 200)
    [requeued] = await trail(db)  # the dry run is not an action
    assert requeued["actor"] == "ann"
    assert requeued["action"] == "dlq.requeue"
    assert requeued["target"] == topology.work["orders"].dlq
    assert requeued["filter"] == {"reason": "unknown_payment"}
    assert (requeued["ids"], requeued["count"]) == ([x.id for x in letters], 2)
    # The old ADMIN_TOKEN still opens everything, as `admin`.
    assert (await api.post("/api/orders", json=order(), headers=OLD)).status == 201
    first = await api.get("/api/audit?limit=1", headers=ANN)
    page = await documented(first, "GET", "/api/audit")
    assert [a["actor"] for a in page["actions"]] == ["admin"]  # newest first
    cursor = page["next_cursor"]
    rest = await documented(
        await api.get(f"/api/audit?cursor={cursor}", headers=OLD), "GET", "/api/audit"
    )
    assert [a["action"] for a in rest["actions"]] == ["dlq.requeue"]
    assert rest["next_cursor"] is None
    bad = await api.get("/api/audit?cursor=x", headers=ANN)
    assert (await documented(bad, "GET", "/api/audit"))["code"] == "invalid_request"


async def test_cli_requeue_purge_and_order_add_are_recorded_as_the_os_user(
    settings: Settings, db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    user = os.environ.get("USER") or getpass.getuser()
    env = cli_env(settings, USER=user)
    work = topology.work["orders"]
    letters = [Letter() for _ in range(3)]
    await put_dead_letters(channel, work, letters)
    new = order()
    args = [f"--{k.replace('_', '-')}={v}" for k, v in new.items()]
    assert (await run_payhooks(env, "order", "add", *args)).code == 0
    assert (await run_payhooks(env, "order", "add", *args)).code == 0  # already: not again
    dry = await run_payhooks(env, "dlq", "requeue", "orders", "--id", letters[0].id, "--dry-run")
    assert dry.code == 0
    assert (await run_payhooks(env, "dlq", "requeue", "orders", "--id", letters[0].id)).code == 0
    assert (await run_payhooks(env, "dlq", "purge", "orders", "--yes")).code == 0
    actions = await trail(db)
    assert [(a["actor"], a["source"], a["action"]) for a in actions] == [
        (f"cli:{user}", "cli", "order.register"),
        (f"cli:{user}", "cli", "dlq.requeue"),
        (f"cli:{user}", "cli", "dlq.purge"),
    ]
    assert actions[1]["filter"] == {"ids": [letters[0].id]}
    assert (actions[1]["ids"], actions[1]["count"]) == ([letters[0].id], 1)
    assert (actions[2]["target"], actions[2]["count"]) == (work.dlq, 2)
    assert sorted(actions[2]["ids"]) == sorted(x.id for x in letters[1:])
    listed = await run_payhooks(env, "audit", "--json", "--limit", "2")
    assert listed.code == 0, listed.err
    assert [a["action"] for a in listed.json()["actions"]] == ["dlq.purge", "dlq.requeue"]
    human = await run_payhooks(env, "audit")
    assert f"cli:{user}" in human.out
    assert "order.register" in human.out


async def test_an_action_whose_audit_write_fails_still_stands_and_is_logged_loudly(
    api: TestClient, db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    work = topology.work["orders"]
    letter = Letter()
    await put_dead_letters(channel, work, [letter])
    # The audit table refuses ann's rows (a full disk, a lost privilege would do the same).
    await db.execute(
        "CREATE FUNCTION refuse_ann() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.actor = 'ann' THEN RAISE EXCEPTION 'audit write refused'; END IF;"
        " RETURN NEW; END $$;"
        " CREATE TRIGGER refuse_ann BEFORE INSERT ON operator_actions"
        " FOR EACH ROW EXECUTE FUNCTION refuse_ann()"
    )
    try:
        with capture_logs() as logs:
            answer = await api.post(
                "/api/dlq/orders/requeue", json={"ids": [letter.id]}, headers=ANN
            )
    finally:
        await db.execute("DROP TRIGGER refuse_ann ON operator_actions; DROP FUNCTION refuse_ann()")

    assert answer.status == 200
    assert (await answer.json())["requeued"] == 1  # the requeue happened: it is not undone
    assert await queue_ids(channel, {work.name: [letter.id]}) == {work.name: [letter.id]}
    assert await trail(db) == []
    [failed] = [e for e in logs if e["event"] == "audit_record_failed"]
    assert failed["log_level"] == "error"
    assert (failed["actor"], failed["action"], failed["ids"]) == ("ann", "dlq.requeue", [letter.id])
    assert "audit write refused" in failed["error"]
