"""DLQ operations from the api process: one at a time, each on a channel of its own.

A DLQ operation holds the queue's messages unacknowledged while it works; two at once in one
process would each see part of the queue. The channel is closed at the end, so if the
operation dies half-way RabbitMQ hands back whatever it still held.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aio_pika.abc import AbstractChannel

from shared.broker import Broker


class DlqAccess:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.topology = broker.topology
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def channel(self) -> AsyncIterator[AbstractChannel]:
        async with self._lock:
            channel = await self.broker.connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
            try:
                yield channel
            finally:
                await channel.close()
