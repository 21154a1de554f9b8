"""DLQ operations from the api process: each on a channel of its own.

The channel is closed at the end, so if the operation dies half-way RabbitMQ hands back
whatever it still held. One reader at a time per DLQ, across requests, the monitor and the
other api replicas, is shared/dlq.py's lock. A broker that is down or goes away mid-way is
UnavailableError (503).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel
from aiohttp import web

from shared.broker import Broker
from shared.errors import UnavailableError

_OPEN_TIMEOUT_S = 5.0

# Errors that mean "RabbitMQ is not there" rather than "this operation is wrong".
_GONE = (aiormq.exceptions.AMQPConnectionError, aiormq.exceptions.ChannelInvalidStateError)


class DlqAccess:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.topology = broker.topology

    @asynccontextmanager
    async def channel(self) -> AsyncIterator[AbstractChannel]:
        try:
            async with asyncio.timeout(_OPEN_TIMEOUT_S):
                channel = await self.broker.connection.channel(
                    publisher_confirms=True, on_return_raises=True
                )
        except (TimeoutError, OSError, aio_pika.exceptions.AMQPError) as e:
            raise UnavailableError(f"RabbitMQ is not available: {e!r}") from e
        try:
            yield channel
        except (*_GONE, ConnectionError) as e:
            raise UnavailableError(f"RabbitMQ went away: {e!r}") from e
        finally:
            with contextlib.suppress(aio_pika.exceptions.AMQPError, OSError):
                await channel.close()


DLQ_ACCESS = web.AppKey("dlq_access", DlqAccess)
