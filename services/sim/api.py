"""The simulator's fake payments API: X-Hub's `GET /payments/{id}` with a Bearer key, answering
from the simulator's PaymentBook in the shape shared/providers/xhub/payments.py reads; and the
API of every provider whose `PaymentApi` offers a `route` and an `answer` (Stripe's
`GET /v1/payment_intents/{id}`), answering its own payments in its own shape with its own key.
Each route knows only its provider's payments (404 for another's, as the real ones would)."""

from __future__ import annotations

import hmac
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from aiohttp import web

from shared.providers import registry
from shared.providers.base import Provider, ProviderPayment


@dataclass(frozen=True, slots=True)
class PaymentRecord:
    payment_id: str
    status: str
    amount: Decimal
    currency: str
    updated_at: datetime
    provider: str = registry.DEFAULT.name

    def as_json(self) -> dict[str, str]:
        return {
            "payment_id": self.payment_id,
            "status": self.status,
            "amount": f"{self.amount:.2f}",
            "currency": self.currency,
            "updated_at": self.updated_at.astimezone(UTC).isoformat(),
        }


class PaymentBook:
    """What the provider knows about each payment, plus failures to answer on demand."""

    def __init__(self) -> None:
        self.payments: dict[str, PaymentRecord] = {}
        self.failures: deque[int] = deque()  # statuses to answer (once each) before real ones
        self.hits = 0

    def set_status(
        self,
        payment_id: str,
        status: str,
        amount: Decimal,
        currency: str,
        updated_at: datetime | None = None,
        provider: str = registry.DEFAULT.name,
    ) -> None:
        self.payments[payment_id] = PaymentRecord(
            payment_id, status, amount, currency, updated_at or datetime.now(UTC), provider
        )

    def get(self, payment_id: str) -> PaymentRecord | None:
        return self.payments.get(payment_id)


BOOK = web.AppKey("book", PaymentBook)
API_KEY = web.AppKey("api_key", str)


def answerable() -> tuple[Provider, ...]:
    """The providers besides X-Hub whose API the simulator can play (`PaymentApi.route` and
    `answer` set)."""
    return tuple(
        p
        for p in registry.PROVIDERS
        if p.payment_api is not None
        and p.payment_api.route is not None
        and p.payment_api.answer is not None
    )


def create_app(
    book: PaymentBook, api_key: str, keys: Mapping[str, str] | None = None
) -> web.Application:
    """`api_key`: X-Hub's; `keys`: another provider's by name (default `api_key` too)."""
    if not api_key:
        raise ValueError("the simulator's API needs a non-empty key")
    app = web.Application()
    app[BOOK] = book
    app[API_KEY] = api_key
    app.router.add_get("/payments/{payment_id}", _get_payment)
    for provider in answerable():
        assert provider.payment_api is not None
        assert provider.payment_api.route is not None
        key = (keys or {}).get(provider.name) or api_key
        app.router.add_get(provider.payment_api.route, _provider_handler(provider, key))
    app.router.add_get("/health", _health)
    return app


def _refusal(request: web.Request, key: str) -> web.Response | None:
    """401 for a wrong key, a queued simulated failure, or None: answer."""
    book = request.app[BOOK]
    book.hits += 1
    given = request.headers.get("Authorization", "").encode()
    if not hmac.compare_digest(given, f"Bearer {key}".encode()):
        return web.json_response({"error": "unauthorized"}, status=401)
    if book.failures:
        return web.json_response({"error": "simulated failure"}, status=book.failures.popleft())
    return None


async def _get_payment(request: web.Request) -> web.Response:
    if (refused := _refusal(request, request.app[API_KEY])) is not None:
        return refused
    record = request.app[BOOK].get(request.match_info["payment_id"])
    if record is None or not registry.asks_xhub(record.provider):
        return web.json_response({"error": "not found"}, status=404)
    return web.json_response(record.as_json())


def _provider_handler(
    provider: Provider, key: str
) -> Callable[[web.Request], Awaitable[web.Response]]:
    api = provider.payment_api
    assert api is not None
    assert api.answer is not None
    answer = api.answer

    async def handle(request: web.Request) -> web.Response:
        if (refused := _refusal(request, key)) is not None:
            return refused
        record = request.app[BOOK].get(request.match_info["payment_id"])
        if record is None or record.provider != provider.name:
            return web.json_response({"error": "not found"}, status=404)  # the status decides
        payment = ProviderPayment(
            record.payment_id, record.status, record.amount, record.currency, record.updated_at
        )
        return web.Response(body=answer(payment), content_type="application/json")

    return handle


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "payments": len(request.app[BOOK].payments)})


async def start_api(
    book: PaymentBook,
    api_key: str,
    host: str = "127.0.0.1",
    port: int = 0,
    keys: Mapping[str, str] | None = None,
) -> tuple[web.AppRunner, str]:
    """Serve the API; return the runner (to clean up) and its base URL (port 0: any free one).
    `keys`: other providers' API keys by name (default `api_key`)."""
    runner = web.AppRunner(create_app(book, api_key, keys), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound: int = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"
