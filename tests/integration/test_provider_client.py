"""The provider API client against a real local HTTP server scripted per test (no mocks)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from email.utils import format_datetime
from typing import Any

import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer
from structlog.testing import capture_logs

from shared.config import ConfigError, Settings
from shared.errors import PermanentError, TransientError
from shared.metrics import PROVIDER_OUTCOMES, ProviderMetrics
from shared.providers.xhub.client import (
    PaymentNotFoundError,
    ProviderAuthError,
    ProviderClient,
    ProviderPolicy,
    ProviderUnavailableError,
)
from shared.providers.xhub.pacing import parse_retry_after
from shared.providers.xhub.payments import ProviderPayment, ProviderResponseError

API_KEY = "sk_live_DO-NOT-LEAK-7f3a9c"
# Short timeouts and backoffs so every test runs in well under a second unless it measures a wait.
FAST = {
    "connect_timeout_s": 0.5,
    "read_timeout_s": 0.5,
    "max_attempts": 3,
    "backoff_base_s": 0.01,
    "backoff_max_s": 0.05,
    "retry_after_max_s": 5.0,
    "deadline_s": 5.0,
    "rate_per_s": 1000.0,
    "burst": 100,
}

Responder = Callable[[web.Request], Awaitable[web.StreamResponse]]


def payment_body(payment_id: str, **overrides: Any) -> dict[str, Any]:
    return {
        "payment_id": payment_id,
        "status": "paid",
        "amount": "100.50",
        "currency": "EUR",
        "updated_at": "2026-03-01T12:00:00Z",
        **overrides,
    }


async def ok(request: web.Request) -> web.StreamResponse:
    return web.json_response(payment_body(request.match_info["payment_id"]))


def status(code: int, headers: dict[str, str] | None = None) -> Responder:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, headers=headers, text="{}")

    return respond


def raw_body(body: bytes) -> Responder:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    return respond


def slow(delay_s: float) -> Responder:
    async def respond(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(delay_s)
        return await ok(request)

    return respond


@dataclass
class Hit:
    at: float
    raw_path: str
    authorization: str | None


@dataclass
class Provider:
    """A fake X-Hub API: answers from `script` in order, then with `default`; records each hit."""

    url: str = ""
    script: list[Responder] = field(default_factory=list)
    default: Responder = ok
    hits: list[Hit] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        authorization = request.headers.get("Authorization")
        self.hits.append(Hit(time.monotonic(), request.raw_path, authorization))
        if authorization != f"Bearer {API_KEY}":
            return web.json_response({"error": "unauthorized"}, status=401)
        responder = self.script.pop(0) if self.script else self.default
        return await responder(request)


@pytest.fixture
async def provider(aiohttp_server: AiohttpServer) -> Provider:
    fake = Provider()
    app = web.Application()
    # {payment_id:.+} also matches quoted slashes, so a hostile id still reaches one handler.
    app.router.add_get("/xhub/v1/payments/{payment_id:.+}", fake.handle)
    server = await aiohttp_server(app)
    fake.url = str(server.make_url("/xhub/v1/"))
    return fake


MakeClient = Callable[..., Awaitable[ProviderClient]]


@pytest.fixture
async def make_client(provider: Provider) -> AsyncIterator[MakeClient]:
    """Started clients on a fresh registry, closed at teardown; keywords override FAST."""
    async with AsyncExitStack() as stack:

        async def make(
            *, api_key: str = API_KEY, url: str | None = None, **policy: Any
        ) -> ProviderClient:
            client = ProviderClient(
                url or provider.url,
                api_key,
                metrics=ProviderMetrics.create(CollectorRegistry()),
                policy=ProviderPolicy(**{**FAST, **policy}),
            )
            return await stack.enter_async_context(client)

        yield make


def outcomes(client: ProviderClient) -> dict[str, float]:
    """Every outcome the client counted, and how often (zeros left out)."""
    counts = {
        sample.labels["outcome"]: sample.value
        for metric in client.metrics.requests.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }
    assert set(counts) == set(PROVIDER_OUTCOMES)  # every outcome exported from the start
    return {outcome: n for outcome, n in counts.items() if n}


def observed_requests(client: ProviderClient) -> float:
    for metric in client.metrics.request_duration.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                return sample.value
    raise AssertionError("no histogram count")


async def test_payment_is_parsed_from_the_provider_answer(
    provider: Provider, make_client: MakeClient
) -> None:
    client = await make_client()

    payment = await client.get_payment("pay_1")

    assert payment.payment_id == "pay_1"
    assert payment.status == "paid"
    assert payment.amount == Decimal("100.50")
    assert payment.currency == "EUR"
    assert payment.updated_at == datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert [(h.raw_path, h.authorization) for h in provider.hits] == [
        ("/xhub/v1/payments/pay_1", f"Bearer {API_KEY}")
    ]
    assert outcomes(client) == {"ok": 1}
    assert observed_requests(client) == 1


async def test_payment_id_is_url_quoted(provider: Provider, make_client: MakeClient) -> None:
    client = await make_client()
    hostile = "pay/../admin x?y#z"

    payment = await client.get_payment(hostile)

    assert payment.payment_id == hostile
    assert provider.hits[0].raw_path == "/xhub/v1/payments/pay%2F..%2Fadmin%20x%3Fy%23z"


async def test_wrong_key_is_an_auth_error_that_names_the_variable_not_the_key(
    provider: Provider, make_client: MakeClient
) -> None:
    wrong_key = "sk_live_WRONG-KEY-123"
    client = await make_client(api_key=wrong_key)

    with pytest.raises(ProviderAuthError) as caught:
        await client.get_payment("pay_1")

    assert isinstance(caught.value, PermanentError)
    assert "XHUB_API_KEY" in str(caught.value)
    assert wrong_key not in str(caught.value)
    assert len(provider.hits) == 1  # never retried
    assert outcomes(client) == {"unauthorized": 1}


async def test_forbidden_is_an_auth_error(provider: Provider, make_client: MakeClient) -> None:
    provider.script = [status(403)]
    client = await make_client()

    with pytest.raises(ProviderAuthError, match="XHUB_API_KEY"):
        await client.get_payment("pay_1")

    assert outcomes(client) == {"unauthorized": 1}


async def test_unknown_payment_is_not_found(provider: Provider, make_client: MakeClient) -> None:
    provider.default = status(404)
    client = await make_client()

    with pytest.raises(PaymentNotFoundError) as caught:
        await client.get_payment("pay_missing")

    assert caught.value.payment_id == "pay_missing"
    assert isinstance(caught.value, PermanentError)
    assert len(provider.hits) == 1
    assert outcomes(client) == {"not_found": 1}


async def test_server_errors_are_retried_until_success(
    provider: Provider, make_client: MakeClient
) -> None:
    provider.script = [status(500), status(503)]
    client = await make_client()

    payment = await client.get_payment("pay_1")

    assert payment.status == "paid"
    assert len(provider.hits) == 3
    assert outcomes(client) == {"server_error": 2, "ok": 1}
    assert observed_requests(client) == 3


async def test_persistent_server_errors_exhaust_the_attempts(
    provider: Provider, make_client: MakeClient
) -> None:
    provider.default = status(502)
    client = await make_client(max_attempts=4)

    with pytest.raises(ProviderUnavailableError) as caught:
        await client.get_payment("pay_1")

    assert isinstance(caught.value, TransientError)
    assert caught.value.attempts == 4
    assert caught.value.last_outcome == "server_error"
    assert len(provider.hits) == 4
    assert outcomes(client) == {"server_error": 4}


async def test_rate_limited_answer_waits_for_retry_after(
    provider: Provider, make_client: MakeClient
) -> None:
    provider.script = [status(429, {"Retry-After": "1"})]
    client = await make_client()

    await client.get_payment("pay_1")

    gap = provider.hits[1].at - provider.hits[0].at
    assert 0.95 <= gap < 1.5
    assert outcomes(client) == {"rate_limited": 1, "ok": 1}


async def test_retry_after_is_capped(provider: Provider, make_client: MakeClient) -> None:
    provider.script = [status(503, {"Retry-After": "30"})]
    client = await make_client(retry_after_max_s=0.2)

    await client.get_payment("pay_1")

    gap = provider.hits[1].at - provider.hits[0].at
    assert 0.19 <= gap < 1.0
    assert outcomes(client) == {"server_error": 1, "ok": 1}


async def test_retry_after_beyond_the_deadline_gives_up_at_once(
    provider: Provider, make_client: MakeClient
) -> None:
    provider.default = status(503, {"Retry-After": "3"})
    client = await make_client(deadline_s=1.0)
    started = time.monotonic()

    with pytest.raises(ProviderUnavailableError):
        await client.get_payment("pay_1")

    assert time.monotonic() - started < 1.0
    assert len(provider.hits) == 1


async def test_retry_after_holds_later_calls_for_other_payments_too(
    provider: Provider, make_client: MakeClient
) -> None:
    """A 429 storm must not be met with one request per order: the provider's Retry-After
    holds the whole client, so the next payment's call sends nothing until it has passed."""
    provider.script = [status(429, {"Retry-After": "2"})]
    client = await make_client(deadline_s=1.5)

    with pytest.raises(ProviderUnavailableError):
        await client.get_payment("pay_1")  # the wait doesn't fit its deadline: gives up
    started = time.monotonic()
    with pytest.raises(ProviderUnavailableError, match="rate limit wait"):
        await client.get_payment("pay_2")  # held: nothing sent, and no longer than its deadline

    assert len(provider.hits) == 1
    assert time.monotonic() - started < 1.7
    await asyncio.sleep(0.6)  # the provider's two seconds are over
    assert (await client.get_payment("pay_3")).payment_id == "pay_3"
    assert len(provider.hits) == 2


async def test_slow_answers_time_out_and_exhaust_the_retries(
    provider: Provider, make_client: MakeClient
) -> None:
    provider.default = slow(0.6)
    client = await make_client(read_timeout_s=0.1, max_attempts=3)
    started = time.monotonic()

    with pytest.raises(ProviderUnavailableError) as caught:
        await client.get_payment("pay_1")

    assert time.monotonic() - started < 1.0  # three answers would take 1.8 s
    assert caught.value.last_outcome == "timeout"
    assert len(provider.hits) == 3
    assert outcomes(client) == {"timeout": 3}


async def test_one_slow_answer_is_retried(provider: Provider, make_client: MakeClient) -> None:
    provider.script = [slow(0.6)]
    client = await make_client(read_timeout_s=0.1)

    payment = await client.get_payment("pay_1")

    assert payment.status == "paid"
    assert outcomes(client) == {"timeout": 1, "ok": 1}


async def test_deadline_bounds_the_whole_call(provider: Provider, make_client: MakeClient) -> None:
    provider.default = status(500)
    client = await make_client(max_attempts=1000, backoff_base_s=0.05, deadline_s=0.4)
    started = time.monotonic()

    with pytest.raises(ProviderUnavailableError):
        await client.get_payment("pay_1")

    assert time.monotonic() - started < 0.8
    assert 2 <= len(provider.hits) < 1000


async def test_unreachable_provider_is_retried_then_unavailable(make_client: MakeClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before use: connections are refused
    client = await make_client(url=f"http://127.0.0.1:{port}/")

    with pytest.raises(ProviderUnavailableError) as caught:
        await client.get_payment("pay_1")

    assert caught.value.last_outcome == "network_error"
    assert outcomes(client) == {"network_error": 3}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"<html>oops</html>", id="not-json"),
        pytest.param(b"[]", id="not-an-object"),
        pytest.param({"status": "paid"}, id="missing-fields"),
        pytest.param({"amount": "ten"}, id="non-numeric-amount"),
        pytest.param({"amount": True}, id="boolean-amount"),
        pytest.param({"amount": "NaN"}, id="nan-amount"),
        pytest.param({"status": 3}, id="non-string-status"),
        pytest.param({"updated_at": "yesterday"}, id="bad-date"),
        pytest.param({"updated_at": "2026-03-01T12:00:00"}, id="naive-date"),
        pytest.param({"payment_id": "pay_other"}, id="another-payment"),
    ],
)
async def test_invalid_answers_are_permanent_response_errors(
    provider: Provider, make_client: MakeClient, body: bytes | dict[str, Any]
) -> None:
    if isinstance(body, dict):
        fields = {"payment_id": "pay_1"} if body == {"status": "paid"} else payment_body("pay_1")
        body = orjson.dumps({**fields, **body})
    provider.default = raw_body(body)
    client = await make_client()

    with pytest.raises(ProviderResponseError) as caught:
        await client.get_payment("pay_1")

    assert isinstance(caught.value, PermanentError)
    assert len(provider.hits) == 1
    assert outcomes(client) == {"invalid_response": 1}


@pytest.mark.parametrize("code", [400, 302])
async def test_unexpected_status_is_permanent_and_never_followed(
    provider: Provider, make_client: MakeClient, code: int
) -> None:
    provider.default = status(code, {"Location": "http://127.0.0.1:1/steal"})
    client = await make_client()

    with pytest.raises(ProviderResponseError, match=str(code)):
        await client.get_payment("pay_1")

    assert len(provider.hits) == 1
    assert outcomes(client) == {"unexpected_status": 1}


async def test_rate_limiter_bounds_concurrent_callers(
    provider: Provider, make_client: MakeClient
) -> None:
    rate = 40.0
    client = await make_client(rate_per_s=rate, burst=1)
    started = time.monotonic()

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(client.get_payment(f"pay_{i}")) for i in range(20)]

    assert time.monotonic() - started >= 19 / rate * 0.95
    assert {t.result().payment_id for t in tasks} == {f"pay_{i}" for i in range(20)}
    # However the callers interleave, the k-th request never reaches the server before k/rate.
    offsets = sorted(h.at - started for h in provider.hits)
    assert all(offset >= k / rate * 0.95 for k, offset in enumerate(offsets))
    assert outcomes(client) == {"ok": 20}


async def test_rate_limiter_lets_a_burst_through(
    provider: Provider, make_client: MakeClient
) -> None:
    client = await make_client(rate_per_s=1.0, burst=5)
    started = time.monotonic()

    await asyncio.gather(*(client.get_payment(f"pay_{i}") for i in range(5)))

    assert time.monotonic() - started < 1.5  # one token a second would take 4 s


async def test_rate_limit_wait_counts_against_the_deadline(
    provider: Provider, make_client: MakeClient
) -> None:
    client = await make_client(rate_per_s=1.0, burst=1, deadline_s=0.3)

    results = await asyncio.gather(
        client.get_payment("pay_1"), client.get_payment("pay_2"), return_exceptions=True
    )

    # One caller gets the only token; the other would wait 1 s, past its 0.3 s deadline.
    paid = [r for r in results if isinstance(r, ProviderPayment)]
    refused = [r for r in results if isinstance(r, ProviderUnavailableError)]
    assert (len(paid), len(refused)) == (1, 1)
    assert refused[0].attempts == 0
    assert len(provider.hits) == 1


async def test_api_key_never_appears_in_repr_errors_or_logs(
    provider: Provider, make_client: MakeClient
) -> None:
    provider.script = [status(500)]
    client = await make_client(read_timeout_s=0.05)
    errors: list[BaseException] = []

    with capture_logs() as logs:
        await client.get_payment("pay_1")
        for responder in (status(401), status(404), status(400), raw_body(b"{}"), slow(0.3)):
            provider.default = responder
            try:
                await client.get_payment("pay_2")
            except Exception as e:
                errors.append(e)

    assert len(errors) == 5
    assert any(log["event"] == "provider.request_failed" for log in logs)
    exposed = [repr(client), str(logs), *(f"{e!s} {e!r} {e.__cause__!r}" for e in errors)]
    for text in exposed:
        assert API_KEY not in text


def test_repr_hides_credentials_in_the_url() -> None:
    client = ProviderClient(
        "https://user:url-Pa55word@xhub.example/v1",
        API_KEY,
        metrics=ProviderMetrics.create(CollectorRegistry()),
    )

    assert API_KEY not in repr(client)
    assert "url-Pa55word" not in repr(client)
    assert "xhub.example" in repr(client)


async def test_client_must_be_started_first(provider: Provider) -> None:
    client = ProviderClient(
        provider.url, API_KEY, metrics=ProviderMetrics.create(CollectorRegistry())
    )
    with pytest.raises(RuntimeError, match="not started"):
        await client.get_payment("pay_1")


def test_missing_settings_are_named() -> None:
    settings = Settings.from_env({"XHUB_API_URL": "http://127.0.0.1:1"})
    metrics = ProviderMetrics.create(CollectorRegistry())

    with pytest.raises(ConfigError, match="XHUB_API_KEY is required"):
        ProviderClient.from_settings(settings, metrics)


def test_policy_rejects_non_positive_values() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        ProviderPolicy(max_attempts=0)


NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("3", 3.0),
        (" 0.25 ", 0.25),
        (format_datetime(NOW + timedelta(seconds=7), usegmt=True), 7.0),
        (format_datetime(NOW - timedelta(seconds=7), usegmt=True), 0.0),
        ("-1", None),
        ("soon", None),
    ],
)
def test_retry_after_accepts_seconds_and_http_dates(
    header: str | None, expected: float | None
) -> None:
    assert parse_retry_after(header, NOW) == expected
