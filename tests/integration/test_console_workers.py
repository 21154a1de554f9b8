"""The console's Workers page: an operator pauses, throttles, lifts the cap and resumes a
worker in a real browser (headless chromium, as test_console_browser.py), a running email
worker replica follows each change on its /readyz, and the audit trail says it was the
console; at the HTTP level, bad input is a 4xx page and a form without its CSRF field is
refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient
from selenium import webdriver

from services.email.app import create_app as email_app
from shared.amqp.broker import BROKER
from tests.helpers import eventually
from tests.integration.api_contract import running_api
from tests.integration.system import EMAIL_FROM
from tests.integration.test_console import csrf_of
from tests.integration.test_console import sign_in as sign_in_http
from tests.integration.test_console_browser import (
    TOKENS,
    Console,
    browser,
    chromium,
    on_sign_in_page,
    sign_in,
)

__all__ = ["browser", "chromium"]  # the browser test's fixtures, used here


@pytest.fixture
async def controls(db: Any) -> AsyncIterator[Any]:
    await db.execute("TRUNCATE worker_controls")
    yield db
    await db.execute("TRUNCATE worker_controls")


async def actions(db: Any) -> list[tuple[str, str, str, str]]:
    rows = await db.fetch(
        "SELECT source, actor, action, target FROM operator_actions"
        " WHERE action LIKE 'worker.%' ORDER BY id"
    )
    return [(r["source"], r["actor"], r["action"], r["target"]) for r in rows]


async def readiness(client: TestClient) -> dict[str, Any]:
    response = await client.get("/readyz")
    body: dict[str, Any] = await response.json()
    return {**body, "http": response.status}


async def test_an_operator_pauses_throttles_and_resumes_a_worker_in_the_browser(
    browser: webdriver.Chrome,
    aiohttp_client: Any,
    make_settings: Any,
    smtp: Any,
    db: Any,
    controls: Any,
    channel: AbstractChannel,
) -> None:
    settings = make_settings(ADMIN_TOKENS=TOKENS, SMTP_PORT=str(smtp[1]), EMAIL_FROM=EMAIL_FROM)
    app = email_app(settings)
    replica = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    console = Console(browser, await running_api(aiohttp_client, settings))

    await console.open("/console/workers")
    assert await on_sign_in_page(console)
    await sign_in(console, "ann-token")
    assert await console.path() == "/console/workers"
    rows = await console.rows("#workers")
    assert [row[:2] for row in rows] == [
        ["orders", "running"],
        ["bonuses", "running"],
        ["email", "running"],
    ]

    await console.type("#reason-email", "relay incident INC-7")
    await console.click("#pause-email button[type=submit]")
    assert "Done: paused email" in await console.text("#done")
    [email] = [row for row in await console.rows("#workers") if row[0] == "email"]
    assert email[1:3] == ["paused", "ann"]
    assert email[4] == "relay incident INC-7"
    ready = await eventually(lambda: readiness(replica), lambda r: "operator_pause" in r)
    assert ready["http"] == 200
    assert ready["operator_pause"]["by"] == "ann"
    await console.screenshot("workers")

    await console.type("#rate-email", "5")
    await console.click("#throttle-email button[type=submit]")
    [email] = [row for row in await console.rows("#workers") if row[0] == "email"]
    assert email[5] == "5 (by ann)"
    ready = await eventually(lambda: readiness(replica), lambda r: "rate_limit" in r)
    assert ready["rate_limit"]["per_second"] == 5

    await console.type("#rate-email", "fast")
    await console.click("#throttle-email button[type=submit]")
    assert "per_second must be a number" in await console.text()
    await console.open("/console/workers")
    await console.click("#unthrottle-email button[type=submit]")
    await console.click("#resume-email button[type=submit]")
    [email] = [row for row in await console.rows("#workers") if row[0] == "email"]
    assert email[1] == "running"
    assert email[5] == "none"
    await eventually(
        lambda: readiness(replica), lambda r: "operator_pause" not in r and "rate_limit" not in r
    )
    assert await actions(db) == [
        ("console", "ann", "worker.pause", "email"),
        ("console", "ann", "worker.throttle", "email"),
        ("console", "ann", "worker.unthrottle", "email"),
        ("console", "ann", "worker.resume", "email"),
    ]
    await console.open("/console/audit")
    assert "worker.pause" in await console.text("#actions")


async def test_workers_forms_refuse_bad_input_and_forgeries(
    aiohttp_client: Any, make_settings: Any, db: Any, controls: Any, channel: AbstractChannel
) -> None:
    console = await running_api(aiohttp_client, make_settings(ADMIN_TOKENS=TOKENS))
    assert (await console.get("/console/workers", allow_redirects=False)).status == 303
    await sign_in_http(console, "ann-token")
    csrf = await csrf_of(console, "/console/workers")
    forged = await console.post("/console/workers/email/pause", data={"reason": "x"})
    assert forged.status == 403
    answers = [
        ("/console/workers/email/pause", {"reason": " "}, 400),
        ("/console/workers/nope/pause", {"reason": "x"}, 404),
        ("/console/workers/email/throttle", {"per_second": "0"}, 400),
        ("/console/workers/email/resume", {}, 409),
        ("/console/workers/email/unthrottle", {}, 409),
        ("/console/workers/emails/pause", {"reason": "quota"}, 200),
        ("/console/workers/email/pause", {"reason": "again"}, 409),
    ]
    for path, form, status in answers:
        answer = await console.post(path, data={**form, "csrf": csrf})
        assert answer.status == status, (path, await answer.text())
    assert await actions(db) == [("console", "ann", "worker.pause", "email")]
