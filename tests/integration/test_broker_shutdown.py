"""A service stopped while it is still connecting to RabbitMQ stops: a cancellation that
aio-pika swallows half-way through opening the connection must not leave the connect task
running (a shutdown that never ended was seen as a 60 s test teardown timeout)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from shared.amqp.broker import Broker
from shared.amqp.topology import Topology
from tests.conftest import TEST_AMQP_URL

# Each close must end well inside this; before the fix about one in forty hung for ever.
CLOSE_BOUND_S = 8.0


async def test_a_broker_closed_at_any_moment_of_its_connect_stops(
    amqp: Any, topology: Topology
) -> None:
    rng = random.Random(7)
    for _ in range(40):
        broker = Broker(TEST_AMQP_URL, topology)
        await broker.start()
        await asyncio.sleep(rng.uniform(0.0, 0.05))  # somewhere in connect, channel, declare
        async with asyncio.timeout(CLOSE_BOUND_S):
            await broker.close()
        connecting = [t for t in asyncio.all_tasks() if t.get_name() == "broker-connect"]
        assert connecting == []
