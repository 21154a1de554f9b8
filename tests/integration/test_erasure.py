"""Erasure of a person's data (issue 36 item 4) through the CLI and the api, both through
shared/ops/operator_actions.py erase_recorded: after a paid, settled and refunded order's
customer is erased no text, jsonb or bytea column of any table holds the address, and every
money figure is as it was; a second run changes nothing (and is recorded with count 0); an
email due after the erasure is recorded as skipped, never sent; bad input and unknown people.

Real PostgreSQL, RabbitMQ and an aiosmtpd server; the services run as their own aiohttp apps.
"""

from __future__ import annotations

import asyncio
import getpass
import os
from decimal import Decimal
from typing import Any

import asyncpg
import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from shared.config import Settings
from shared.db import init_connection
from shared.ops.erasure import MARKER, parse_selector
from shared.ops.operator_actions import Edge, Operator, erase_recorded
from shared.queries import emails as emails_sql
from shared.queries import orders as orders_sql
from tests.conftest import SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.api_contract import documented, running_api
from tests.integration.system import (
    System,
    effects,
    post,
    quiescent,
    smtp_messages,
)
from tests.integration.test_cli_operators import cli_env, run_payhooks
from tests.integration.test_console import csrf_of, sign_in
from tests.integration.test_dlq import new_id

ANN = {"Authorization": "Bearer ann-token"}
SHOP = {"Authorization": "Bearer shop-token"}
TOKENS = "ann:operator:ann-token,shop:orders:shop-token"
EFFECT_TIMEOUT_S = 30.0


@pytest.fixture
def system_env() -> dict[str, str]:
    return {"ADMIN_TOKENS": TOKENS, "UNKNOWN_PAYMENT_PARK_SECONDS": "3600"}


@pytest.fixture
async def api(
    aiohttp_client: Any, flow_settings: Settings, db: Any, channel: AbstractChannel
) -> TestClient:
    return await running_api(aiohttp_client, flow_settings)


@pytest.fixture
def cli(flow_settings: Settings) -> dict[str, str]:
    return cli_env(flow_settings, USER=os.environ.get("USER") or getpass.getuser())


async def order(db: Any, payment_id: str, email: str, user_id: str, amount: str = "100.00") -> None:
    await orders_sql.register_order(
        db,
        orders_sql.NewOrder(
            order_id=f"ord_{payment_id}",
            payment_id=payment_id,
            user_id=user_id,
            email=email,
            amount=Decimal(amount),
            currency="USD",
        ),
    )


def refund(payment_id: str, amount: str = "100.00") -> dict[str, Any]:
    return {
        "event": "refund.completed",
        "refund_id": f"rf_{payment_id}",
        "payment_id": payment_id,
        "amount": amount,
        "currency": "USD",
        "created_at": "2026-11-30T12:00:00Z",
    }


async def holders(db: Any, needle: str) -> list[str]:
    """Every table.column (text, varchar, text[], jsonb, json or bytea) holding `needle`,
    compared without case."""
    columns = await db.fetch(
        "SELECT table_name, column_name, data_type, udt_name FROM information_schema.columns"
        " WHERE table_schema = 'public' AND (data_type IN"
        " ('text', 'character varying', 'character', 'jsonb', 'json', 'bytea')"
        " OR udt_name IN ('_text', '_varchar'))"
    )
    assert len(columns) > 20  # the schema is there
    found = []
    for c in columns:
        column = f'"{c["column_name"]}"'
        if c["data_type"] == "bytea":
            text = f"encode({column}, 'escape')"
        elif c["data_type"] == "ARRAY":
            text = f"array_to_string({column}, ' ')"
        else:
            text = f"{column}::text"
        hits = await db.fetchval(
            f'SELECT count(*) FROM "{c["table_name"]}" WHERE strpos(lower({text}), lower($1)) > 0',
            needle,
        )
        if hits:
            found.append(f"{c['table_name']}.{c['column_name']}")
    return sorted(found)


async def money(db: Any, payment_ids: list[str]) -> dict[str, Any]:
    """Every money figure and state of the payments."""
    orders = await db.fetch(
        "SELECT order_id, payment_id, user_id, amount, currency, status, refunded_amount,"
        " refund_ids, reversed_refund_ids, updated_at FROM orders"
        " WHERE payment_id = ANY($1) ORDER BY payment_id",
        payment_ids,
    )
    transitions = await db.fetch(
        "SELECT id, payment_id, from_status, to_status, event_id, at FROM order_transitions"
        " WHERE payment_id = ANY($1) ORDER BY id",
        payment_ids,
    )
    ledger = await db.fetch(
        "SELECT id, payment_id, user_id, kind, points, transition_id FROM bonus_ledger"
        " WHERE payment_id = ANY($1) ORDER BY id",
        payment_ids,
    )
    emails = await db.fetch(
        "SELECT payment_id, template, message_id, sent_at, skipped FROM emails_sent"
        " WHERE payment_id = ANY($1) ORDER BY payment_id, template",
        payment_ids,
    )
    return {
        "orders": [dict(r) for r in orders],
        "transitions": [dict(r) for r in transitions],
        "ledger": [dict(r) for r in ledger],
        "ledger_sum": sum(r["points"] for r in ledger),
        "emails": [dict(r) for r in emails],
        "inbox": await db.fetchval("SELECT count(*) FROM inbox"),
        "processed": await db.fetchval("SELECT count(*) FROM processed_events"),
        "audit": await db.fetch("SELECT * FROM operator_actions ORDER BY id"),
    }


async def erasures(db: Any) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT actor, source, target, ids, count, filter FROM operator_actions"
        " WHERE action = 'person.erase' ORDER BY id"
    )
    return [dict(r) for r in rows]


async def _effects_are(db: Any, payment_id: str, wanted: dict[str, Any]) -> None:
    async def now() -> dict[str, Any]:
        return await effects(db, payment_id)

    await eventually(now, lambda e: e == wanted, timeout_s=EFFECT_TIMEOUT_S)


async def test_an_erased_customer_of_a_paid_settled_refunded_order_is_nowhere_and_the_money_stays(
    system: System, api: TestClient, cli: dict[str, str], db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    sink = smtp[0]
    person = new_id("erin")
    address = f"Erin.{person}@Example.org"  # registered in mixed case
    refunded, paid, stranger, unknown = (new_id("pay") for _ in range(4))
    await order(db, refunded, address, f"user_{person}")
    await order(db, paid, address.lower(), f"user_{person}", amount="40.00")
    await order(db, stranger, f"{stranger}@customer.test", f"user_{stranger}")
    # A provider payload carrying the customer's address in an extra field.
    carrying = {"customer_email": address}
    await post(system.ingest, payment_event(refunded, "paid", **carrying))
    await post(system.ingest, payment_event(refunded, "settled"))
    await post(system.ingest, refund(refunded))
    await post(system.ingest, payment_event(paid, "paid", "40.00"))
    await post(system.ingest, payment_event(stranger, "paid"))
    # An event of a payment with no order yet: parked, its body holding the address.
    await post(system.ingest, payment_event(unknown, "paid", **carrying))
    paid_effects = {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant"],
        "emails": ["payment_succeeded"],
    }
    expected = {
        refunded: {
            "status": "REFUNDED",
            "bonus": 0,
            "ledger": ["grant", "clawback"],
            "emails": ["payment_refunded", "payment_succeeded"],
        },
        paid: paid_effects,
        stranger: paid_effects,
    }
    for payment_id, wanted in expected.items():
        await _effects_are(db, payment_id, wanted)
    await eventually(
        lambda: db.fetchval("SELECT count(*) FROM parked_events WHERE payment_id = $1", unknown),
        lambda n: n == 1,
    )
    assert sorted(smtp_messages(sink, refunded)) == ["payment_refunded", "payment_succeeded"]
    held = await holders(db, address)
    assert {"orders.email", "emails_sent.recipient", "inbox.body", "parked_events.body"} <= set(
        held
    )
    payments = [refunded, paid, stranger]
    before = await money(db, payments)
    stranger_before = await db.fetchrow("SELECT * FROM orders WHERE payment_id = $1", stranger)

    run = await run_payhooks(cli, "erase", "--email", f"  {address.upper()} ", "--json")

    assert run.code == 0, run.err
    answer = run.json()
    assert answer["erased"] is True
    assert answer["orders"] == sorted([f"ord_{refunded}", f"ord_{paid}"])
    assert answer["rows"]["orders"] == 2
    assert answer["rows"]["emails_sent"] == 3  # two of the refunded order, one of the paid
    assert answer["rows"]["inbox"] == 2  # the refunded order's paid event, the unknown's
    assert answer["rows"]["parked_events"] == 1
    assert answer["rows_changed"] == sum(answer["rows"].values())
    assert address.lower() not in run.out.lower()
    assert address.lower() not in run.err.lower()
    assert await holders(db, address) == []
    after = await money(db, payments)
    assert after["orders"] == before["orders"]  # amounts, states, refunds, updated_at
    assert after["transitions"] == before["transitions"]
    assert after["ledger"] == before["ledger"]
    assert after["ledger_sum"] == before["ledger_sum"]
    assert after["emails"] == before["emails"]  # the records stay, only the recipient changed
    assert (after["inbox"], after["processed"]) == (before["inbox"], before["processed"])
    assert after["audit"][: len(before["audit"])] == before["audit"]  # earlier rows untouched
    assert await db.fetchrow("SELECT * FROM orders WHERE payment_id = $1", stranger) == (
        stranger_before
    )
    rows = await db.fetch(
        "SELECT email, erased_at FROM orders WHERE payment_id = ANY($1)", [refunded, paid]
    )
    assert all(r["email"] == MARKER and r["erased_at"] is not None for r in rows)
    recipients = await db.fetch(
        "SELECT DISTINCT recipient FROM emails_sent WHERE payment_id = ANY($1)", [refunded, paid]
    )
    assert [r["recipient"] for r in recipients] == [MARKER]
    # The inbox keeps the event's dedup key and the rest of its body.
    body = await db.fetchval(
        "SELECT body FROM inbox WHERE payment_id = $1 AND body LIKE '%\"paid\"%'", refunded
    )
    assert f'"customer_email":"{MARKER}"'.encode() in body.replace(b" ", b"")
    [recorded] = await erasures(db)
    assert (recorded["actor"], recorded["source"]) == (f"cli:{cli['USER']}", "cli")
    assert recorded["target"] == "email"
    assert sorted(recorded["ids"]) == answer["orders"]
    assert recorded["count"] == answer["rows_changed"]
    assert recorded["filter"]["rows"] == answer["rows"]

    # Idempotent: the second run (the api's) changes nothing and says so; it is recorded.
    again = await api.post("/api/erasures", json={"email": address}, headers=ANN)
    assert again.status == 200
    second = await documented(again, "POST", "/api/erasures")
    assert (second["erased"], second["rows_changed"]) == (False, 0)
    assert set(second["rows"].values()) == {0}
    assert second["orders"] == []
    unchanged = await money(db, payments)
    assert {k: v for k, v in unchanged.items() if k != "audit"} == {
        k: v for k, v in after.items() if k != "audit"
    }
    records = await erasures(db)
    assert [(r["source"], r["count"], r["ids"]) for r in records] == [
        ("cli", answer["rows_changed"], records[0]["ids"]),
        ("api", 0, []),
    ]
    # By user id once more: the user is known, its orders already erased: nothing to change.
    by_user = await api.post("/api/erasures", json={"user_id": f"user_{person}"}, headers=ANN)
    third = await documented(by_user, "POST", "/api/erasures")
    assert third["erased"] is False
    assert third["already_erased"] == answer["orders"]
    # A later order with the same address is a new person's data: kept.
    later = new_id("pay")
    await order(db, later, address, f"user_{person}")
    assert await db.fetchval("SELECT email FROM orders WHERE payment_id = $1", later) == address


async def test_an_email_due_after_the_erasure_is_recorded_skipped_and_never_sent(
    system: System, api: TestClient, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    sink = smtp[0]
    payment_id = new_id("pay")
    address = f"{payment_id}@customer.test"
    await order(db, payment_id, address, f"user_{payment_id}")
    erased = await api.post("/api/erasures", json={"order_id": f"ord_{payment_id}"}, headers=ANN)
    answer = await documented(erased, "POST", "/api/erasures")
    assert (answer["by"], answer["orders"], answer["rows"]["orders"]) == (
        "order",
        [f"ord_{payment_id}"],
        1,
    )

    await post(system.ingest, payment_event(payment_id, "paid"))

    await eventually(
        lambda: db.fetch(
            "SELECT template, recipient, skipped, skip_reason, sent_at FROM emails_sent"
            " WHERE payment_id = $1",
            payment_id,
        ),
        lambda rows: len(rows) == 1,
        timeout_s=EFFECT_TIMEOUT_S,
    )
    await quiescent(db, system)
    [row] = await db.fetch(
        "SELECT template, recipient, skipped, skip_reason, sent_at FROM emails_sent"
        " WHERE payment_id = $1",
        payment_id,
    )
    assert dict(row) == {
        "template": "payment_succeeded",
        "recipient": MARKER,
        "skipped": True,
        "skip_reason": "erased",
        "sent_at": None,
    }
    # The payment itself went on: paid, its bonus granted; only the email was not sent.
    assert await effects(db, payment_id) == {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant"],
        "emails": [],
    }
    assert smtp_messages(sink, payment_id) == []
    assert not any(address in str(m["To"]) for m in sink.messages)
    assert await holders(db, address) == []
    view = await api.get(f"/api/payments/{payment_id}", headers=ANN)
    shown = await documented(view, "GET", "/api/payments/{payment_id}")
    assert [(m["skipped"], m["skip_reason"], m["recipient"]) for m in shown["emails"]] == [
        (True, "erased", MARKER)
    ]
    dead = await api.get("/api/dlq/emails", headers=ANN)
    assert (await dead.json())["messages"] == []


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ([], 2),
        (["--email", "no-at-sign"], 2),
        (["--email", ""], 2),
        (["--email", MARKER], 2),
        (["--email", "a@b.test", "--user", "u"], 2),
        (["--user", "nobody-at-all"], 1),
        (["--order", "no-such-order"], 1),
        (["--email", "nobody@nowhere.test"], 1),
    ],
)
async def test_the_cli_refuses_bad_input_and_says_when_there_is_nobody(
    cli: dict[str, str], db: Any, args: list[str], code: int
) -> None:
    run = await run_payhooks(cli, "erase", *args)

    assert run.code == code, (run.out, run.err)
    assert run.err.startswith("payhooks: ") or run.err.startswith("usage: ") or code == 1
    recorded = await erasures(db)
    # Bad input and unknown ids are not actions; an address held nowhere is one, recorded.
    if args[:1] == ["--email"] and code == 1:
        assert [(r["target"], r["count"]) for r in recorded] == [("email", 0)]
    else:
        assert recorded == []


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "invalid_request"),
        (b"[]", 400, "invalid_request"),
        (b"{}", 400, "invalid_erasure"),
        (b'{"email": "no-at-sign"}', 400, "invalid_erasure"),
        (b'{"email": 7}', 400, "invalid_erasure"),
        (b'{"email": "a@b.test", "user_id": "u"}', 400, "invalid_erasure"),
        (b'{"name": "Erin"}', 400, "invalid_erasure"),
        (b'{"user_id": "nobody-at-all"}', 404, "not_found"),
        (b'{"order_id": "no-such-order"}', 404, "not_found"),
    ],
)
async def test_the_api_answers_bad_input_and_unknown_ids_with_problems(
    api: TestClient, db: Any, body: bytes, status: int, code: str
) -> None:
    answer = await api.post(
        "/api/erasures", data=body, headers={**ANN, "Content-Type": "application/json"}
    )

    assert answer.status == status
    assert answer.content_type == "application/problem+json"
    problem = await documented(answer, "POST", "/api/erasures")
    assert problem["code"] == code
    assert await erasures(db) == []


async def test_an_orders_token_may_not_erase(api: TestClient, db: Any) -> None:
    payment_id = new_id("pay")
    await order(db, payment_id, f"{payment_id}@customer.test", f"user_{payment_id}")

    answer = await api.post("/api/erasures", json={"order_id": f"ord_{payment_id}"}, headers=SHOP)

    assert answer.status == 403
    assert (await documented(answer, "POST", "/api/erasures"))["code"] == "forbidden"
    assert (
        await db.fetchval("SELECT erased_at FROM orders WHERE payment_id = $1", payment_id) is None
    )


async def test_an_erasure_waits_for_an_email_being_claimed_then_erases_its_record(
    db: Any, migrated_database: str
) -> None:
    """The email worker claims a payment's email under the payment's email lock with the
    address it read: an erasure waits for that lock, so the record it commits is rewritten,
    never left behind with the address."""
    payment_id = new_id("pay")
    address = f"{payment_id}@customer.test"
    await order(db, payment_id, address, f"user_{payment_id}")
    worker = await asyncpg.connect(migrated_database)
    try:
        await init_connection(worker)
        claiming = worker.transaction()
        await claiming.start()
        await emails_sql.lock_payment_emails(worker, [payment_id])
        erasing = asyncio.create_task(
            erase_recorded(db, parse_selector(address, None, None), Operator("test", Edge.CLI))
        )
        await asyncio.sleep(0.5)
        assert not erasing.done()  # waiting on the email worker's lock
        claim = emails_sql.EmailClaim(
            payment_id, "payment_succeeded", f"<m.{payment_id}>", address, "evt_1", None
        )
        assert await emails_sql.claim_email(worker, claim) is True
        await claiming.commit()
        erased = await asyncio.wait_for(erasing, 10)
    finally:
        await worker.close()

    assert (erased.rows["orders"], erased.rows["emails_sent"]) == (1, 1)
    assert await holders(db, address) == []


async def test_the_console_erases_through_the_payment_page_form(api: TestClient, db: Any) -> None:
    payment_id = new_id("pay")
    address = f"{payment_id}@customer.test"
    await order(db, payment_id, address, f"user_{payment_id}")
    await sign_in(api, "ann-token")
    page = f"/console/payments/{payment_id}"
    assert 'id="erase-submit"' in await (await api.get(page)).text()

    unconfirmed = await api.post(f"{page}/erase", data={"csrf": await csrf_of(api, page)})
    assert unconfirmed.status == 400
    assert await erasures(db) == []
    erased = await api.post(
        f"{page}/erase",
        data={"csrf": await csrf_of(api, page), "confirm": "yes"},
        allow_redirects=False,
    )

    assert erased.status == 303, await erased.text()
    assert erased.headers["Location"].endswith(f"{page}#order")
    shown = await (await api.get(page)).text()
    assert 'id="erased"' in shown
    assert address not in shown
    assert await holders(db, address) == []
    assert [(r["source"], r["target"], r["ids"]) for r in await erasures(db)] == [
        ("console", f"order:ord_{payment_id}", [f"ord_{payment_id}"])
    ]
