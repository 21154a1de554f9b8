"""An operator's hold on shared.worker.runtime.Worker itself (real RabbitMQ): the messages it
has in hand when the hold comes are kept, unacknowledged, and processed first when it is
released, so nothing is reordered; held longer than `hold_s` they go back to the queue (its
end) and are still processed once each."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel

from shared.amqp.topology import Topology
from shared.config import Settings
from shared.worker.batches import Delivery, Result
from shared.worker.pause import Hold
from tests.helpers import eventually
from tests.integration.system import depths
from tests.integration.test_worker_message_id import running_worker

HOLD = Hold("alice", "test", dt.datetime.now(dt.UTC))
COUNT = 20


class Recorder:
    """A handler that records the message ids it is given, and can be made to wait."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def __call__(self, deliveries: Sequence[Delivery]) -> list[Result]:
        self.entered.set()
        await self.gate.wait()
        self.seen.extend(d.message_id for d in deliveries)
        return ["ok"] * len(deliveries)


async def publish(channel: AbstractChannel, queue: str) -> list[str]:
    ids = [f"m{n:02d}-{uuid.uuid4().hex[:6]}" for n in range(COUNT)]
    for message_id in ids:
        await channel.default_exchange.publish(
            aio_pika.Message(b"{}", message_id=message_id), routing_key=queue
        )
    return ids


async def test_a_hold_keeps_what_the_worker_has_in_hand_in_order(
    settings: Settings, topology: Topology, channel: AbstractChannel
) -> None:
    recorder = Recorder()
    recorder.gate.clear()
    queue = topology.work["orders"].name
    batching: dict[str, Any] = {"batch_size": 2, "batchers": 1, "linger_s": 0.0, "hold_s": 60.0}
    async with running_worker(settings, topology, channel, lambda _: recorder, **batching) as w:
        ids = await publish(channel, queue)
        await recorder.entered.wait()  # a batch in hand, more waiting behind it
        await w.pause.hold(HOLD)
        recorder.gate.set()  # the batch in hand finishes; the rest is kept
        done = await eventually(lambda: asyncio.sleep(0, len(recorder.seen)), lambda n: n > 0)
        await asyncio.sleep(0.5)
        assert len(recorder.seen) == done
        # Nothing more is delivered (a live consumer would take one: its batch freed a slot).
        ready = (await depths(channel, [queue]))[queue]
        await asyncio.sleep(1.0)
        assert (await depths(channel, [queue]))[queue] == ready
        assert 0 < COUNT - done - ready <= 4  # kept in hand: at most the prefetch
        await w.pause.release()
        await eventually(lambda: asyncio.sleep(0, len(recorder.seen)), lambda n: n == COUNT)
    assert recorder.seen == ids


async def test_a_hold_longer_than_hold_s_hands_back_and_loses_nothing(
    settings: Settings, topology: Topology, channel: AbstractChannel
) -> None:
    recorder = Recorder()
    recorder.gate.clear()
    queue = topology.work["orders"].name
    batching: dict[str, Any] = {"batch_size": 2, "batchers": 1, "linger_s": 0.0, "hold_s": 0.5}
    async with running_worker(settings, topology, channel, lambda _: recorder, **batching) as w:
        ids = await publish(channel, queue)
        await recorder.entered.wait()
        await w.pause.hold(HOLD)
        recorder.gate.set()
        done = await eventually(lambda: asyncio.sleep(0, len(recorder.seen)), lambda n: n > 0)
        # After hold_s what it kept is back in the queue: all but the batch it finished.
        await eventually(lambda: depths(channel, [queue]), lambda d: d[queue] == COUNT - done)
        await w.pause.release()
        await eventually(lambda: asyncio.sleep(0, len(recorder.seen)), lambda n: n == COUNT)
    assert sorted(recorder.seen) == sorted(ids)
    assert len(set(recorder.seen)) == COUNT
