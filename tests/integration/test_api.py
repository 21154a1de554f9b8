"""The api service: admin token, order registration (validation, idempotency), order lookup."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from services.api import order_routes
from services.api.app import create_app
from shared.config import Settings

TOKEN = {"Authorization": "Bearer test-admin-token"}
ORDER = {
    "order_id": "ord_api_1",
    "payment_id": "pay_api_1",
    "user_id": "user_1",
    "email": "buyer@example.test",
    "amount": "100.00",
    "currency": "USD",
}


@pytest.fixture
async def api(aiohttp_client: Any, settings: Settings, db: Any) -> TestClient:
    client: TestClient = await aiohttp_client(create_app(settings))
    return client


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic test-admin-token"},
        {"Authorization": "test-admin-token"},
    ],
)
async def test_api_routes_need_the_admin_token(api: TestClient, headers: dict[str, str]) -> None:
    assert (await api.post("/api/orders", json=ORDER, headers=headers)).status == 401
    assert (await api.get("/api/orders/ord_api_1", headers=headers)).status == 401


async def test_health_and_metrics_are_open(api: TestClient) -> None:
    assert (await api.get("/healthz")).status == 200
    assert (await api.get("/metrics")).status == 200


async def test_registering_an_order_is_idempotent_on_order_id(api: TestClient) -> None:
    first = await api.post("/api/orders", json=ORDER, headers=TOKEN)
    again = await api.post("/api/orders", json=ORDER, headers=TOKEN)

    assert first.status == 201
    assert again.status == 200
    body = await again.json()
    assert {k: body[k] for k in ORDER} == ORDER
    assert body["status"] == "PENDING"
    assert body["refunded_amount"] == "0.00"


async def test_identical_concurrent_registrations_all_succeed_once_created(
    api: TestClient, db: Any
) -> None:
    """Idempotent on order_id under concurrency too: the payment id's unique index must not
    turn a racing identical copy into "belongs to another order"."""
    for round_ in range(15):
        order = {**ORDER, "order_id": f"ord_race_{round_}", "payment_id": f"pay_race_{round_}"}
        responses = await asyncio.gather(
            *(api.post("/api/orders", json=order, headers=TOKEN) for _ in range(12))
        )
        statuses = sorted(r.status for r in responses)
        assert statuses == [200] * 11 + [201], (round_, statuses)
    assert await db.fetchval("SELECT count(*) FROM orders WHERE order_id LIKE 'ord_race_%'") == 15


async def test_same_order_id_with_other_details_is_a_conflict(api: TestClient) -> None:
    await api.post("/api/orders", json=ORDER, headers=TOKEN)

    response = await api.post("/api/orders", json={**ORDER, "amount": "99.00"}, headers=TOKEN)

    assert response.status == 409


async def test_bad_order_is_400_naming_every_bad_field(api: TestClient, db: Any) -> None:
    bad = {**ORDER, "amount": "1e3", "currency": "usd", "email": "nobody"}
    del bad["user_id"]

    response = await api.post("/api/orders", json=bad, headers=TOKEN)

    assert response.status == 400
    fields = (await response.json())["fields"]
    assert set(fields) == {"amount", "currency", "email", "user_id"}
    assert await db.fetchval("SELECT count(*) FROM orders") == 0


async def test_order_lookup(api: TestClient) -> None:
    await api.post("/api/orders", json=ORDER, headers=TOKEN)

    found = await api.get("/api/orders/ord_api_1", headers=TOKEN)
    missing = await api.get("/api/orders/nope", headers=TOKEN)

    assert found.status == 200
    assert (await found.json())["payment_id"] == "pay_api_1"
    assert missing.status == 404


async def test_an_order_id_with_braces_or_a_slash_is_found(api: TestClient) -> None:
    order = {**ORDER, "order_id": "ord/{1}", "payment_id": "pay/{1}", "user_id": "u/{1}"}
    assert (await api.post("/api/orders", json=order, headers=TOKEN)).status == 201

    found = await api.get("/api/orders/ord%2F%7B1%7D", headers=TOKEN)
    payment = await api.get("/api/payments/pay%2F%7B1%7D", headers=TOKEN)
    bonus = await api.get("/api/users/u%2F%7B1%7D/bonus", headers=TOKEN)

    assert (found.status, (await found.json())["order_id"]) == (200, "ord/{1}")
    assert (payment.status, (await payment.json())["order"]["order_id"]) == (200, "ord/{1}")
    assert (bonus.status, (await bonus.json())["user_id"]) == (200, "u/{1}")


async def test_errors_are_problem_details_with_a_stable_code(api: TestClient) -> None:
    response = await api.get("/api/orders/nope", headers=TOKEN)

    assert response.status == 404
    assert response.content_type == "application/problem+json"
    assert await response.json() == {
        "type": "urn:payhooks:problem:not_found",
        "title": "Not found",
        "status": 404,
        "detail": "order not found",
        "code": "not_found",
        "error": "order not found",  # as before problem details
    }


@pytest.mark.parametrize("field", ["order_id", "payment_id", "user_id", "email"])
async def test_nul_in_an_order_field_is_400_naming_it(api: TestClient, db: Any, field: str) -> None:
    # PostgreSQL refuses NUL in text: this was a 500.
    value = "buyer\x00@example.test" if field == "email" else "id\x00"

    response = await api.post("/api/orders", json={**ORDER, field: value}, headers=TOKEN)

    assert response.status == 400
    problem = await response.json()
    assert (problem["code"], problem["error"]) == ("invalid_order", "invalid order")
    assert problem["fields"] == {field: "must not contain NUL characters"}
    assert field in problem["detail"]
    assert await db.fetchval("SELECT count(*) FROM orders") == 0


@pytest.mark.parametrize(("field", "value"), [("currency", "USD\n"), ("amount", "100.00\n")])
async def test_a_trailing_newline_is_not_a_valid_amount_or_currency(
    api: TestClient, db: Any, field: str, value: str
) -> None:
    response = await api.post("/api/orders", json={**ORDER, field: value}, headers=TOKEN)

    assert response.status == 400
    assert set((await response.json())["fields"]) == {field}
    assert await db.fetchval("SELECT count(*) FROM orders") == 0


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/api/orders/%00", "order_id"),
        ("/api/payments/pay%00x", "payment_id"),
        ("/api/users/%00/bonus", "user_id"),
    ],
)
async def test_nul_in_a_path_id_is_400_naming_it(api: TestClient, path: str, name: str) -> None:
    response = await api.get(path, headers=TOKEN)

    assert response.status == 400
    problem = await response.json()
    assert problem["code"] == "invalid_request"
    assert problem["error"] == f"{name} must not contain NUL characters"


# --- JSON everywhere, RabbitMQ down ----------------------------------------------------------


async def test_dlq_routes_without_rabbitmq_are_503_json_with_retry_after(
    api_without_rabbitmq: TestClient,
) -> None:
    for method, path in (
        ("GET", "/api/dlq"),
        ("GET", "/api/dlq/orders"),
        ("POST", "/api/dlq/orders/requeue"),
    ):
        response = await api_without_rabbitmq.request(
            method, path, json={"all": True}, headers=TOKEN
        )

        assert response.status == 503, path
        assert response.content_type == "application/problem+json", path
        problem = await response.json()
        assert "RabbitMQ" in problem["error"], path
        assert (problem["code"], problem["status"]) == ("unavailable", 503), path
        assert int(response.headers["Retry-After"]) > 0, path


async def test_payment_view_without_rabbitmq_shows_the_database_and_says_so(
    api_without_rabbitmq: TestClient,
) -> None:
    assert (await api_without_rabbitmq.post("/api/orders", json=ORDER, headers=TOKEN)).ok

    response = await api_without_rabbitmq.get("/api/payments/pay_api_1", headers=TOKEN)

    assert response.status == 200
    view = await response.json()
    assert view["order"]["order_id"] == "ord_api_1"
    assert view["dead_letters"] == []
    assert "RabbitMQ" in view["dead_letters_unavailable"]


async def test_unknown_routes_and_methods_answer_json(api: TestClient) -> None:
    unknown = await api.get("/api/nothing-here", headers=TOKEN)
    wrong_method = await api.delete("/api/orders/ord_api_1", headers=TOKEN)

    assert unknown.status == 404
    assert (await unknown.json())["error"]
    assert wrong_method.status == 405
    assert (await wrong_method.json())["error"]
    assert "GET" in wrong_method.headers["Allow"]


async def test_an_unexpected_error_is_a_logged_json_500(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(conn: Any, user_id: str) -> dict[str, Any]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(order_routes, "user_bonus", broken)

    with capture_logs() as logs:
        response = await api.get("/api/users/u1/bonus", headers=TOKEN)

    assert response.status == 500
    assert "a bug" not in (await response.json())["error"]  # details go to the log only
    [failed] = [e for e in logs if e["event"] == "request.failed"]
    assert (failed["log_level"], failed["path"], failed["exc_info"]) == (
        "error",
        "/api/users/u1/bonus",
        True,
    )


async def test_metrics_stay_prometheus_text(api: TestClient) -> None:
    response = await api.get("/metrics")

    assert response.status == 200
    assert response.content_type == "text/plain"
