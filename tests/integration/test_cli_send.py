"""`payhooks send` against a real ingest (PostgreSQL, RabbitMQ): the signed webhook it prints
is the one ingest verifies and stores; exit 0 on 2xx, else not."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from services.ingest.app import create_app
from shared.amqp.broker import BROKER
from shared.config import Settings
from shared.providers.xhub import SIGNATURE_HEADER, TIMESTAMP_HEADER, WEBHOOK_PATH
from shared.providers.xhub.signatures import verify
from tests.conftest import TEST_SECRETS
from tests.integration.test_cli_operators import closed_port
from tests.integration.test_dlq import new_id

PAYHOOKS = Path(sys.executable).parent / "payhooks"


@pytest.fixture
async def ingest(aiohttp_client: Any, settings: Settings, amqp: Any) -> TestClient:
    app = create_app(settings)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


async def send(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, str]:
    """`payhooks send ARGS` with only PATH and `env` (in a folder with no .env)."""
    process = await asyncio.create_subprocess_exec(
        str(PAYHOOKS),
        "send",
        *args,
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", ""), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(20):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def printed_headers(out: str) -> dict[str, str]:
    return dict(re.findall(r"^> ([\w-]+): (.*)$", out, re.MULTILINE))


async def test_send_posts_a_signed_event_that_ingest_stores_and_a_copy_is_a_duplicate(
    ingest: TestClient, db: Any, tmp_path: Path
) -> None:
    payment_id, event_id = new_id("pay"), new_id("evt")
    secrets = ",".join(TEST_SECRETS)  # signed with the first, as X-Hub does
    port = str(ingest.port)  # the default URL: 127.0.0.1:INGEST_PORT/webhooks/xhub
    args = ("--payment-id", payment_id, "--event-id", event_id)

    code, out, err = await send(tmp_path, *args, XHUB_WEBHOOK_SECRETS=secrets, INGEST_PORT=port)
    again, again_out, _ = await send(
        tmp_path, *args, XHUB_WEBHOOK_SECRETS=secrets, INGEST_PORT=port
    )

    assert code == 0, err
    assert out.startswith(f"> POST http://127.0.0.1:{port}{WEBHOOK_PATH}\n")
    headers = printed_headers(out)
    assert headers["X-Webhook-Id"] == event_id
    body_line = next(line for line in out.splitlines() if line.startswith("> {"))
    body = body_line[2:].encode()
    timestamp, signature = headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER]
    assert verify([TEST_SECRETS[0].encode()], timestamp, body, signature)
    assert out.splitlines()[-2:] == ["< 200 OK", '< {"status":"accepted"}']
    row = await db.fetchrow("SELECT * FROM inbox WHERE event_id = $1", event_id)
    assert bytes(row["body"]) == body
    assert row["headers"][SIGNATURE_HEADER] == signature
    stored = orjson.loads(row["body"])
    assert {k: stored[k] for k in ("event", "payment_id", "status", "amount", "currency")} == {
        "event": "payment.status_changed",
        "payment_id": payment_id,
        "status": "paid",
        "amount": "100.00",
        "currency": "USD",
    }
    assert stored["created_at"].endswith("Z")
    assert again == 0
    assert again_out.splitlines()[-1] == '< {"status":"duplicate"}'
    assert await db.fetchval("SELECT duplicates FROM inbox_keys WHERE event_id = $1", event_id) == 1


async def test_send_takes_every_field_from_flags(
    ingest: TestClient, db: Any, tmp_path: Path
) -> None:
    payment_id = new_id("pay")
    url = str(ingest.make_url(WEBHOOK_PATH))

    code, out, err = await send(
        tmp_path,
        *("--url", url, "--payment-id", payment_id, "--event", "refund.completed"),
        *("--status", "refunded", "--amount", "7.50", "--currency", "EUR", "--refund-id", "re_1"),
        XHUB_WEBHOOK_SECRETS=TEST_SECRETS[1],  # ingest accepts every configured secret
    )

    assert code == 0, err
    event_id = printed_headers(out)["X-Webhook-Id"]
    assert event_id.startswith("evt_")  # a fresh one when --event-id is not given
    row = await db.fetchrow("SELECT event_type, body FROM inbox WHERE event_id = $1", event_id)
    assert row["event_type"] == "refund.completed"
    stored = orjson.loads(row["body"])
    assert (stored["status"], stored["amount"], stored["currency"], stored["refund_id"]) == (
        "refunded",
        "7.50",
        "EUR",
        "re_1",
    )


async def test_send_answered_other_than_2xx_prints_the_answer_and_exits_1(
    ingest: TestClient, db: Any, tmp_path: Path
) -> None:
    url = str(ingest.make_url(WEBHOOK_PATH))

    code, out, _ = await send(
        tmp_path, "--url", url, "--payment-id", "pay_x", XHUB_WEBHOOK_SECRETS="not-ingests-secret"
    )

    assert code == 1
    assert "< 401 Unauthorized" in out
    assert "signature does not match" in out
    assert await db.fetchval("SELECT count(*) FROM inbox") == 0


async def test_send_without_webhook_secrets_exits_2_naming_them(tmp_path: Path) -> None:
    code, out, err = await send(tmp_path, "--payment-id", "pay_x")

    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "XHUB_WEBHOOK_SECRETS" in err


async def test_send_to_nothing_exits_3_in_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}{WEBHOOK_PATH}"

    code, out, err = await send(
        tmp_path, "--url", url, "--payment-id", "pay_x", XHUB_WEBHOOK_SECRETS="s"
    )

    assert code == 3
    assert out.startswith(f"> POST {url}")  # what it tried to send is shown all the same
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"payhooks: cannot reach ingest at {url}")
