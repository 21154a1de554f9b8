"""RabbitMQ connection for a service's lifetime and confirmed, mandatory publishing.

The first connection is made in the background, so a service starts (and answers 503 or
reports not-ready) while the broker is down; after that aio-pika's robust connection
reconnects and re-declares by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import aio_pika
import structlog
from aio_pika.abc import (
    AbstractExchange,
    AbstractRobustChannel,
    AbstractRobustConnection,
    DeliveryMode,
)
from aiohttp import web

from shared.errors import UnavailableError
from shared.topology import Topology, declare
from shared.web import READINESS_CHECKS

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_S = 5.0
_RECONNECT_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish on the events exchange."""

    routing_key: str
    body: bytes
    message_id: str
    type: str
    headers: dict[str, str]


def to_message(outgoing: Outgoing) -> aio_pika.Message:
    return aio_pika.Message(
        outgoing.body,
        message_id=outgoing.message_id,
        type=outgoing.type,
        content_type="application/json",
        delivery_mode=DeliveryMode.PERSISTENT,
        headers=dict(outgoing.headers),
    )


class Broker:
    """Owns the connection, a publisher-confirms channel and the declared topology."""

    def __init__(self, url: str, topology: Topology) -> None:
        self._url = url
        self.topology = topology
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._connect_forever(), name="broker-connect")

    async def wait_connected(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            await self._connected.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._connection is not None:
            await self._connection.close()

    @property
    def channel(self) -> AbstractRobustChannel:
        if self._channel is None or self._channel.is_closed:
            raise UnavailableError("RabbitMQ channel is not open")
        return self._channel

    @property
    def connection(self) -> AbstractRobustConnection:
        if self._connection is None or self._connection.is_closed:
            raise UnavailableError("RabbitMQ is not connected")
        return self._connection

    async def publish_to_queue(
        self, queue: str, message: aio_pika.Message, timeout_s: float
    ) -> None:
        """Publish straight to one queue (retry tiers, DLQs) and wait for the confirm."""
        channel = self.channel
        await asyncio.wait_for(
            channel.default_exchange.publish(message, queue, mandatory=True), timeout_s
        )

    @property
    def is_ready(self) -> bool:
        return (
            self._connection is not None
            and not self._connection.is_closed
            and self._channel is not None
            and not self._channel.is_closed
        )

    async def publish_many(
        self, messages: Sequence[Outgoing], timeout_s: float
    ) -> list[BaseException | None]:
        """Publish all at once and wait for their confirms; one result per message.

        None means confirmed by the broker (persisted and routed); an exception means the
        message may or may not have arrived and must be treated as not published.
        """
        if not messages:
            return []
        if self._exchange is None or not self.is_ready:
            err = UnavailableError("RabbitMQ is not connected")
            return [err] * len(messages)
        exchange = self._exchange

        async def one(outgoing: Outgoing) -> None:
            await exchange.publish(to_message(outgoing), outgoing.routing_key, mandatory=True)

        async def bounded(outgoing: Outgoing) -> None:
            # The deadline covers the whole batch: a stalled broker can't hold a request
            # past its budget.
            await asyncio.wait_for(one(outgoing), timeout_s)

        results = await asyncio.gather(*(bounded(m) for m in messages), return_exceptions=True)
        return [r if isinstance(r, BaseException) else None for r in results]

    async def _connect_forever(self) -> None:
        attempt = 0
        while True:
            try:
                connection = await aio_pika.connect_robust(self._url, timeout=CONNECT_TIMEOUT_S)
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                exchange = await declare(channel, self.topology)
            except (TimeoutError, OSError, aio_pika.exceptions.AMQPError) as e:
                delay = _RECONNECT_BACKOFF_S[min(attempt, len(_RECONNECT_BACKOFF_S) - 1)]
                attempt += 1
                log.warning("broker.connect_failed", error=repr(e), retry_in_s=delay)
                await asyncio.sleep(delay)
                continue
            self._connection, self._channel, self._exchange = connection, channel, exchange
            self._connected.set()
            log.info("broker.connected")
            return


BROKER = web.AppKey("broker", Broker)


def broker_ctx(url: str, topology: Topology) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context owning the service's Broker (connects in the background)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        broker = Broker(url, topology)
        await broker.start()
        app[BROKER] = broker

        async def rabbitmq() -> bool:
            return broker.is_ready

        app[READINESS_CHECKS].append(rabbitmq)
        try:
            yield
        finally:
            await broker.close()

    return ctx
