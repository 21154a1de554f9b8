"""`payhooks sim --provider`: a mixed storm (X-Hub, Standard Webhooks and Stripe, payments dealt
round-robin) through a running system, each webhook encoded and signed as its provider sends
it, checked payment by payment; a Stripe storm (no settle step: PAID where X-Hub's would be
SETTLED); and a Standard Webhooks storm with lost webhooks, which no API
can repair, expected exactly where the webhooks sent bring each payment."""

from __future__ import annotations

import argparse
import base64
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from bench.processes import free_port
from services.ingest.app import create_app
from services.sim import run as sim_run
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.errors import EXIT_OK
from tests.conftest import TEST_SECRETS, SmtpSink
from tests.integration.system import start_system
from tests.integration.test_cli_send import printed_headers, send
from tests.integration.test_dlq import new_id

API_KEY = "sim-provider-key"
STANDARD_SECRETS = "whsec_" + base64.b64encode(b"payhooks sim standard key").decode()
STRIPE_SECRETS = "whsec_payhooks_sim_stripe_key"


def _args(
    ingest: Any, providers: tuple[str, ...], payments: int, lost: float
) -> argparse.Namespace:
    return argparse.Namespace(
        ingest_url=f"http://{ingest.host}:{ingest.port}",
        api_host="127.0.0.1",
        api_port=free_port(),
        providers=providers,
        payments=payments,
        duplicates=0.2,
        reorder=0.3,
        lost=lost,
        concurrency=8,
        merchants=2,
        flows=None,
        seed=5,
        time_scale=100.0,
        timeout=5.0,
        linger=0.5,
        check=True,
        check_timeout=20.0,
        json=False,
        burst=False,
    )


def _table(out: str) -> dict[str, str]:
    return dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1)
        for line in out[out.index("OUTCOME") :].splitlines()[1:]
        if line.strip()
    )


async def _system(
    aiohttp_client: Any, make_settings: Any, smtp: tuple[SmtpSink, int], amqp: Any, topology: Any
) -> tuple[Settings, Any]:
    settings: Settings = make_settings(
        SMTP_PORT=str(smtp[1]),
        EMAIL_FROM="shop@example.test",
        XHUB_API_KEY=API_KEY,
        STANDARD_WEBHOOK_SECRETS=STANDARD_SECRETS,
        STRIPE_WEBHOOK_SECRETS=STRIPE_SECRETS,
    )
    system = await start_system(aiohttp_client, settings, amqp, topology)
    return settings, system.ingest.server


async def test_a_mixed_storm_ends_right_for_every_provider(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, ingest = await _system(aiohttp_client, make_settings, smtp, amqp, topology)
    providers = ("xhub", "standard", "stripe")
    args = _args(ingest, providers, payments=45, lost=0.0)  # no reconciler runs here

    assert await sim_run.command(settings, args) == EXIT_OK

    out = capsys.readouterr().out
    assert "check: 45/45 payments as expected" in out
    assert "check per provider: standard 15/15, stripe 15/15, xhub 15/15" in out
    assert _table(out)["dead letters"] == "orders.dlq 0, bonuses.dlq 0, emails.dlq 0"
    stored = dict(
        await db.fetch("SELECT provider, count(DISTINCT payment_id) FROM inbox GROUP BY 1")
    )
    assert stored == {"xhub": 15, "standard": 15, "stripe": 15}
    # Standard's went through its own route: stored as sent (the envelope, webhook-* headers).
    row = await db.fetchrow("SELECT body, headers FROM inbox WHERE provider = 'standard' LIMIT 1")
    assert b'"data"' in row["body"]
    assert "webhook-signature" in {k.lower() for k in row["headers"]}


async def test_a_stripe_storm_ends_right_without_a_settle_step(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, ingest = await _system(aiohttp_client, make_settings, smtp, amqp, topology)
    args = _args(ingest, ("stripe",), payments=20, lost=0.0)  # no reconciler runs here
    args.flows = {"settled": 1.0, "settled_refunded": 1.0, "expired_paid": 1.0, "expired": 1.0}

    assert await sim_run.command(settings, args) == EXIT_OK

    out = capsys.readouterr().out
    assert "check: 20/20 payments as expected" in out
    assert "SETTLED" not in out[out.index("check: ") :]  # Stripe has no settlement: PAID
    assert _table(out)["dead letters"] == "orders.dlq 0, bonuses.dlq 0, emails.dlq 0"
    # Stripe's went through its own route: stored as Stripe sends them (evt_ ids in the body).
    rows = await db.fetch("SELECT event_id, body, headers FROM inbox WHERE provider = 'stripe'")
    assert rows
    for row in rows:
        stored = orjson.loads(row["body"])
        assert stored["object"] == "event"
        assert stored["id"] == row["event_id"]
        assert stored["type"] != "payment.status_changed"
        assert "stripe-signature" in {k.lower() for k in row["headers"]}


async def test_lost_standard_webhooks_are_expected_missing_no_api_repairs_them(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, ingest = await _system(aiohttp_client, make_settings, smtp, amqp, topology)
    args = _args(ingest, ("standard",), payments=20, lost=0.15)

    assert await sim_run.command(settings, args) == EXIT_OK

    out = capsys.readouterr().out
    assert "check: 20/20 payments as expected" in out
    first = next(line for line in out.splitlines() if line.startswith("counts: "))
    counts = dict(part.split("=") for part in first.removeprefix("counts: ").split(", "))
    assert int(counts["LOST"]) > 0  # some were lost, and the check still holds: none to repair
    assert counts["needs_repair"] == "0"
    assert _table(out)["dead letters"] == "orders.dlq 0, bonuses.dlq 0, emails.dlq 0"


async def test_send_provider_standard_posts_an_envelope_ingest_verifies_and_stores(
    aiohttp_client: Any, make_settings: Any, amqp: Any, db: Any, tmp_path: Path
) -> None:
    settings: Settings = make_settings(STANDARD_WEBHOOK_SECRETS=STANDARD_SECRETS)
    app = create_app(settings)
    ingest: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    payment_id, event_id = new_id("pay"), new_id("msg")
    env = {
        "XHUB_WEBHOOK_SECRETS": ",".join(TEST_SECRETS),
        "STANDARD_WEBHOOK_SECRETS": STANDARD_SECRETS,
        "INGEST_PORT": str(ingest.port),
    }
    args = ("--provider", "standard", "--payment-id", payment_id, "--event-id", event_id)

    code, out, err = await send(tmp_path, *args, **env)

    assert code == 0, err
    assert out.startswith(f"> POST http://127.0.0.1:{ingest.port}/webhooks/standard\n")
    headers = printed_headers(out)
    assert headers["webhook-id"] == event_id
    assert headers["webhook-signature"].startswith("v1,")
    assert out.splitlines()[-2:] == ["< 200 OK", '< {"status":"accepted"}']
    row = await db.fetchrow(
        "SELECT body FROM inbox WHERE provider = 'standard' AND event_id = $1", event_id
    )
    stored = orjson.loads(row["body"])
    assert stored["type"] == "payment.status_changed"
    assert stored["data"]["payment_id"] == payment_id
    # Without the provider's secret it says which variable it needs.
    no_secret = {k: v for k, v in env.items() if k != "STANDARD_WEBHOOK_SECRETS"}
    code, _, err = await send(tmp_path, *args, **no_secret)
    assert code == 2
    assert "STANDARD_WEBHOOK_SECRETS" in err
