"""Every operator action through every edge that offers it (api, console, CLI) leaves the same
audit row and gives the same answer (shared/ops/operator_actions.py): requeue on all three,
order registration on the api and the CLI, purge on the CLI."""

from __future__ import annotations

import getpass
import html
import os
import re
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from shared.amqp.topology import Topology
from shared.config import Settings
from shared.ops.operator_actions import Purged
from tests.integration.api_contract import running_api
from tests.integration.test_api_audit import order, trail
from tests.integration.test_cli_operators import cli_env, run_payhooks
from tests.integration.test_console import csrf_of, sign_in
from tests.integration.test_dlq import Letter, new_id, put_dead_letters, queue_ids

ANN = {"Authorization": "Bearer ann-token"}
# What each edge's row says of who acted; everything else in the row is the action's own.
WHO = ("id", "at", "actor", "source")


@pytest.fixture
async def api(aiohttp_client: Any, make_settings: Any, db: Any, channel: Any) -> TestClient:
    return await running_api(aiohttp_client, make_settings(ADMIN_TOKENS="ann:operator:ann-token"))


@pytest.fixture
def cli(settings: Settings) -> dict[str, str]:
    return cli_env(settings, USER=os.environ.get("USER") or getpass.getuser())


def cli_actor() -> str:
    return f"cli:{os.environ.get('USER') or getpass.getuser()}"


def what_was_done(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in WHO}


def console_answer(page: str) -> dict[str, Any]:
    """The requeue answer as the console's page shows it."""
    count = re.search(r'id="requeued"[^>]*><strong>(\d+)</strong>', page)
    assert count is not None, page
    moved = re.search(r'<ul class="ids">(.*?)</ul>', page)
    gone = re.search(r'<p class="problem">Not requeued(.*?)</p>', page)
    codes = re.compile(r"<code>(.*?)</code>")
    return {
        "requeued": int(count.group(1)),
        "ids": [html.unescape(i) for i in codes.findall(moved.group(1) if moved else "")],
        "not_found": [html.unescape(i) for i in codes.findall(gone.group(1) if gone else "")],
    }


async def test_a_requeue_leaves_the_same_row_and_answer_from_every_edge(
    api: TestClient,
    cli: dict[str, str],
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
) -> None:
    work = topology.work["orders"]
    letters = {edge: Letter() for edge in ("api", "console", "cli")}
    await put_dead_letters(channel, work, list(letters.values()))
    missing = new_id("evt")
    answers: dict[str, dict[str, Any]] = {}

    by_api = await api.post(
        "/api/dlq/orders/requeue", json={"ids": [letters["api"].id, missing]}, headers=ANN
    )
    assert by_api.status == 200
    answers["api"] = await by_api.json()

    await sign_in(api, "ann-token")
    csrf = await csrf_of(api, "/console/dlq/orders")
    form = {"csrf": csrf, "step": "confirm", "reason": "", "payment_id": "", "since": ""}
    by_console = await api.post(
        "/console/dlq/orders/requeue",
        data=[*form.items(), ("ids", letters["console"].id), ("ids", missing)],
    )
    assert by_console.status == 200
    answers["console"] = console_answer(await by_console.text())

    flags = ["--id", letters["cli"].id, "--id", missing, "--json"]
    by_cli = await run_payhooks(cli, "dlq", "requeue", "orders", *flags)
    assert by_cli.code == 0, by_cli.err
    answers["cli"] = by_cli.json()

    for edge, answer in answers.items():
        expected = {
            "requeued": 1,
            "would_requeue": None,
            "dry_run": False,
            "ids": [letters[edge].id],
            "not_found": [missing],
        }
        shown = expected if edge != "console" else {k: expected[k] for k in answer}
        assert answer == shown, edge
    assert answers["api"].keys() == answers["cli"].keys()

    rows = await trail(db)
    assert [(r["actor"], r["source"]) for r in rows] == [
        ("ann", "api"),
        ("ann", "console"),
        (cli_actor(), "cli"),
    ]
    for row, (edge, letter) in zip(rows, letters.items(), strict=True):
        assert what_was_done(row) == {
            "action": "dlq.requeue",
            "target": work.dlq,
            "filter": {"ids": [letter.id, missing]},
            "ids": [letter.id],
            "count": 1,
        }, edge
    moved = {work.name: [x.id for x in letters.values()], work.dlq: []}
    assert await queue_ids(channel, moved) == moved


async def test_an_order_registration_leaves_the_same_row_and_answer_from_every_edge(
    api: TestClient, cli: dict[str, str], db: Any
) -> None:
    orders = {"api": order(), "cli": order()}
    answers: dict[str, dict[str, Any]] = {}
    by_api = await api.post("/api/orders", json=orders["api"], headers=ANN)
    assert by_api.status == 201
    answers["api"] = await by_api.json()
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in orders["cli"].items()]
    by_cli = await run_payhooks(cli, "order", "add", *flags, "--json")
    assert by_cli.code == 0, by_cli.err
    answers["cli"] = by_cli.json()

    for edge, answer in answers.items():
        given = orders[edge]
        assert answer.keys() == answers["api"].keys(), edge
        assert {k: answer[k] for k in given} == given, edge
        assert (answer["status"], answer["refunded_amount"]) == ("PENDING", "0.00"), edge
    rows = await trail(db)
    assert [(r["actor"], r["source"]) for r in rows] == [("ann", "api"), (cli_actor(), "cli")]
    for row, (edge, given) in zip(rows, orders.items(), strict=True):
        assert what_was_done(row) == {
            "action": "order.register",
            "target": given["order_id"],
            "filter": {},
            "ids": [given["payment_id"]],
            "count": 1,
        }, edge


async def test_a_purge_leaves_its_row_and_the_one_answer_shape(
    cli: dict[str, str], db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    """The CLI is the one edge that purges: its answer is operator_actions.Purged's."""
    work = topology.work["orders"]
    letters = [Letter(), Letter()]
    await put_dead_letters(channel, work, letters)

    by_cli = await run_payhooks(cli, "dlq", "purge", "orders", "--yes", "--json")

    assert by_cli.code == 0, by_cli.err
    answer = by_cli.json()
    assert answer.keys() == Purged([]).as_json().keys()
    assert answer["purged"] == 2
    assert [m["id"] for m in answer["messages"]] == [x.id for x in letters]
    [row] = await trail(db)
    assert (row["actor"], row["source"]) == (cli_actor(), "cli")
    assert what_was_done(row) == {
        "action": "dlq.purge",
        "target": work.dlq,
        "filter": {},
        "ids": [x.id for x in letters],
        "count": 2,
    }
