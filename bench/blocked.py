"""The connection.blocked phase of `bench.overload`: steady webhooks at an ingest while
RabbitMQ's memory alarm blocks its publishers for a few seconds, timed from the outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import aiohttp

from bench.load import Delivery
from bench.raw_http import REQUEST_TIMEOUT_S
from tests.rabbitmq_alarm import memory_alarm


@dataclass(slots=True)
class BlockedRun:
    # Wall-clock seconds (time.time()) of each answer: sent, answered, status (0: none).
    answers: list[tuple[float, float, int]] = field(default_factory=list)
    alarm_requested: float = 0.0  # `rabbitmqctl set_vm_memory_high_watermark` started
    alarm_set: float = 0.0  # ...and returned: the alarm is on
    clear_requested: float = 0.0  # putting the watermark back started
    alarm_cleared: float = 0.0  # ...and returned
    readiness: str = ""  # /readyz while blocked

    def first_after(self, at: float, status: int) -> float | None:
        """Seconds from `at` to the first answer with `status` that came after it."""
        times = [done for _, done, s in self.answers if s == status and done >= at]
        return min(times) - at if times else None

    def during_block(self) -> list[tuple[float, float, int]]:
        """Answers to webhooks sent while the alarm was surely on."""
        return [a for a in self.answers if self.alarm_set <= a[0] <= self.clear_requested]


async def run_blocked(
    url: str, deliveries: list[Delivery], rate: float, block_at_s: float, block_for_s: float
) -> BlockedRun:
    """Send `deliveries` at `rate`/s; after `block_at_s` set off the memory alarm for
    `block_for_s`. Ends once every delivery was answered."""
    run = BlockedRun()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(headers: dict[str, str], body: bytes) -> None:
            sent = time.time()
            status = 0
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    status = response.status
            run.answers.append((sent, time.time(), status))

        async def send() -> None:
            started = time.monotonic()
            async with asyncio.TaskGroup() as group:
                for i, (headers, body) in enumerate(deliveries):
                    await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
                    group.create_task(one(headers, body))

        async def block() -> None:
            await asyncio.sleep(block_at_s)
            alarm = contextlib.ExitStack()
            run.alarm_requested = time.time()
            try:
                await asyncio.to_thread(alarm.enter_context, memory_alarm())
                run.alarm_set = time.time()
                await asyncio.sleep(block_for_s / 2)
                readyz = url.replace("/webhooks/xhub", "/readyz")
                async with session.get(readyz) as response:
                    run.readiness = f"{response.status} {await response.text()}"
                await asyncio.sleep(block_for_s / 2)
            finally:
                run.clear_requested = time.time()
                await asyncio.to_thread(alarm.close)
                run.alarm_cleared = time.time()

        await asyncio.gather(send(), block())
    return run
