"""Background tasks that live as long as something else: started, then cancelled and awaited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait until it has unwound (its `finally` blocks have run)."""
    task.cancel()
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
