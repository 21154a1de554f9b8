"""The api's answers held to its OpenAPI document (services/api/openapi.py), and a running api
for the tests that do so."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator

from services.api.app import create_app
from services.api.openapi import DOCUMENT
from services.api.responses import PROBLEM_JSON
from shared.amqp.broker import BROKER
from shared.config import Settings
from tests.helpers import eventually

AUTH = {"Authorization": "Bearer test-admin-token"}  # tests.conftest make_settings: ADMIN_TOKEN


async def running_api(aiohttp_client: Any, settings: Settings) -> TestClient:
    """The api connected to RabbitMQ, its monitor's one pass at startup done: it reads the DLQs
    too, and must not hold one while a test reads it."""
    app = create_app(settings, monitor_interval_s=3600)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)

    async def metrics() -> str:
        return await (await client.get("/metrics")).text()

    await eventually(metrics, lambda text: "payhooks_queue_oldest_message_age_seconds{" in text)
    return client


def schema_errors(schema: dict[str, Any], value: Any) -> list[str]:
    """What in `value` breaks `schema`, a schema of the document (its $refs resolve)."""
    validator = Draft202012Validator({**schema, "components": DOCUMENT["components"]})
    return sorted(f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(value))


def check_answer(method: str, template: str, status: int, content_type: str, body: Any) -> None:
    """The answer is one the document gives for this operation: its status, its media type,
    a body of that status's schema."""
    where = f"{method} {template} -> {status}"
    responses = DOCUMENT["paths"][template][method.lower()]["responses"]
    assert str(status) in responses, f"{where}: status not documented ({body!r:.300})"
    content = responses[str(status)]["content"]
    assert content_type in content, f"{where}: {content_type} not documented"
    errors = schema_errors(content[content_type]["schema"], body)
    assert not errors, f"{where}: {errors} in {body!r:.500}"
    if content_type == PROBLEM_JSON:
        assert body["status"] == status, where


def check_problem(status: int, content_type: str, body: Any) -> None:
    """An error of no documented operation (an unknown path, a method a path lacks)."""
    assert content_type == PROBLEM_JSON, (status, body)
    assert not schema_errors({"$ref": "#/components/schemas/Problem"}, body), body
    assert body["status"] == status


async def documented(response: ClientResponse, method: str, template: str) -> Any:
    """The response's body, after checking it against the document."""
    if response.content_type == "text/plain":
        body: Any = await response.text()
    else:
        body = await response.json(content_type=None)
    check_answer(method, template, response.status, response.content_type, body)
    return body
