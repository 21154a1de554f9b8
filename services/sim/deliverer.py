"""The simulator's deliverer: encodes and signs each webhook as its provider does (the
registry's `Provider.encode` and `signed_headers`) and POSTs it to that provider's route, every
decision (X-Hub's retry ladders and breaker, for every provider)
from delivery_rules on a simulated clock (real seconds * time_scale); the 10 s HTTP timeout
of an attempt stays real time. When a merchant's circuit breaker closes, every delivery it
held goes at once (seed 000: "очередь разбирается целиком"), each attempt timed from then."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol

import aiohttp

from services.sim.delivery_rules import (
    HOLD_RETRY_S,
    Action,
    BreakerState,
    CircuitBreaker,
    DeliveryState,
    FailReason,
    classify,
    expired,
    is_money_event,
    next_action,
)
from shared.providers import registry
from shared.providers.base import Provider

TIMEOUT_S: Final = 10.0


class Sender(Protocol):
    """How an attempt goes on the wire: the answer's HTTP status, or None for a network error
    or no answer within the attempt's timeout, counted from the call."""

    async def __call__(self, url: str, headers: dict[str, str], body: bytes) -> int | None: ...


class Result(StrEnum):
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"
    LOST = "LOST"  # never sent on purpose: only the API knows (scenario's lost rate)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimWebhook:
    """One event: the id stays the same across attempts and duplicates. `payload` is the
    canonical event (X-Hub's body shape); `provider` names who sends it and so how it is
    encoded and signed on the wire."""

    event_id: str
    merchant_id: str
    payload: dict[str, Any]
    provider: str = registry.DEFAULT.name

    @property
    def event_type(self) -> str:
        return str(self.payload.get("event", ""))

    @property
    def status(self) -> str | None:
        status = self.payload.get("status")
        return str(status) if status is not None else None

    @property
    def payment_id(self) -> str:
        return str(self.payload.get("payment_id", ""))


@dataclass(slots=True, kw_only=True)
class DeliveryRecord:
    """What happened to one delivery (a duplicate is its own delivery of the same event id)."""

    event_id: str
    payment_id: str
    merchant_id: str
    event_type: str
    status: str | None
    provider: str = registry.DEFAULT.name
    copy: int = 0  # 0 the original, 1.. duplicates
    result: Result | None = None
    attempts: int = 0
    reason: FailReason | None = None
    http_statuses: list[int | None] = field(default_factory=list)  # None: network/timeout
    answered_at: list[float] = field(default_factory=list)  # wall clock of each answer
    breaker_holds: int = 0
    # Wall clock of the moment the merchant's breaker closed and let this delivery go with
    # the rest of its backlog; None if the breaker never held it.
    released_at: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "provider": self.provider,
            "payment_id": self.payment_id,
            "merchant_id": self.merchant_id,
            "event": self.event_type,
            "status": self.status,
            "copy": self.copy,
            "result": self.result.value if self.result else None,
            "attempts": self.attempts,
            "reason": self.reason.value if self.reason else None,
            "http_statuses": self.http_statuses,
            "breaker_holds": self.breaker_holds,
            "released_at": self.released_at,
        }


@dataclass(frozen=True, slots=True)
class Release:
    """A merchant's breaker closed (its probe passed) and let its backlog go at once."""

    merchant_id: str
    at: float  # wall clock


@dataclass(slots=True)
class _Backlog:
    """The deliveries one merchant's open breaker holds, released together when it closes.

    A set of one future per waiting delivery, not an asyncio.Event: a waiter that times out
    leaves an Event's deque by a linear search, and 18,000 held deliveries retrying at the
    same moment made that seconds of the simulator's CPU."""

    waiting: set[asyncio.Future[None]] = field(default_factory=set)
    released_at: float | None = None  # wall clock

    async def wait(self, timeout_s: float) -> None:
        """Until the breaker closes, or `timeout_s` (real seconds) has passed."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        self.waiting.add(woken)
        timer = loop.call_later(timeout_s, _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()
            self.waiting.discard(woken)

    def release(self, at: float) -> None:
        self.released_at = at
        for woken in self.waiting:
            _wake(woken)


def _playable(name: str) -> Provider:
    """The registry's provider `name`, which must offer an encoder and a signer."""
    provider = registry.BY_NAME.get(name)
    if provider is None or provider.encode is None or provider.signed_headers is None:
        raise ValueError(f"the simulator cannot send as provider {name!r}")
    return provider


def playable_providers() -> tuple[str, ...]:
    """The providers the simulator (and `payhooks send`) can play: those whose adapter offers
    `encode` and `signed_headers`."""
    return tuple(
        p.name for p in registry.PROVIDERS if p.encode is not None and p.signed_headers is not None
    )


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Deliverer:
    """Delivers webhooks concurrently: at most `concurrency` requests in flight, except the
    backlog a closing breaker releases, which goes at once. `breakers_open`: every merchant's
    breaker starts open (as after an outage of the endpoint), so every delivery is held until
    its merchant's probe passes after the 5-minute pause, and then delivered at once.

    `secret` signs X-Hub's webhooks; `keys` holds the key (as the provider's parse_secrets
    gives it) of every other provider the webhooks name."""

    def __init__(
        self,
        ingest_url: str,
        secret: bytes,
        *,
        keys: Mapping[str, bytes] | None = None,
        time_scale: float = 1.0,
        timeout_s: float = TIMEOUT_S,
        concurrency: int = 10,
        wall_clock: Callable[[], float] = time.time,
        breakers_open: bool = False,
        sender: Sender | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be greater than 0")
        if concurrency < 1:
            raise ValueError("concurrency must be 1 or more")
        self.ingest_url = ingest_url.rstrip("/")
        self.url = self.ingest_url + registry.DEFAULT.webhook_path
        self.keys = {registry.DEFAULT.name: secret, **(keys or {})}
        self.time_scale = time_scale
        self.timeout_s = timeout_s
        self.breakers: dict[str, CircuitBreaker] = {}
        self.releases: list[Release] = []
        self._breakers_open = breakers_open
        # None: aiohttp's client, timeout_s per attempt. A load generator sharing the cores of
        # what it drives passes a leaner one (bench/raw_http.py's OneShotSender).
        self._sender = sender
        self._backlogs: dict[str, _Backlog] = {}
        self._wall_clock = wall_clock
        self._semaphore = asyncio.Semaphore(concurrency)
        self._start = time.monotonic()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Deliverer:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            connector=aiohttp.TCPConnector(limit=0),
        )
        self._start = time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def now(self) -> float:
        """The simulated clock the rules see, in seconds."""
        return (time.monotonic() - self._start) * self.time_scale

    async def _sleep_until(self, at: float) -> None:
        await asyncio.sleep(max(0.0, (at - self.now()) / self.time_scale))

    def breaker(self, merchant_id: str) -> CircuitBreaker:
        breaker = self.breakers.get(merchant_id)
        if breaker is None:
            breaker = self.breakers[merchant_id] = CircuitBreaker()
            if self._breakers_open:
                breaker.trip(self.now())
        return breaker

    async def _hold(self, merchant_id: str, breaker: CircuitBreaker) -> tuple[int, _Backlog]:
        """Wait as a delivery the breaker holds: ~30 s and try again, or until the breaker
        closes. An attempt while it is open (before its pause ends) would be refused, so
        those retries are slept through at once; how many were, and the backlog waited in."""
        retries = 1
        if (reopens_at := breaker.reopens_at) is not None:
            retries = max(1, math.ceil((reopens_at - self.now()) / HOLD_RETRY_S))
        backlog = self._backlogs.setdefault(merchant_id, _Backlog())
        await backlog.wait(retries * HOLD_RETRY_S / self.time_scale)
        return retries, backlog

    def _release(self, merchant_id: str) -> None:
        """The merchant's breaker closed: everything it held goes now."""
        backlog = self._backlogs.pop(merchant_id, None)
        if backlog is not None:
            at = self._wall_clock()
            backlog.release(at)
            self.releases.append(Release(merchant_id, at))

    async def deliver(self, webhook: SimWebhook, copy: int = 0) -> DeliveryRecord:
        """Run one delivery to its end (DELIVERED or FAILED), as long as that takes."""
        record = DeliveryRecord(
            event_id=webhook.event_id,
            payment_id=webhook.payment_id,
            merchant_id=webhook.merchant_id,
            event_type=webhook.event_type,
            status=webhook.status,
            provider=webhook.provider,
            copy=copy,
        )
        provider = _playable(webhook.provider)
        assert provider.encode is not None
        body = provider.encode(webhook.event_id, webhook.payload)
        state = DeliveryState(
            created_at=self.now(), money=is_money_event(webhook.event_type, webhook.status)
        )
        breaker = self.breaker(webhook.merchant_id)
        released = False  # this attempt is part of a released backlog
        while True:
            if not breaker.allow(self.now()):
                retries, backlog = await self._hold(webhook.merchant_id, breaker)
                record.breaker_holds += retries
                if backlog.released_at is not None:
                    record.released_at, released = backlog.released_at, True
                reason = expired(state, self.now())
                if reason is not None:
                    record.result, record.reason = Result.FAILED, reason
                    return record
                continue
            code = await self._attempt(provider, webhook.event_id, body, at_once=released)
            released = False
            record.http_statuses.append(code)
            record.answered_at.append(self._wall_clock())
            outcome = classify(code)
            probing = breaker.state is BreakerState.HALF_OPEN
            breaker.record(self.now(), outcome)
            if probing and breaker.state is BreakerState.CLOSED:
                self._release(webhook.merchant_id)
            decision = next_action(state, outcome, self.now())
            state = decision.state
            record.attempts = state.attempts
            if decision.action is Action.DELIVERED:
                record.result = Result.DELIVERED
                return record
            if decision.action is Action.FAILED:
                record.result, record.reason = Result.FAILED, decision.reason
                return record
            assert decision.at is not None
            await self._sleep_until(decision.at)

    async def _attempt(
        self, provider: Provider, event_id: str, body: bytes, *, at_once: bool = False
    ) -> int | None:
        """One signed POST; its HTTP status, or None for a network error or timeout.
        `at_once`: part of a released backlog, not held back by the concurrency limit."""
        async with contextlib.nullcontext() if at_once else self._semaphore:
            return await self._post(provider, event_id, body)

    async def _post(self, provider: Provider, event_id: str, body: bytes) -> int | None:
        if self._session is None:
            raise RuntimeError("use the Deliverer as an async context manager")
        key = self.keys.get(provider.name)
        if key is None:
            raise ValueError(f"the deliverer has no key for provider {provider.name!r}")
        assert provider.signed_headers is not None
        headers = provider.signed_headers(key, event_id, body, self._wall_clock())
        url = self.ingest_url + provider.webhook_path
        if self._sender is not None:
            return await self._sender(url, headers, body)
        try:
            async with self._session.post(url, data=body, headers=headers) as response:
                await response.read()
                return response.status
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None
