"""Replay through every edge (api, console, CLI): one function (operator_actions.replay_recorded)
leaves the same audit row and the same answer; the api's answers are as its OpenAPI document
says, bad input a problem+json 4xx; what is sent is the stored webhook as it came, marked by
headers only (`replay`, and `reprocess` when asked)."""

from __future__ import annotations

import getpass
import os
import re
from typing import Any

import orjson
import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from services.cli import replay as cli_replay
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.ops import replay as replay_module
from shared.vocabulary import REPLAY, REPROCESS
from tests.helpers import drain
from tests.integration.api_contract import documented, running_api
from tests.integration.inbox_events import store_events
from tests.integration.test_cli_operators import cli_env, run_payhooks
from tests.integration.test_console import csrf_of, sign_in
from tests.integration.test_dlq import new_id

ANN = {"Authorization": "Bearer ann-token"}
SHOP = {"Authorization": "Bearer shop-token"}


@pytest.fixture
async def api(aiohttp_client: Any, make_settings: Any, db: Any, channel: Any) -> TestClient:
    tokens = "ann:operator:ann-token,shop:orders:shop-token"
    settings = make_settings(ADMIN_TOKENS=tokens, ADMIN_TOKEN="test-admin-token")
    return await running_api(aiohttp_client, settings)


@pytest.fixture
def cli(settings: Settings) -> dict[str, str]:
    return cli_env(settings, USER=os.environ.get("USER") or getpass.getuser())


async def test_api_replay_answers_as_documented_and_sends_the_stored_webhook(
    api: TestClient, db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    payment_id = new_id("pay")
    done, fresh = await store_events(db, 2, payment_id=payment_id)
    await db.execute(
        "INSERT INTO processed_events (worker, event_id, outcome) VALUES ('orders', $1, 'applied')",
        done,
    )
    selection = {"payment_id": payment_id}

    dry = await api.post("/api/replay", json={**selection, "dry_run": True}, headers=ANN)
    assert dry.status == 200
    counted = await documented(dry, "POST", "/api/replay")
    assert counted["workers"] == {
        "orders": {
            "messages": 2,
            "already_processed": 1,
            "would_skip": 1,
            "not_stored": 0,
            "published": 0,
        }
    }
    assert await drain(channel, topology.work["orders"].name, settle_s=0.1) == []

    real = await api.post(
        "/api/replay",
        json={**selection, "reprocess": True, "reason": "bad deploy 41"},
        headers=ANN,
    )
    assert real.status == 200
    answer = await documented(real, "POST", "/api/replay")
    assert answer["workers"]["orders"]["published"] == 2
    assert answer["workers"]["orders"]["would_skip"] == 0
    sent = await drain(channel, topology.work["orders"].name)
    stored = {
        r["event_id"]: bytes(r["body"])
        for r in await db.fetch(
            "SELECT event_id, body FROM inbox WHERE payment_id = $1", payment_id
        )
    }
    assert [m.message_id for m in sent] == [done, fresh]
    for message in sent:
        assert message.body == stored[message.message_id]
        headers = message.headers or {}
        assert headers[REPLAY] == headers[REPROCESS] == answer["replay_id"]
        assert headers["provider"] == "xhub"

    [row] = await db.fetch("SELECT actor, source, action, ids, count, filter FROM operator_actions")
    assert (row["actor"], row["source"], row["action"], row["count"]) == (
        "ann",
        "api",
        "event.replay",
        2,
    )
    assert list(row["ids"]) == [done, fresh]
    assert row["filter"]["reason"] == "bad deploy 41"
    assert row["filter"]["reprocess"] is True


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "selection"),
        ({"workers": ["orders"]}, "selection"),
        ({"payment_id": "p", "reprocess": True}, "reason"),
        ({"payment_id": "p", "workers": ["ledger"]}, "workers"),
        ({"payment_id": "p", "workers": "orders"}, "workers"),
        ({"payment_id": "p", "limit": True}, "limit"),
        ({"payment_id": "p", "limit": 0}, "limit"),
        ({"payment_id": "p", "dry_run": "yes"}, "dry_run"),
        ({"payment_id": 5}, "payment_id"),
        ({"since": "yesterday"}, "since"),
        ({"payment_id": "p", "outcome": "lost"}, "outcome"),
        ({"payment_id": "p", "body": {"reprocess": True}}, "body"),
        ([], "body"),
    ],
)
async def test_bad_replay_input_is_a_documented_400_naming_the_field(
    api: TestClient, body: Any, field: str
) -> None:
    response = await api.post("/api/replay", json=body, headers=ANN)
    assert response.status == 400
    problem = await documented(response, "POST", "/api/replay")
    assert (problem["code"], problem["field"]) == ("invalid_request", field)


async def test_not_json_too_large_and_the_shops_token_are_refused(
    api: TestClient, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    response = await api.post("/api/replay", data=b"{not json", headers=ANN)
    assert response.status == 400
    await documented(response, "POST", "/api/replay")
    shop = await api.post("/api/replay", json={"payment_id": "p"}, headers=SHOP)
    assert shop.status == 403
    await documented(shop, "POST", "/api/replay")

    payment_id = new_id("pay")
    await store_events(db, 3, payment_id=payment_id)
    monkeypatch.setattr(replay_module, "MAX_EVENTS", 2)
    huge = await api.post("/api/replay", json={"payment_id": payment_id}, headers=ANN)
    assert huge.status == 422
    problem = await documented(huge, "POST", "/api/replay")
    assert problem["code"] == "replay_too_large"
    limited = await api.post(
        "/api/replay", json={"payment_id": payment_id, "limit": 2, "dry_run": True}, headers=ANN
    )
    assert limited.status == 200
    cut = await documented(limited, "POST", "/api/replay")
    assert cut["more"] is True
    assert cut["events"] == 2
    assert cut["last_received_at"] is not None


def console_counts(page: str) -> dict[str, list[int]]:
    table = re.search(r'<table id="per-worker">(.*?)</table>', page, re.S)
    assert table is not None, page
    rows = re.findall(r"<tr><td>(\w+)</td>((?:<td class=\"num\">\d+</td>)+)</tr>", table.group(1))
    return {name: [int(n) for n in re.findall(r">(\d+)<", cells)] for name, cells in rows}


async def test_a_replay_leaves_the_same_row_and_answer_from_every_edge(
    api: TestClient, cli: dict[str, str], db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    payments = {edge: new_id("pay") for edge in ("api", "console", "cli")}
    events = {edge: (await store_events(db, payment_id=p))[0] for edge, p in payments.items()}

    by_api = await api.post("/api/replay", json={"payment_id": payments["api"]}, headers=ANN)
    assert by_api.status == 200
    api_answer = await by_api.json()

    await sign_in(api, "ann-token")
    csrf = await csrf_of(api, "/console/replay")
    form = {"csrf": csrf, "step": "dry-run", "payment_id": payments["console"]}
    dry = await api.post("/console/replay", data=form)
    assert dry.status == 200
    page = await dry.text()
    assert "Dry run" in page
    assert console_counts(page) == {"orders": [1, 0, 0, 0, 0]}
    confirm = re.search(r'<form id="confirm".*?</form>', page, re.S)
    assert confirm is not None
    fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', confirm.group(0))
    assert ("ids", events["console"]) in fields
    assert await db.fetchval("SELECT count(*) FROM operator_actions") == 1  # the api's
    done = await api.post("/console/replay", data=fields)
    assert done.status == 200
    assert console_counts(await done.text()) == {"orders": [1, 0, 0, 0, 1]}

    by_cli = await run_payhooks(cli, "replay", "--payment-id", payments["cli"], "--json")
    assert by_cli.code == 0, by_cli.err
    cli_answer = by_cli.json()

    assert api_answer.keys() == cli_answer.keys()
    for answer in (api_answer, cli_answer):
        assert answer["workers"]["orders"]["published"] == 1
    rows = await db.fetch(
        "SELECT actor, source, action, target, ids, count FROM operator_actions ORDER BY id"
    )
    user = os.environ.get("USER") or getpass.getuser()
    assert [(r["actor"], r["source"]) for r in rows] == [
        ("ann", "api"),
        ("ann", "console"),
        (f"cli:{user}", "cli"),
    ]
    for row, edge in zip(rows, ("api", "console", "cli"), strict=True):
        assert (row["action"], row["target"], list(row["ids"]), row["count"]) == (
            "event.replay",
            "orders",
            [events[edge]],
            1,
        ), edge
    sent = await drain(channel, topology.work["orders"].name)
    assert sorted(m.message_id or "" for m in sent) == sorted(events.values())
    assert all(orjson.loads(m.body)["payment_id"] in payments.values() for m in sent)


async def test_cli_exit_codes_follow_the_runbook(cli: dict[str, str], db: Any) -> None:
    nothing = await run_payhooks(cli, "replay", "--payment-id", new_id("pay"))
    assert nothing.code == 1
    assert "0 event(s) selected" in nothing.out
    usage = await run_payhooks(cli, "replay", "--worker", "orders")
    assert usage.code == 2
    assert "says nothing" in usage.err
    bad_time = await run_payhooks(cli, "replay", "--since", "yesterday")
    assert bad_time.code == 2
    assert "--since" in bad_time.err
    payment_id = new_id("pay")
    await store_events(db, 2, payment_id=payment_id)
    human = await run_payhooks(cli, "replay", "--payment-id", payment_id, "--dry-run")
    assert human.code == 0, human.err
    lines = human.out.splitlines()
    assert "(dry run, nothing sent): 2 event(s) selected" in lines[0]
    assert lines[1].split() == [c.upper() for c in cli_replay.COLUMNS]
    assert lines[2].split() == ["orders", "2", "0", "0", "0", "0"]
    unreachable = await run_payhooks(
        {**cli, "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/payhooks"},
        "replay",
        "--payment-id",
        "p",
    )
    assert unreachable.code == 3
