"""One quorum queue's leader under load: several publishers and one consumer on a single
quorum queue, for bench.copies.

A quorum queue has one leader, one Erlang process on one node, through which every publish,
delivery and ack of that queue passes; its replicas on the other nodes follow its log. This
drives one queue as hard as the machine allows: PUBLISHERS processes publishing persistent
messages with confirms (WINDOW outstanding each) to the leader's node, two consumers acking
in batches, for SECONDS. It reports messages/s through the queue and the CPU per message of
every server process group (the leader's node apart from its followers'), from which
docs/high-availability.md estimates where one queue's leader becomes the limit. The queue
(`<prefix>leader`) is deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

import aio_pika
import uvloop

from bench.backing import first_node
from bench.observe import CpuGroups, Servers

BODY = b"x" * 512  # about a payhooks payment message
WINDOW = 200
PREFETCH = 1000
ACK_EVERY = 100


@dataclass(frozen=True, slots=True)
class Measured:
    published: int
    consumed: int
    seconds: float
    cpu_pct: dict[str, float]  # % of one core per group over the window

    @property
    def messages(self) -> float:
        """Messages through the queue: the mean of those published (and confirmed) and those
        delivered (and acked), as each costs the leader a publish and a delivery."""
        return (self.published + self.consumed) / 2

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds

    def us_per_message(self, group: str) -> float:
        return self.cpu_pct.get(group, 0.0) * 10_000 * self.seconds / max(1.0, self.messages)


async def _publish(url: str, queue: str, seconds: float, barrier: Any) -> int:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        barrier.wait(timeout=60)
        deadline, sent = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=queue,
                    )
                    for _ in range(WINDOW)
                )
            )
            sent += WINDOW
        return sent


async def _consume(url: str, queue: str, seconds: float, barrier: Any) -> int:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        source = await channel.get_queue(queue, ensure=False)
        barrier.wait(timeout=60)
        deadline, received = time.monotonic() + seconds, 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds + 1), source.iterator() as messages:
                async for message in messages:
                    received += 1
                    if received % ACK_EVERY == 0 or time.monotonic() > deadline:
                        await message.ack(multiple=True)
                    if time.monotonic() > deadline:
                        break
        return received


def _process(role: str, url: str, queue: str, seconds: float, barrier: Any, out: Any) -> None:
    work = _publish if role == "publish" else _consume
    out.put((role, uvloop.run(work(url, queue, seconds, barrier))))


async def _declare(url: str, queue: str, delete: bool = False) -> None:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel()
        if delete:
            await channel.queue_delete(queue)
        else:
            await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})


def declare(amqp_url: str, queue: str) -> None:
    asyncio.run(_declare(first_node(amqp_url), queue))


def measure(
    url: str,
    queue: str,
    seconds: float,
    publishers: int,
    servers: Servers | None,
    consumers: int = 2,
) -> Measured:
    """Drive the (declared) quorum `queue` through the node at `url`; the queue is deleted
    at the end."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(publishers + consumers + 1)
    out = context.Queue()
    roles = ["consume"] * consumers + ["publish"] * publishers
    processes = [
        context.Process(
            target=_process, args=(role, url, queue, seconds, barrier, out), daemon=True
        )
        for role in roles
    ]
    try:
        for process in processes:
            process.start()
        groups = {p.pid: "clients" for p in processes if p.pid is not None}
        cpu = CpuGroups(groups, [], "", servers)
        barrier.wait(timeout=60)
        before = cpu.snapshot()
        results = [out.get(timeout=seconds + 60) for _ in processes]
        after = cpu.snapshot()
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
        asyncio.run(_declare(url, queue, delete=True))
    return Measured(
        published=sum(n for role, n in results if role == "publish"),
        consumed=sum(n for role, n in results if role == "consume"),
        seconds=after[0] - before[0],
        cpu_pct=CpuGroups.pct(before, after),
    )
