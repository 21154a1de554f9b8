"""DLQ operations from the api process, each on a channel of its own, closed at the end (what
an operation that died half-way held goes back); a broker that is down is UnavailableError."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel
from aiohttp import web

from shared.amqp.broker import Broker
from shared.errors import UnavailableError

_OPEN_TIMEOUT_S = 5.0
# A close whose answer never comes is given up on: after an operation cancelled mid-RPC
# (the monitor's, at shutdown) aiormq can wait for one, seen in a task dump of a hung test
# teardown beside the swallowed cancellation that shared/process/tasks.keep_running now handles.
_CLOSE_TIMEOUT_S = 2.0

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
            with contextlib.suppress(aio_pika.exceptions.AMQPError, OSError, TimeoutError):
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await channel.close()


DLQ_ACCESS = web.AppKey("dlq_access", DlqAccess)
