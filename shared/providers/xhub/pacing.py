"""Pacing calls to the provider: one token bucket for every caller, and its Retry-After."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

_DELAY_SECONDS = re.compile(r"\d+(\.\d+)?")


class RateLimiter:
    """Token bucket shared by every caller of one client: `rate_per_s` on average, `burst` at once.

    Waiters queue on one lock, so concurrent callers are served in arrival order.
    """

    def __init__(self, rate_per_s: float, burst: int = 1) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("rate_per_s must be > 0 and burst >= 1")
        self._rate = rate_per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._updated = time.monotonic()
        self._held_until = 0.0
        self._lock = asyncio.Lock()

    def hold(self, seconds: float) -> None:
        """No token for anyone before `seconds` from now (the provider's Retry-After)."""
        self._held_until = max(self._held_until, time.monotonic() + seconds)

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._updated) * self._rate)
        self._updated = now

    async def acquire(self) -> None:
        async with self._lock:
            if (held := self._held_until - time.monotonic()) > 0:
                await asyncio.sleep(held)
            self._refill()
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self._rate)
                self._refill()
            # A timer firing a hair early leaves a tiny debt that the next wait pays back.
            self._tokens -= 1


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a `Retry-After` value (delay-seconds or HTTP date); None if unusable."""
    if value is None:
        return None
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # HTTP dates are always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())
