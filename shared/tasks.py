"""Background tasks that live as long as something else: started, then cancelled and awaited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import structlog

log = structlog.get_logger(__name__)


async def cancel_and_wait(task: asyncio.Task[Any], *, again_after_s: float | None = None) -> None:
    """Cancel `task` and wait until it has unwound (its `finally` blocks have run).

    `again_after_s`: cancel again at that interval while it runs on, for tasks inside
    libraries known to swallow a cancellation (aio-pika/aiormq while a connection opens).
    A cancellation of the caller itself is not swallowed here.
    """
    task.cancel()
    while again_after_s is not None and not task.done():
        await asyncio.wait({task}, timeout=again_after_s)
        if not task.done():
            log.info("task.cancelled_again", task=task.get_name())
            task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


@contextlib.asynccontextmanager
async def background(coro: Coroutine[Any, Any, Any], name: str) -> AsyncIterator[asyncio.Task[Any]]:
    """Run `coro` as a task for the duration of the `async with` block."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        await cancel_and_wait(task)
