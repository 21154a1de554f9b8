"""Background loops stop when cancelled, also when a library swallowed the cancellation during
a step (aio-pika does while it opens a channel): a shutdown never waits for ever."""

from __future__ import annotations

import asyncio

import pytest

from shared.process.tasks import keep_running


@pytest.mark.parametrize("swallowed_as", ["nothing", "an error"])
async def test_keep_running_stops_after_a_step_swallowed_its_cancellation(
    swallowed_as: str,
) -> None:
    steps = 0
    in_step = asyncio.Event()

    async def step() -> None:
        nonlocal steps
        steps += 1
        in_step.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:  # what a library does that swallows it
            if swallowed_as == "an error":
                raise ConnectionError("channel closed") from None

    loop = asyncio.create_task(keep_running(step, 3600, "step.failed"))
    await in_step.wait()
    loop.cancel()

    done, _ = await asyncio.wait({loop}, timeout=2)

    assert done == {loop}, "the loop slept on after its cancellation was swallowed"
    assert loop.cancelled()
    assert steps == 1


async def test_keep_running_goes_on_after_a_failed_step_and_its_own_timeouts() -> None:
    steps = 0
    third = asyncio.Event()

    async def step() -> None:
        nonlocal steps
        steps += 1
        if steps == 3:
            third.set()
        # A timeout of the step's own (withdrawn by asyncio.timeout) is no cancellation.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.001):
                await asyncio.sleep(1)
        raise ConnectionError("down")

    loop = asyncio.create_task(keep_running(step, 0.01, "step.failed"))
    await asyncio.wait_for(third.wait(), 2)
    assert not loop.done()
    loop.cancel()
    await asyncio.wait({loop}, timeout=2)
    assert loop.cancelled()
