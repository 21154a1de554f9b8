"""`payhooks event list` and `payhooks event show` as an operator runs them: the data of
`GET /api/events` (one shared function), as tables or --json, with the runbook's exit codes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from services.api.app import create_app
from shared.amqp.topology import Topology
from shared.config import Settings
from tests.integration.api_contract import AUTH
from tests.integration.inbox_events import store_events
from tests.integration.test_cli_operators import Run, cli_env, closed_port, run_payhooks
from tests.integration.test_dlq import Letter, put_dead_letters

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
def payhooks(settings: Settings, channel: AbstractChannel, db: Any) -> Any:
    env = cli_env(settings)

    async def run(*args: str) -> Run:
        return await run_payhooks(env, *args)

    return run


@pytest.fixture
async def api(aiohttp_client: Any, settings: Settings, db: Any) -> TestClient:
    client: TestClient = await aiohttp_client(create_app(settings))
    return client


async def test_event_list_gives_what_the_api_gives(payhooks: Any, api: TestClient, db: Any) -> None:
    [paid] = await store_events(db, payment_id="pay_cli", outcome="transitioned", at=T0)
    [failed] = await store_events(db, event="refund.failed", payment_id="pay_cli", at=T0 + MINUTE)
    await store_events(db, payment_id="pay_other", at=T0 + 2 * MINUTE)

    as_json = await payhooks("event", "list", "--payment-id", "pay_cli", "--json")
    response = await api.get("/api/events?payment_id=pay_cli", headers=AUTH)

    assert as_json.code == 0, as_json
    assert as_json.json() == await response.json()
    assert [e["event_id"] for e in as_json.json()["events"]] == [failed, paid]
    first = await payhooks("event", "list", "--payment-id", "pay_cli", "--limit", "1")
    assert first.code == 0, first
    header, row, _, summary = first.out.splitlines()
    assert header.split() == ["RECEIVED_AT", "EVENT_ID", "PROVIDER", "EVENT", "PAYMENT_ID",
                              "DUPLICATES", "OUTCOME"]  # fmt: skip
    assert row.split()[1:] == [failed, "xhub", "refund.failed", "pay_cli", "0", "queued"]
    cursor = summary.rpartition("--cursor ")[2]
    rest = await payhooks("event", "list", "--payment-id", "pay_cli", "--cursor", cursor)
    assert rest.code == 0, rest
    assert rest.out.splitlines()[1].split()[1:] == [
        paid,
        "xhub",
        "payment.status_changed",
        "pay_cli",
        "0",
        "transitioned",
    ]
    assert rest.out.splitlines()[-1] == "1 event(s)"
    since = await payhooks(
        "event", "list", "--outcome", "processed", "--since", "2026-11-30T10:00Z"
    )
    assert [line.split()[1] for line in since.out.splitlines()[1:-2]] == [paid]
    nothing = await payhooks("event", "list", "--event", "kyc.changed")
    assert (nothing.code, nothing.out) == (1, "0 event(s)\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "--since must be an ISO 8601 time"),
        (["--limit", "0"], "--limit must be a whole number 1-500"),
        (["--outcome", "nope"], "--outcome must be one of processed, queued, unpublished"),
        (["--cursor", "nope"], "--cursor is not one this api gave"),
        (["--payment-id", "p", "--until", "2026-11-30T09:00Z", "--since", "2026-11-30T10:00Z"],
         "--until is before since"),
    ],
)  # fmt: skip
async def test_a_bad_filter_is_exit_2_naming_it(
    payhooks: Any, args: list[str], message: str
) -> None:
    result = await payhooks("event", "list", *args)

    assert result.code == 2, result
    assert result.err.startswith(f"payhooks: {message}"), result.err


async def test_event_show_prints_headers_body_outcome_and_dead_letters(
    payhooks: Any, api: TestClient, db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    dead = Letter(payment_id="pay_show")
    await store_events(db, payment_id="pay_show", event_ids=[dead.id])
    await put_dead_letters(channel, topology.work["orders"], [dead])

    shown = await payhooks("event", "show", dead.id)
    as_json = await payhooks("event", "show", dead.id, "--json")

    assert shown.code == 0, shown
    lines = shown.out.splitlines()
    assert lines[0].split()[:4] == ["event", dead.id, "payment.status_changed", "payment"]
    assert lines[1] == "outcome: dead_lettered: unknown_payment"
    assert ["X-Webhook-Id", dead.id] in [line.split() for line in lines]
    assert '  "payment_id": "pay_show"' in lines
    assert lines[-1].split()[:2] == [dead.id, "unknown_payment"]
    view = as_json.json()
    assert view["outcome"] == "dead_lettered: unknown_payment"
    assert [d["id"] for d in view["dead_letters"]] == [dead.id]
    assert "dead_letters_unavailable" not in view
    missing = await payhooks("event", "show", "evt_nobody")
    assert (missing.code, missing.err) == (1, "payhooks: event evt_nobody is not in the inbox\n")


async def test_event_commands_without_their_servers(settings: Settings, db: Any) -> None:
    [event_id] = await store_events(db, body=b"plain text")
    no_rabbitmq = cli_env(settings, AMQP_URL=f"amqp://guest:guest@127.0.0.1:{closed_port()}/")
    no_database = cli_env(
        settings, DATABASE_URL=f"postgresql://postgres@127.0.0.1:{closed_port()}/x"
    )

    shown = await run_payhooks(no_rabbitmq, "event", "show", event_id)
    listed = await run_payhooks(no_database, "event", "list")

    assert shown.code == 0, shown
    assert "dead letters not shown: cannot reach RabbitMQ" in shown.err
    assert "body (text):\nplain text\n" in shown.out
    assert listed.code == 3, listed
    assert "cannot reach PostgreSQL" in listed.err
