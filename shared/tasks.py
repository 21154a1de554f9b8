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
    """
    task.cancel()
    while again_after_s is not None and not task.done():
        await asyncio.wait({task}, timeout=again_after_s)
        if not task.done():
            log.info("task.cancelled_again", task=task.get_name())
            task.cancel()
    # Also when the caller itself was cancelled: a shutdown runs its cleanup inside a task
    # aiohttp has cancelled, and a CancelledError out of a cleanup context fails the exit code.
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def background(coro: Coroutine[Any, Any, Any], name: str) -> AsyncIterator[asyncio.Task[Any]]:
    """Run `coro` as a task for the duration of the `async with` block."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        await cancel_and_wait(task)
