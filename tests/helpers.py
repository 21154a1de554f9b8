"""Test helpers: signed X-Hub deliveries, draining queues, polling with a deadline."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aio_pika
import orjson

from shared.providers.xhub.events import status_changed
from shared.providers.xhub.signatures import signed_headers as xhub_headers

T = TypeVar("T")


def payment_event(
    payment_id: str | None = None, status: str = "paid", amount: str = "100.00", **extra: Any
) -> dict[str, Any]:
    payment_id = payment_id or f"pay_{uuid.uuid4().hex[:12]}"
    created_at = extra.pop("created_at", "2026-11-30T10:00:00Z")
    fields = {"external_id": f"ord_{payment_id}", **extra}
    return status_changed(payment_id, status, amount, "USD", created_at, **fields)


def signed_headers(
    body: bytes,
    secret: str,
    *,
    event_id: str | None = None,
    timestamp: int | None = None,
) -> dict[str, str]:
    now_s = time.time() if timestamp is None else timestamp
    return xhub_headers(secret.encode(), event_id or f"evt_{uuid.uuid4().hex}", body, now_s)


def delivery(
    payload: dict[str, Any],
    secret: str,
    *,
    event_id: str | None = None,
    timestamp: int | None = None,
) -> tuple[bytes, dict[str, str]]:
    body = orjson.dumps(payload)
    return body, signed_headers(body, secret, event_id=event_id, timestamp=timestamp)


async def drain(
    channel: aio_pika.abc.AbstractChannel, queue: str, *, settle_s: float = 0.3
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message now in `queue` (acked), waiting `settle_s` of quiet for stragglers."""
    q = await channel.get_queue(queue, ensure=False)
    messages = []
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < settle_s:
        message = await q.get(fail=False, no_ack=True)
        if message is None:
            await asyncio.sleep(0.02)
            continue
        messages.append(message)
        quiet_since = time.monotonic()
    return messages


async def eventually(
    probe: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.05,
) -> T:
    """Poll `probe` until `done(value)`; return the value, or fail with the last one."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s; last value: {value!r}")
        await asyncio.sleep(interval_s)
