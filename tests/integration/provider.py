"""A stand-in for the provider's payments API (`GET /payments/{id}`), for the reconciler's
tests: statuses set by the test, failures on demand, every question recorded."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from aiohttp import web

API_KEY = "test-provider-key"


class FakeProvider:
    """The provider's payments API: statuses set by the test, failures on demand."""

    def __init__(self) -> None:
        self.url = ""  # the running server's, set by the fixture
        self.payments: dict[str, dict[str, str]] = {}
        self.failures: list[int] = []  # statuses to answer before the real one
        self.hits = 0
        self.asked: list[str] = []  # payment ids, once per request
        self.times: list[float] = []  # time.monotonic() of each request

    async def get(self, request: web.Request) -> web.Response:
        self.hits += 1
        self.times.append(time.monotonic())
        self.asked.append(request.match_info["payment_id"])
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return web.json_response({"error": "unauthorized"}, status=401)
        if self.failures:
            return web.json_response({"error": "boom"}, status=self.failures.pop(0))
        payment = self.payments.get(request.match_info["payment_id"])
        if payment is None:
            return web.json_response({"error": "not found"}, status=404)
        return web.json_response(payment)

    def set(self, payment_id: str, status: str, amount: str = "100.00") -> None:
        self.payments[payment_id] = {
            "payment_id": payment_id,
            "status": status,
            "amount": amount,
            "currency": "USD",
            "updated_at": datetime.now(UTC).isoformat(),
        }


def busiest_second(times: list[float]) -> int:
    """The most requests any one-second window saw."""
    most, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= 1.0:
            start += 1
        most = max(most, end - start + 1)
    return most
