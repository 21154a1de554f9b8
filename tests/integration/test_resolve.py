"""An operator's resolution of an order (issue 34 item 1) through the CLI, the api and the
console, all through shared/ops/operator_actions.py resolve_order_recorded: the bonus ledger
and the emails follow the operator's transition as they follow a provider's, a late provider
event doubles nothing, a move the order machine forbids needs force and shows as forced, and a
resolve waits for the payment's events in flight.

Real PostgreSQL, RabbitMQ and an aiosmtpd server; the services run as their own aiohttp apps.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import re
from typing import Any

import asyncpg
import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from shared.amqp.topology import Topology
from shared.config import Settings
from shared.queries import orders as orders_sql
from shared.queries import parked as parked_sql
from shared.queries import processed as processed_sql
from tests.conftest import SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.api_contract import documented, running_api
from tests.integration.inbox_events import store_events
from tests.integration.system import (
    System,
    effects,
    post,
    quiescent,
    register,
    smtp_messages,
)
from tests.integration.test_cli_operators import cli_env, run_payhooks
from tests.integration.test_console import csrf_of, sign_in
from tests.integration.test_dlq import Letter, new_id, put_dead_letters

ANN = {"Authorization": "Bearer ann-token"}
TOKENS = "ann:operator:ann-token"
LONG_PARK = "3600"
EFFECT_TIMEOUT_S = 30.0  # the outbox relay sweeps a row another process committed after 5 s
PAID_EFFECTS = {
    "status": "PAID",
    "bonus": 500,
    "ledger": ["grant"],
    "emails": ["payment_succeeded"],
}


@pytest.fixture
def system_env() -> dict[str, str]:
    return {"ADMIN_TOKENS": TOKENS, "UNKNOWN_PAYMENT_PARK_SECONDS": LONG_PARK}


@pytest.fixture
async def api(
    aiohttp_client: Any, flow_settings: Settings, db: Any, channel: AbstractChannel
) -> TestClient:
    return await running_api(aiohttp_client, flow_settings)


@pytest.fixture
def cli(flow_settings: Settings) -> dict[str, str]:
    return cli_env(flow_settings, USER=os.environ.get("USER") or getpass.getuser())


def cli_actor() -> str:
    return f"cli:{os.environ.get('USER') or getpass.getuser()}"


async def resolutions(db: Any, payment_id: str) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT actor, source, filter, ids FROM operator_actions"
        " WHERE action = 'order.resolve' AND target = $1 ORDER BY id",
        payment_id,
    )
    return [dict(r) for r in rows]


async def test_a_resolve_to_paid_grants_and_emails_once_and_a_late_paid_webhook_doubles_nothing(
    system: System, api: TestClient, cli: dict[str, str], db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    sink = smtp[0]
    payment_id = new_id("pay")
    await register(db, payment_id)
    await orders_sql.flag_undecided(db, payment_id, "amount_mismatch_ignored")

    run = await run_payhooks(
        cli, "order", "resolve", payment_id, "--to", "paid", "--reason", "paid per bank", "--json"
    )

    assert run.code == 0, run.err
    answer = run.json()
    assert (answer["from"], answer["to"], answer["forced"]) == ("PENDING", "PAID", False)
    assert answer["actor"] == cli_actor()
    assert answer["event_id"].startswith("operator:")
    await eventually(
        lambda: effects(db, payment_id), lambda e: e == PAID_EFFECTS, timeout_s=EFFECT_TIMEOUT_S
    )
    await eventually(
        lambda: _async(smtp_messages(sink, payment_id)), lambda m: m == ["payment_succeeded"]
    )
    undecided = await db.fetchval(
        "SELECT undecided_since FROM orders WHERE payment_id = $1", payment_id
    )
    assert undecided is None

    late = new_id("evt")
    await post(system.ingest, payment_event(payment_id, "paid"), late)
    await quiescent(db, system, timeout_s=EFFECT_TIMEOUT_S)

    outcome = await db.fetchval(
        "SELECT outcome FROM processed_events WHERE worker = 'orders' AND event_id = $1", late
    )
    assert outcome == "no_state_change"
    assert await effects(db, payment_id) == PAID_EFFECTS
    assert smtp_messages(sink, payment_id) == ["payment_succeeded"]
    view = await (await api.get(f"/api/payments/{payment_id}", headers=ANN)).json()
    [transition] = view["transitions"]
    assert {k: transition[k] for k in ("from", "to", "source", "actor", "forced", "reason")} == {
        "from": "PENDING",
        "to": "PAID",
        "source": "operator",
        "actor": cli_actor(),
        "forced": False,
        "reason": "paid per bank",
    }
    assert view["undecided"] is None
    [grant] = view["bonus"]
    assert grant["transition_id"] == transition["id"]
    assert await resolutions(db, payment_id) == [
        {
            "actor": cli_actor(),
            "source": "cli",
            "filter": {"from": "PENDING", "to": "PAID", "forced": False, "reason": "paid per bank"},
            "ids": [answer["event_id"]],
        }
    ]


async def _async(value: Any) -> Any:
    return value


async def test_a_forbidden_move_is_refused_without_force_and_done_with_it_shown_as_forced(
    system: System, api: TestClient, cli: dict[str, str], db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    payment_id = new_id("pay")
    await register(db, payment_id)
    url = f"/api/payments/{payment_id}/resolve"
    paid = await api.post(url, json={"to": "PAID", "reason": "bank says paid"}, headers=ANN)
    assert paid.status == 200, await paid.text()
    await documented(paid, "POST", "/api/payments/{payment_id}/resolve")
    await eventually(
        lambda: effects(db, payment_id), lambda e: e == PAID_EFFECTS, timeout_s=EFFECT_TIMEOUT_S
    )

    refused = await api.post(url, json={"to": "CANCELLED", "reason": "fraud"}, headers=ANN)

    assert refused.status == 409
    assert refused.content_type == "application/problem+json"
    assert (await refused.json())["code"] == "resolve_forbidden"
    await documented(refused, "POST", "/api/payments/{payment_id}/resolve")
    assert (await effects(db, payment_id))["status"] == "PAID"

    forced = await api.post(
        url, json={"to": "CANCELLED", "reason": "fraud", "force": True}, headers=ANN
    )

    assert forced.status == 200, await forced.text()
    body = await forced.json()
    assert (body["from"], body["to"], body["forced"], body["actor"]) == (
        "PAID",
        "CANCELLED",
        True,
        "ann",
    )
    assert body["order"]["status"] == "CANCELLED"
    await eventually(
        lambda: effects(db, payment_id),
        lambda e: e["ledger"] == ["grant", "clawback"],
        timeout_s=EFFECT_TIMEOUT_S,
    )
    assert (await effects(db, payment_id))["bonus"] == 0
    view = await (await api.get(f"/api/payments/{payment_id}", headers=ANN)).json()
    assert [(t["to"], t["source"], t["forced"]) for t in view["transitions"]] == [
        ("PAID", "operator", False),
        ("CANCELLED", "operator", True),
    ]
    assert [(a["source"], a["filter"]["forced"]) for a in await resolutions(db, payment_id)] == [
        ("api", False),
        ("api", True),
    ]
    shown = await run_payhooks(cli, "payment", "show", payment_id)
    [forced_row] = [line for line in shown.out.splitlines() if "fraud" in line]
    assert "operator" in forced_row
    assert "True" in forced_row
    refused_cli = await run_payhooks(
        cli, "order", "resolve", payment_id, "--to", "PENDING", "--reason", "reopen"
    )
    assert refused_cli.code == 4
    assert "never moves CANCELLED to PENDING" in refused_cli.err
    again = await api.post(
        url, json={"to": "CANCELLED", "reason": "again", "force": True}, headers=ANN
    )
    assert again.status == 409
    assert (await again.json())["code"] == "resolve_no_change"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"to": "NOPE", "reason": "x"}, 400, "invalid_resolution"),
        ({"to": "PAID"}, 400, "invalid_resolution"),
        ({"to": "PAID", "reason": "  "}, 400, "invalid_resolution"),
        ({"to": "PAID", "reason": "x", "force": "yes"}, 400, "invalid_resolution"),
        ({"to": "PAID", "reason": "x", "extra": 1}, 400, "invalid_resolution"),
        (["PAID"], 400, "invalid_request"),
    ],
)
async def test_bad_input_to_a_resolve_is_a_problem_4xx(
    api: TestClient, db: Any, body: Any, status: int, code: str
) -> None:
    payment_id = new_id("pay")
    await register(db, payment_id)

    answer = await api.post(f"/api/payments/{payment_id}/resolve", json=body, headers=ANN)

    assert answer.status == status
    assert answer.content_type == "application/problem+json"
    assert (await answer.json())["code"] == code
    await documented(answer, "POST", "/api/payments/{payment_id}/resolve")
    assert await resolutions(db, payment_id) == []


async def test_a_resolve_of_a_payment_without_an_order_is_404(api: TestClient, db: Any) -> None:
    answer = await api.post(
        "/api/payments/nope/resolve", json={"to": "PAID", "reason": "x"}, headers=ANN
    )
    assert answer.status == 404
    assert (await answer.json())["code"] == "not_found"


async def test_a_resolve_waits_for_the_payments_events_in_flight(
    api: TestClient, cli: dict[str, str], db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    payment_id = new_id("pay")
    await register(db, payment_id)
    [queued] = await store_events(db, payment_id=payment_id)
    url = f"/api/payments/{payment_id}/resolve"
    asked = {"to": "PAID", "reason": "bank says paid"}

    refused = await api.post(url, json=asked, headers=ANN)

    assert refused.status == 409
    problem = await refused.json()
    assert problem["code"] == "resolve_in_flight"
    assert problem["in_flight"] == [
        {"event_id": queued, "event": "payment.status_changed", "where": "queued"}
    ]
    assert queued in problem["detail"]
    await documented(refused, "POST", "/api/payments/{payment_id}/resolve")
    by_cli = await run_payhooks(
        cli, "order", "resolve", payment_id, "--to", "PAID", "--reason", "x"
    )
    assert by_cli.code == 5, by_cli.err
    assert "not yet processed by the orders worker" in by_cli.err
    assert await resolutions(db, payment_id) == []
    assert (await effects(db, payment_id))["status"] == "PENDING"

    # Events the orders worker does not consume (unrouted) are not waited for; one it
    # processed is done; a parked one waits like a queued one.
    await store_events(db, event="withdrawal.status_changed", payment_id=payment_id)
    await processed_sql.mark_processed(db, "orders", queued, "transitioned")
    parked = new_id("evt")
    await parked_sql.park(
        db,
        parked_sql.ParkedEvent(
            parked,
            "xhub",
            payment_id,
            "payment.status_changed",
            "payment.status_changed",
            b"{}",
            {},
        ),
    )
    still = await api.post(url, json=asked, headers=ANN)
    assert still.status == 409
    assert [e["where"] for e in (await still.json())["in_flight"]] == ["parked"]
    await db.execute(
        "UPDATE parked_events SET dead_lettered_at = now() WHERE event_id = $1", parked
    )

    # A dead letter in orders.dlq is not on its way: the resolve goes ahead.
    [dead] = await store_events(db, payment_id=payment_id)
    await put_dead_letters(
        channel, topology.work["orders"], [Letter(id=dead, payment_id=payment_id)]
    )

    resolved = await api.post(url, json=asked, headers=ANN)

    assert resolved.status == 200, await resolved.text()
    assert (await resolved.json())["to"] == "PAID"


async def test_the_console_resolves_through_its_form_and_shows_a_forced_move(
    api: TestClient, db: Any
) -> None:
    payment_id = new_id("pay")
    await register(db, payment_id)
    await sign_in(api, "ann-token")
    page = f"/console/payments/{payment_id}"
    form_url = f"{page}/resolve"

    cancelled = await api.post(
        form_url,
        data={"csrf": await csrf_of(api, page), "to": "CANCELLED", "reason": "customer gave up"},
        allow_redirects=False,
    )
    assert cancelled.status == 303, await cancelled.text()
    assert cancelled.headers["Location"].endswith(f"{page}#transitions")

    refused = await api.post(
        form_url, data={"csrf": await csrf_of(api, page), "to": "PENDING", "reason": "reopen"}
    )
    assert refused.status == 409
    text = await refused.text()
    assert 'id="resolve-problem"' in text
    assert "never moves CANCELLED to PENDING" in text

    forced = await api.post(
        form_url,
        data={
            "csrf": await csrf_of(api, page),
            "to": "PENDING",
            "reason": "reopen",
            "force": "yes",
        },
    )
    assert forced.status == 200
    shown = await forced.text()
    assert re.search(r"<td>PENDING <strong class=\"forced\">FORCED</strong></td>", shown), shown
    assert "operator <strong>ann</strong>: reopen" in shown
    assert [(a["source"], a["filter"]["forced"]) for a in await resolutions(db, payment_id)] == [
        ("console", False),
        ("console", True),
    ]
    audit_page = await (await api.get("/console/audit")).text()
    assert "order.resolve" in audit_page


async def test_a_resolve_waits_for_the_payment_lock_the_orders_worker_takes(
    api: TestClient, db: Any, migrated_database: str
) -> None:
    payment_id = new_id("pay")
    await register(db, payment_id)
    holder = await asyncpg.connect(migrated_database)
    try:
        # What the orders worker holds while it applies a batch of this payment's events.
        transaction = holder.transaction()
        await transaction.start()
        await parked_sql.lock_payments(holder, [payment_id])
        resolving = asyncio.create_task(
            api.post(
                f"/api/payments/{payment_id}/resolve",
                json={"to": "PAID", "reason": "bank says paid"},
                headers=ANN,
            )
        )
        await eventually(lambda: _advisory_waiters(db), lambda n: n == 1)
        assert not resolving.done()
        assert (await effects(db, payment_id))["status"] == "PENDING"
        await transaction.rollback()
        answer = await asyncio.wait_for(resolving, 10)
    finally:
        await holder.close()
    assert answer.status == 200, await answer.text()
    assert (await effects(db, payment_id))["status"] == "PAID"


async def _advisory_waiters(db: Any) -> int:
    """Sessions of this database waiting for an advisory lock (the resolve, behind the one held)."""
    return int(
        await db.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
    )
