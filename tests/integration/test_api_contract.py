"""The OpenAPI document stays true: every route the app has is in it and nothing else, its
schemas are valid, and real answers (successes and errors) match what it says."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator

from services.api import app as api_app
from services.api.app import create_app
from services.api.console import PREFIX as CONSOLE
from services.api.openapi import DOCUMENT, PATH
from services.api.responses import PROBLEMS
from shared.amqp.topology import Topology
from shared.config import Settings
from tests.integration.api_contract import (
    AUTH,
    check_problem,
    documented,
    running_api,
)
from tests.integration.inbox_events import store_events
from tests.integration.test_dlq import Letter, new_id, put_dead_letters


@pytest.fixture
async def api(
    aiohttp_client: Any, settings: Settings, db: Any, channel: AbstractChannel
) -> TestClient:
    return await running_api(aiohttp_client, settings)


def operations() -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, ops in DOCUMENT["paths"].items() for m in ops}


def test_every_route_of_the_app_is_documented_and_nothing_else(settings: Settings) -> None:
    app = create_app(settings)
    # aiohttp adds a HEAD to every GET; HEAD answers as GET does, without the body. The
    # console's pages are HTML for people, not part of the JSON contract.
    routes = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD"
        and route.resource is not None
        and not route.resource.canonical.startswith(CONSOLE)
    }
    assert routes == operations()


def test_path_parameters_and_open_routes_are_as_documented() -> None:
    for path, ops in DOCUMENT["paths"].items():
        in_path = set(re.findall(r"{(\w+)}", path))
        for method, op in ops.items():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == in_path, (method, path)
    open_paths = {
        path
        for path, ops in DOCUMENT["paths"].items()
        for op in ops.values()
        if op.get("security") == []
    }
    assert open_paths == api_app.OPEN_PATHS


def test_every_schema_of_the_document_is_valid_json_schema() -> None:
    assert DOCUMENT["openapi"].startswith("3.1.")
    schemas = list(DOCUMENT["components"]["schemas"].values())
    for op in (op for ops in DOCUMENT["paths"].values() for op in ops.values()):
        media = [*op.get("requestBody", {}).get("content", {}).values()]
        media += [m for answer in op["responses"].values() for m in answer["content"].values()]
        schemas += [m["schema"] for m in media]
        schemas += [p["schema"] for p in op.get("parameters", [])]
    for schema in schemas:
        Draft202012Validator.check_schema(schema)
    codes = DOCUMENT["components"]["schemas"]["Problem"]["properties"]["code"]["enum"]
    assert codes == list(PROBLEMS)


async def test_the_document_is_served_without_the_token(api: TestClient) -> None:
    response = await api.get(PATH)

    assert response.status == 200
    assert await documented(response, "GET", PATH) == DOCUMENT


def order(payment_id: str) -> dict[str, str]:
    return {
        "order_id": f"ord_{payment_id}",
        "payment_id": payment_id,
        "user_id": "user_contract",
        "email": "buyer@example.test",
        "amount": "100.00",
        "currency": "USD",
    }


async def test_real_answers_match_the_document(
    api: TestClient, channel: AbstractChannel, topology: Topology, db: Any
) -> None:
    letters = [Letter(), Letter(), Letter()]
    await put_dead_letters(channel, topology.work["orders"], letters)
    payment_id = new_id("pay")
    new = order(payment_id)
    events = await store_events(db, 2, payment_id=payment_id, outcome="transitioned")
    [text] = await store_events(db, payment_id=None, body=b"\xff not json", published=False)
    requests: list[tuple[str, str, str, Any, int]] = [
        ("POST", "/api/orders", "/api/orders", new, 201),
        ("POST", "/api/orders", "/api/orders", new, 200),
        ("POST", "/api/orders", "/api/orders", {**new, "amount": "1.00"}, 409),
        ("POST", "/api/orders", "/api/orders", {**new, "user_id": "a\x00"}, 400),
        ("POST", "/api/orders", "/api/orders", b"{not json", 400),
        ("POST", "/api/orders", "/api/orders", b"x" * (1024**2 + 1), 413),
        ("GET", "/api/orders/{order_id}", f"/api/orders/ord_{payment_id}", None, 200),
        ("GET", "/api/orders/{order_id}", "/api/orders/nope", None, 404),
        ("GET", "/api/orders/{order_id}", "/api/orders/%00", None, 400),
        ("GET", "/api/payments/{payment_id}", f"/api/payments/{payment_id}", None, 200),
        ("GET", "/api/payments/{payment_id}", "/api/payments/nope", None, 404),
        ("GET", "/api/payments/{payment_id}", "/api/payments/%00", None, 400),
        ("GET", "/api/users/{user_id}/bonus", "/api/users/user_contract/bonus", None, 200),
        ("GET", "/api/users/{user_id}/bonus", "/api/users/%00/bonus", None, 400),
        ("GET", "/api/events", "/api/events", None, 200),
        ("GET", "/api/events", f"/api/events?payment_id={payment_id}&limit=1", None, 200),
        ("GET", "/api/events", "/api/events?outcome=unpublished&event=x", None, 200),
        ("GET", "/api/events", "/api/events?cursor=nope", None, 400),
        ("GET", "/api/events/{event_id}", f"/api/events/{events[0]}", None, 200),
        ("GET", "/api/events/{event_id}", f"/api/events/{text}", None, 200),
        ("GET", "/api/events/{event_id}", f"/api/events/{letters[0].id}", None, 404),
        ("GET", "/api/events/{event_id}", "/api/events/%00", None, 400),
        ("GET", "/api/dlq", "/api/dlq", None, 200),
        ("GET", "/api/dlq/{queue}", "/api/dlq/orders?limit=2", None, 200),
        ("GET", "/api/dlq/{queue}", "/api/dlq/orders?offset=99999999999999999999999", None, 400),
        ("GET", "/api/dlq/{queue}", "/api/dlq/orders?cursor=nope", None, 400),
        ("GET", "/api/dlq/{queue}", "/api/dlq/nope", None, 404),
        ("POST", "/api/dlq/{queue}/requeue", "/api/dlq/emails/requeue", {"all": True}, 200),
        ("POST", "/api/dlq/{queue}/requeue", "/api/dlq/orders/requeue", {"ids": 1}, 400),
        ("POST", "/api/dlq/{queue}/requeue", "/api/dlq/nope/requeue", {"all": True}, 404),
        ("GET", "/api/unrouted", "/api/unrouted", None, 200),
        ("GET", "/api/unrouted", "/api/unrouted?limit=0", None, 400),
        ("GET", "/healthz", "/healthz", None, 200),
        ("GET", "/readyz", "/readyz", None, 200),
        ("GET", "/metrics", "/metrics", None, 200),
    ]
    for method, template, path, body, status in requests:
        kwargs = {"data": io.BytesIO(body)} if isinstance(body, bytes) else {"json": body}
        response = await api.request(method, path, headers=AUTH, **kwargs)
        assert response.status == status, (method, path, await response.text())
        await documented(response, method, template)
    unauthorized = await api.get("/api/dlq")
    assert unauthorized.status == 401
    await documented(unauthorized, "GET", "/api/dlq")
    for method, path, status in (("GET", "/api/nothing", 404), ("DELETE", "/api/dlq", 405)):
        response = await api.request(method, path, headers=AUTH)
        assert response.status == status
        check_problem(status, response.content_type, await response.json())


async def test_answers_without_rabbitmq_match_the_document(
    api_without_rabbitmq: TestClient,
) -> None:
    for method, template, path in (
        ("GET", "/api/dlq", "/api/dlq"),
        ("GET", "/api/dlq/{queue}", "/api/dlq/orders"),
        ("POST", "/api/dlq/{queue}/requeue", "/api/dlq/orders/requeue"),
        ("GET", "/api/unrouted", "/api/unrouted"),
        ("GET", "/readyz", "/readyz"),
    ):
        response = await api_without_rabbitmq.request(
            method, path, json={"all": True}, headers=AUTH
        )
        assert response.status == 503, path
        await documented(response, method, template)


async def test_an_event_without_rabbitmq_comes_from_the_database(
    api_without_rabbitmq: TestClient, db: Any
) -> None:
    [event_id] = await store_events(db)

    response = await api_without_rabbitmq.get(f"/api/events/{event_id}", headers=AUTH)

    assert response.status == 200
    view = await documented(response, "GET", "/api/events/{event_id}")
    assert (view["event_id"], view["dead_letters"]) == (event_id, [])
    assert "RabbitMQ" in view["dead_letters_unavailable"]
