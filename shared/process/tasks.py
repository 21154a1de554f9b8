"""Background tasks that live as long as something else: started, then cancelled and awaited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
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


async def keep_running(
    step: Callable[[], Awaitable[object]],
    interval_s: float,
    failed_event: str,
    wake: asyncio.Event | None = None,
) -> None:
    """Run `step` for ever: again `interval_s` after each run, or as soon as `wake` is set.
    A step that raises is logged (`failed_event`) and tried again next time: the loop
    outlives every outage of what the step uses, but not a cancellation, also one a library
    swallowed during the step."""
    while True:
        if wake is not None:
            wake.clear()  # before the step: a wake-up during it runs the next one at once
        try:
            await step()
        except Exception as e:
            log.warning(failed_event, error=repr(e))
        if _cancel_swallowed():
            # aio-pika can swallow a CancelledError while it opens a channel (and sometimes turn
            # it into an error the step reports): the loop would sleep on, and the shutdown that
            # cancelled it would wait for ever (the api's monitor, seen in tests).
            raise asyncio.CancelledError
        if wake is None:
            await asyncio.sleep(interval_s)
            continue
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await wake.wait()


def _cancel_swallowed() -> bool:
    """The current task was asked to stop and the request never came out as CancelledError
    (asyncio.timeout withdraws its own requests, so these are someone else's)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
