"""One consumer on a queue that outlives broker outages: aio-pika's robust channel restores
it, and a consumer not back _RECONSUME_AFTER_S after the broker is ready again is replaced.
Paused (a dependency of the worker is down), it takes nothing until resumed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import aio_pika
import aiormq
import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustChannel

from shared.amqp.broker import Broker
from shared.process.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

_START_TIMEOUT_S = 10.0
# A cancel or close a live broker answers in milliseconds; a gone one never does.
_STOP_TIMEOUT_S = 2.0
_START_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
_WATCH_INTERVAL_S = 2.0
# After the broker is ready again, how long the robust channel gets to restore the consumer:
# it does so within a second when it does at all (often it does not after a connection was
# cut, and a worker then sat idle for this long: make chaos, outage-rabbitmq).
_RECONSUME_AFTER_S = 5.0


class Consumer:
    def __init__(
        self,
        name: str,
        broker: Broker,
        queue: str,
        prefetch: int,
        on_message: Callable[[AbstractIncomingMessage], Awaitable[None]],
    ) -> None:
        self.name = name
        self._broker = broker
        self._queue = queue
        self._prefetch = prefetch
        self._on_message = on_message
        self._channel: AbstractRobustChannel | None = None
        self._consumer_tag: str | None = None
        self._consuming: aio_pika.abc.AbstractQueue | None = None
        self._task: asyncio.Task[None] | None = None
        self._generation = 0  # the broker's connection this consumer consumes on
        self._paused = False
        self._consume_lock = asyncio.Lock()  # one (re)consume at a time: watch or resume

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"{self.name}-consumer")

    async def stop(self) -> None:
        """No more messages (those delivered stay the caller's until close())."""
        if self._task is not None and not self._task.done():
            await cancel_and_wait(self._task)
        if self._consuming is not None and self._consumer_tag is not None:
            # Bounded: while the broker is away a robust queue waits for the connection to
            # come back (a SIGTERM during a RabbitMQ outage never finished shutting down).
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_STOP_TIMEOUT_S):
                    await self._consuming.cancel(self._consumer_tag)

    @property
    def paused(self) -> bool:
        return self._paused

    async def pause(self) -> None:
        """Cancel the consumer: RabbitMQ delivers nothing more until resume(). While the
        broker is away there is nothing to cancel (and nothing arrives); what the robust
        channel restores then is the consumer resume() finds."""
        self._paused = True
        queue, tag = self._consuming, self._consumer_tag
        if queue is None or tag is None:
            return
        if not await self.consuming():
            if not self._broker.is_ready:
                return
            # The broker is there and the answer was slow or unsure: that is no proof the
            # consumer is gone, so cancel it anyway (bounded).
            log.info("worker.cancel_unconfirmed", worker=self.name)
        try:
            async with asyncio.timeout(_STOP_TIMEOUT_S):
                await queue.cancel(tag)
        except Exception as e:  # the channel went away meanwhile: nothing arrives either
            log.info("worker.cancel_failed", worker=self.name, error=repr(e))
            return
        self._consumer_tag = None

    async def resume(self) -> None:
        """Consume again: on the same channel where it is open, else on a new one."""
        self._paused = False
        async with self._consume_lock:
            if await self.consuming():
                return  # the robust channel restored it after a broker outage
            queue = self._consuming
            if queue is not None and self._channel is not None and not self._channel.is_closed:
                try:
                    async with asyncio.timeout(_START_TIMEOUT_S):
                        self._consumer_tag = await queue.consume(self._on_message)
                    log.info("worker.consuming", worker=self.name, queue=self._queue)
                    return
                except Exception as e:
                    log.warning("worker.consume_failed", worker=self.name, error=repr(e))
            await self._drop_channel()
            await self._consume_until_done()

    async def close(self) -> None:
        """Close the channel: what is still unacknowledged goes back to the queue."""
        if self._channel is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_STOP_TIMEOUT_S):
                    await self._channel.close()

    async def _run(self) -> None:
        """Consume, then watch: the robust channel restores the consumer after an outage; if
        it has not come back _RECONSUME_AFTER_S after the broker is ready again (the broker
        replaced a connection that never recovered), consume on a new channel."""
        await self._broker.wait_connected(timeout_s=float("inf"))
        async with self._consume_lock:
            # Paused before it first consumed (an operator's pause read at startup): resume()
            # consumes; resumed meanwhile: it consumes already.
            if not self._paused and not await self.consuming():
                await self._consume_until_done()
        loop = asyncio.get_running_loop()
        lost_since: float | None = None
        while True:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            try:
                live = await self.consuming()
            except Exception as e:  # the watch must outlive whatever the channel raises
                log.warning("worker.consumer_check_failed", worker=self.name, error=repr(e))
                live = False
            if live or self._paused or not self._broker.is_ready:
                lost_since = None  # counted from when the broker is ready again
                continue
            lost_since = lost_since or loop.time()
            # On a connection the broker has since replaced (another node of a cluster, or
            # one that never recovered), the robust channel will never be restored.
            replaced = self._generation != self._broker.generation
            if replaced or loop.time() - lost_since >= _RECONSUME_AFTER_S:
                async with self._consume_lock:
                    # Paused, or restored, while this waited for the lock.
                    if self.paused or await self.consuming():
                        continue
                    log.error("worker.consuming_afresh", worker=self.name, queue=self._queue)
                    await self._drop_channel()
                    await self._consume_until_done()
                lost_since = None

    async def _consume_until_done(self) -> None:
        attempt = 0
        while True:
            try:
                await self._consume()
                return
            except Exception as e:  # aio-pika raises RuntimeError ("closed") too
                # The broker went away between connecting and consuming: try again.
                delay = _START_BACKOFF_S[min(attempt, len(_START_BACKOFF_S) - 1)]
                attempt += 1
                log.warning(
                    "worker.consume_failed", worker=self.name, error=repr(e), retry_in_s=delay
                )
                await self._drop_channel()
                await asyncio.sleep(delay)

    async def _drop_channel(self) -> None:
        """Close the channel (a closed robust channel is not restored any more)."""
        channel, self._channel, self._consumer_tag = self._channel, None, None
        if channel is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_START_TIMEOUT_S):
                    await channel.close()

    async def _consume(self) -> None:
        async with asyncio.timeout(_START_TIMEOUT_S):
            self._generation = self._broker.generation
            channel = await self._broker.connection.channel()
            self._channel = channel
            await channel.set_qos(prefetch_count=self._prefetch)
            # declare_queue, not get_queue(ensure=False): only a queue the robust channel
            # declared itself is restored with its consumer when the connection comes back.
            # The queue taken the other way was never re-consumed after a broker restart.
            queue = await channel.declare_queue(self._queue, passive=True)
            self._consuming = queue
            self._consumer_tag = await queue.consume(self._on_message)
        log.info("worker.consuming", worker=self.name, queue=self._queue)

    async def consuming(self) -> bool:
        """Whether this worker has a live consumer on its queue right now (readiness): false
        while the broker is away, while the channel is being restored, and after RabbitMQ
        cancelled the consumer until it is registered again."""
        channel, tag = self._channel, self._consumer_tag
        if channel is None or tag is None or channel.is_closed or not self._broker.is_ready:
            return False
        try:
            async with asyncio.timeout(1.0):  # a robust channel waits while it reconnects
                underlay = await channel.get_underlay_channel()
        except (TimeoutError, aiormq.exceptions.AMQPError):
            return False
        # aiormq drops a consumer from `consumers` when RabbitMQ cancels it (basic.cancel).
        return (
            isinstance(underlay, aiormq.Channel)
            and not underlay.is_closed
            and tag in underlay.consumers
        )
