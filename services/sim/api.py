"""The simulator's fake X-Hub payments API: `GET /payments/{id}` with a Bearer key, answering
from the simulator's PaymentBook in the shape shared/providers/xhub/payments.py reads."""

from __future__ import annotations

import hmac
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from aiohttp import web


@dataclass(frozen=True, slots=True)
class PaymentRecord:
    payment_id: str
    status: str
    amount: Decimal
    currency: str
    updated_at: datetime

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
    ) -> None:
        self.payments[payment_id] = PaymentRecord(
            payment_id, status, amount, currency, updated_at or datetime.now(UTC)
        )

    def get(self, payment_id: str) -> PaymentRecord | None:
        return self.payments.get(payment_id)


BOOK = web.AppKey("book", PaymentBook)
API_KEY = web.AppKey("api_key", str)


def create_app(book: PaymentBook, api_key: str) -> web.Application:
    if not api_key:
        raise ValueError("the simulator's API needs a non-empty key")
    app = web.Application()
    app[BOOK] = book
    app[API_KEY] = api_key
    app.router.add_get("/payments/{payment_id}", _get_payment)
    app.router.add_get("/health", _health)
    return app


async def _get_payment(request: web.Request) -> web.Response:
    book = request.app[BOOK]
    book.hits += 1
    given = request.headers.get("Authorization", "").encode()
    expected = f"Bearer {request.app[API_KEY]}".encode()
    if not hmac.compare_digest(given, expected):
        return web.json_response({"error": "unauthorized"}, status=401)
    if book.failures:
        return web.json_response({"error": "simulated failure"}, status=book.failures.popleft())
    record = book.get(request.match_info["payment_id"])
    if record is None:
        return web.json_response({"error": "not found"}, status=404)
    return web.json_response(record.as_json())


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "payments": len(request.app[BOOK].payments)})


async def start_api(
    book: PaymentBook, api_key: str, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve the API; return the runner (to clean up) and its base URL (port 0: any free one)."""
    runner = web.AppRunner(create_app(book, api_key), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound: int = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"
