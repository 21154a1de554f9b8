"""`payhooks worker ...` and /api/workers: the same audited actions (shared/ops/
operator_actions.py), their answers as the OpenAPI document says, bad input a problem+json 4xx
(the CLI: exit 2), a second pause or a resume of a running worker a conflict."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from shared.config import Settings
from shared.errors import EXIT_CONFLICT, EXIT_OK, EXIT_USAGE
from tests.integration.api_contract import AUTH, documented, running_api
from tests.integration.test_cli_operators import cli_env, run_payhooks


@pytest.fixture
async def controls(db: Any) -> AsyncIterator[Any]:
    await db.execute("TRUNCATE worker_controls")
    yield db
    await db.execute("TRUNCATE worker_controls")


@pytest.fixture
async def api(
    aiohttp_client: Any, settings: Settings, controls: Any, channel: AbstractChannel
) -> TestClient:
    return await running_api(aiohttp_client, settings)


async def test_the_api_pauses_throttles_and_answers_as_documented(api: TestClient, db: Any) -> None:
    requests: list[tuple[str, str, str, Any, int]] = [
        ("GET", "/api/workers", "/api/workers", None, 200),
        (
            "POST",
            "/api/workers/{worker}/pause",
            "/api/workers/emails/pause",
            {"reason": "quota"},
            200,
        ),
        ("POST", "/api/workers/{worker}/pause", "/api/workers/email/pause", {"reason": "x"}, 409),
        ("POST", "/api/workers/{worker}/pause", "/api/workers/orders/pause", {}, 400),
        ("POST", "/api/workers/{worker}/pause", "/api/workers/orders/pause", {"reason": " "}, 400),
        ("POST", "/api/workers/{worker}/pause", "/api/workers/orders/pause", {"reason": 5}, 400),
        ("POST", "/api/workers/{worker}/pause", "/api/workers/orders/pause", [1], 400),
        ("POST", "/api/workers/{worker}/pause", "/api/workers/nope/pause", {"reason": "x"}, 404),
        ("POST", "/api/workers/{worker}/resume", "/api/workers/bonuses/resume", None, 409),
        (
            "POST",
            "/api/workers/{worker}/throttle",
            "/api/workers/email/throttle",
            {"per_second": 5},
            200,
        ),
        (
            "POST",
            "/api/workers/{worker}/throttle",
            "/api/workers/email/throttle",
            {"per_second": 0},
            400,
        ),
        (
            "POST",
            "/api/workers/{worker}/throttle",
            "/api/workers/email/throttle",
            {"per_second": "5"},
            400,
        ),
        (
            "POST",
            "/api/workers/{worker}/throttle",
            "/api/workers/email/throttle",
            {"per_second": 1e9},
            400,
        ),
        ("GET", "/api/workers", "/api/workers", None, 200),
        ("DELETE", "/api/workers/{worker}/throttle", "/api/workers/email/throttle", None, 200),
        ("DELETE", "/api/workers/{worker}/throttle", "/api/workers/email/throttle", None, 409),
        ("POST", "/api/workers/{worker}/resume", "/api/workers/email/resume", None, 200),
        ("GET", "/api/audit", "/api/audit", None, 200),
    ]
    answers = []
    for method, template, path, body, status in requests:
        response = await api.request(method, path, headers=AUTH, json=body)
        assert response.status == status, (method, path, await response.text())
        answers.append(await documented(response, method, template))
    listed = answers[13]["workers"]
    assert [w["worker"] for w in listed] == ["orders", "bonuses", "email"]
    email = listed[2]
    assert email["paused"] is True
    assert email["paused_reason"] == "quota"
    assert email["paused_by"] == "admin"  # ADMIN_TOKEN's name
    assert email["rate_limit_per_second"] == 5
    assert answers[16]["previous"]["paused_reason"] == "quota"
    actions = [(a["action"], a["target"], a["source"]) for a in answers[-1]["actions"]]
    assert actions == [
        ("worker.resume", "email", "api"),
        ("worker.unthrottle", "email", "api"),
        ("worker.throttle", "email", "api"),
        ("worker.pause", "email", "api"),
    ]


async def test_the_cli_pauses_resumes_and_throttles_a_worker(
    settings: Settings, controls: Any
) -> None:
    env = cli_env(settings, USER="carol")
    paused = await run_payhooks(env, "worker", "pause", "emails", "--reason", "SMTP incident")
    assert (paused.code, paused.out.strip()) == (
        EXIT_OK,
        "email paused (every replica within a second): SMTP incident",
    )
    again = await run_payhooks(env, "worker", "pause", "email", "--reason", "again")
    assert again.code == EXIT_CONFLICT
    assert "paused already, by cli:carol" in again.err
    blank = await run_payhooks(env, "worker", "pause", "orders", "--reason", "  ")
    assert blank.code == EXIT_USAGE
    unknown = await run_payhooks(env, "worker", "pause", "ingest", "--reason", "x")
    assert unknown.code == EXIT_USAGE
    throttled = await run_payhooks(env, "worker", "throttle", "email", "--per-second", "2.5")
    assert throttled.code == EXIT_OK, throttled.err
    bad = await run_payhooks(env, "worker", "throttle", "email", "--per-second", "fast")
    assert (bad.code, bad.err.strip()) == (EXIT_USAGE, "payhooks: --per-second: must be a number")
    listed = await run_payhooks(env, "worker", "list", "--json")
    email = listed.json()["workers"][2]
    assert (email["paused_by"], email["rate_limit_per_second"]) == ("cli:carol", 2.5)
    table = await run_payhooks(env, "worker", "list")
    assert "SMTP incident" in table.out
    assert (await run_payhooks(env, "worker", "unthrottle", "email")).code == EXIT_OK
    assert (await run_payhooks(env, "worker", "unthrottle", "email")).code == EXIT_CONFLICT
    resumed = await run_payhooks(env, "worker", "resume", "email", "--json")
    assert resumed.code == EXIT_OK
    assert resumed.json()["previous"]["paused_by"] == "cli:carol"
    assert (await run_payhooks(env, "worker", "resume", "email")).code == EXIT_CONFLICT
    sources = await controls.fetch("SELECT actor, source, action FROM operator_actions ORDER BY id")
    assert [tuple(r) for r in sources] == [
        ("cli:carol", "cli", "worker.pause"),
        ("cli:carol", "cli", "worker.throttle"),
        ("cli:carol", "cli", "worker.unthrottle"),
        ("cli:carol", "cli", "worker.resume"),
    ]
