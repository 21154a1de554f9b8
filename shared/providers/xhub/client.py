"""X-Hub API client: `GET /payments/{id}` with timeouts, a shared rate limit, retries and
metrics; 401/403, 404 and bad answers are PermanentErrors, 5xx, 429, network errors and
timeouts are retried, then raised as a TransientError. Another provider's payment API (its
`PaymentApi`: Stripe's) is asked through the same client with its own path and reading."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Self
from urllib.parse import quote

import aiohttp
import structlog
from yarl import URL

from shared.config import ConfigError, Settings
from shared.errors import PermanentError, TransientError
from shared.metrics import ProviderMetrics
from shared.providers.base import PaymentApi
from shared.providers.xhub import PROVIDER
from shared.providers.xhub.pacing import RateLimiter, parse_retry_after
from shared.providers.xhub.payments import ProviderPayment, ProviderResponseError, parse_payment


def _xhub_path(payment_id: str) -> str:
    return f"/payments/{quote(payment_id, safe='')}"


log = structlog.get_logger(__name__)

_RETRIED_OUTCOMES = frozenset({"server_error", "rate_limited", "network_error", "timeout"})


class ProviderAuthError(PermanentError):
    """The provider refused our credentials (401/403)."""


class PaymentNotFoundError(PermanentError):
    """The provider does not know the payment (404)."""

    def __init__(self, payment_id: str) -> None:
        super().__init__(f"provider has no payment {payment_id!r} (404)")
        self.payment_id = payment_id


class ProviderUnavailableError(TransientError):
    """The provider stayed down, slow or rate-limiting through every attempt we could afford."""

    def __init__(self, message: str, *, attempts: int, last_outcome: str | None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.last_outcome = last_outcome


@dataclass(frozen=True, slots=True)
class ProviderPolicy:
    """Timeouts, retries and rate limit; one `get_payment` never outlives `deadline_s`."""

    connect_timeout_s: float = 3.0
    read_timeout_s: float = 10.0
    max_attempts: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 60.0
    deadline_s: float = 30.0
    rate_per_s: float = 10.0
    burst: int = 1

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if not getattr(self, name) > 0:
                raise ValueError(f"ProviderPolicy.{name} must be greater than 0")


@dataclass(frozen=True, slots=True)
class _Failure:
    outcome: str
    detail: str
    retry_after_s: float | None = None
    error: BaseException | None = None


class ProviderClient:
    """One aiohttp session to the provider; use `async with` or `start()` / `close()`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        metrics: ProviderMetrics,
        policy: ProviderPolicy | None = None,
        rng: random.Random | None = None,
        path: Callable[[str], str] = _xhub_path,
        parse: Callable[[bytes, str], ProviderPayment] = parse_payment,
        headers: Mapping[str, str] | None = None,
        variables: tuple[str, str] = ("XHUB_API_URL", "XHUB_API_KEY"),
        provider: str = PROVIDER,
    ) -> None:
        url_variable, key_variable = variables
        url = URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"{url_variable} must be an absolute http(s) URL")
        if not api_key.strip():
            raise ValueError(f"{key_variable} must not be empty")
        self._base_url = base_url.rstrip("/")
        self._shown_url = str(url.with_user(None))  # never show credentials in a URL either
        self._headers = {
            **(headers or {}),
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
        }
        self._path, self._parse, self._key_variable = path, parse, key_variable
        self.metrics, self.provider = metrics, provider
        metrics.track(provider)
        self.policy = policy or ProviderPolicy()
        self._limiter = RateLimiter(self.policy.rate_per_s, self.policy.burst)
        self._rng = rng or random.Random()
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, metrics: ProviderMetrics, policy: ProviderPolicy | None = None
    ) -> ProviderClient:
        url, key = settings.xhub_api_url, settings.xhub_api_key
        if url is None or key is None:
            missing = [name for name, v in (("XHUB_API_KEY", key), ("XHUB_API_URL", url)) if not v]
            raise ConfigError(
                "invalid configuration: " + "; ".join(f"{name} is required" for name in missing)
            )
        return cls(
            url,
            key,
            metrics=metrics,
            policy=policy or ProviderPolicy(rate_per_s=settings.xhub_api_rate),
        )

    @classmethod
    def for_api(
        cls, provider: str, api: PaymentApi, url: str, key: str, metrics: ProviderMetrics
    ) -> ProviderClient:
        """A client of another provider's payment API (its `PaymentApi`, as configured)."""
        return cls(
            url,
            key,
            metrics=metrics,
            policy=ProviderPolicy(rate_per_s=api.rate_per_s),
            path=api.path,
            parse=api.parse,
            headers=api.headers,
            variables=(api.url_variable, api.key_variable),
            provider=provider,
        )

    def __repr__(self) -> str:
        return f"ProviderClient(base_url={self._shown_url!r}, policy={self.policy!r})"

    async def start(self) -> None:
        if self._session is not None:
            raise RuntimeError("ProviderClient is already started")
        self._session = aiohttp.ClientSession(timeout=self._timeout(None))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def get_payment(self, payment_id: str) -> ProviderPayment:
        """The provider's view of one payment, retried within the policy's attempts and deadline."""
        if self._session is None:
            raise RuntimeError("ProviderClient is not started")
        if not payment_id:
            raise ValueError("payment_id must not be empty")
        url = URL(f"{self._base_url}{self._path(payment_id)}", encoded=True)
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.policy.deadline_s
        failure: _Failure | None = None
        attempt = 0
        while attempt < self.policy.max_attempts:
            try:
                async with asyncio.timeout_at(deadline):
                    await self._limiter.acquire()
            except TimeoutError:
                break
            attempt += 1
            result = await self._attempt(self._session, url, payment_id, deadline)
            if isinstance(result, ProviderPayment):
                return result
            failure = result
            delay = self._delay(attempt, failure.retry_after_s)
            if failure.retry_after_s is not None:
                # The provider asked everyone to wait: later calls (other payments) too.
                self._limiter.hold(delay)
            retrying = attempt < self.policy.max_attempts and loop.time() + delay < deadline
            log.info(
                "provider.request_failed",
                payment_id=payment_id,
                attempt=attempt,
                outcome=failure.outcome,
                detail=failure.detail,
                retry_in_s=round(delay, 3) if retrying else None,
            )
            if not retrying:
                break
            await asyncio.sleep(delay)
        last = f"{failure.outcome} ({failure.detail})" if failure else "rate limit wait"
        raise ProviderUnavailableError(
            f"provider API unavailable for payment {payment_id!r}: {attempt} attempt(s) in "
            f"{loop.time() - started:.1f}s, last: {last}",
            attempts=attempt,
            last_outcome=failure.outcome if failure else None,
        ) from (failure.error if failure else None)

    def _timeout(self, remaining_s: float | None) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=remaining_s,
            connect=self.policy.connect_timeout_s,
            sock_connect=self.policy.connect_timeout_s,
            sock_read=self.policy.read_timeout_s,
        )

    def _delay(self, attempt: int, retry_after_s: float | None) -> float:
        if retry_after_s is not None:
            return min(retry_after_s, self.policy.retry_after_max_s)
        # Full jitter (AWS "Exponential Backoff and Jitter"): spreads replicas' retries apart.
        ceiling = min(self.policy.backoff_max_s, self.policy.backoff_base_s * 2 ** (attempt - 1))
        return self._rng.uniform(0, ceiling)

    async def _attempt(
        self, session: aiohttp.ClientSession, url: URL, payment_id: str, deadline: float
    ) -> ProviderPayment | _Failure:
        """One HTTP request: a payment, a retryable failure, or a raised PermanentError."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with session.get(
                url,
                headers=self._headers,
                timeout=self._timeout(max(deadline - started, 0.001)),
                allow_redirects=False,  # a redirect must not carry our bearer key elsewhere
            ) as response:
                status = response.status
                body = await response.read()
                retry_after = response.headers.get("Retry-After")
        except TimeoutError as e:  # aiohttp's connect and read timeouts subclass TimeoutError
            self.metrics.observe(self.provider, "timeout", loop.time() - started)
            return _Failure("timeout", type(e).__name__, error=e)
        except aiohttp.ClientError as e:
            self.metrics.observe(self.provider, "network_error", loop.time() - started)
            return _Failure("network_error", type(e).__name__, error=e)
        duration_s = loop.time() - started

        if status == 200:
            try:
                payment = self._parse(body, payment_id)
            except ProviderResponseError:
                self.metrics.observe(self.provider, "invalid_response", duration_s)
                raise
            self.metrics.observe(self.provider, "ok", duration_s)
            return payment
        if status == 429 or status >= 500:
            outcome = "rate_limited" if status == 429 else "server_error"
            self.metrics.observe(self.provider, outcome, duration_s)
            wait_s = parse_retry_after(retry_after, datetime.now(UTC))
            return _Failure(outcome, f"HTTP {status}", retry_after_s=wait_s)
        if status in (401, 403):
            self.metrics.observe(self.provider, "unauthorized", duration_s)
            raise ProviderAuthError(
                f"provider refused our credentials (HTTP {status}): check {self._key_variable}"
            )
        if status == 404:
            self.metrics.observe(self.provider, "not_found", duration_s)
            raise PaymentNotFoundError(payment_id)
        self.metrics.observe(self.provider, "unexpected_status", duration_s)
        raise ProviderResponseError(
            f"provider answered HTTP {status} for payment {payment_id!r}; expected 200"
        )
