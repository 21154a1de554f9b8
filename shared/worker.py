"""The worker runtime every consumer shares: ack after commit, retry ladder, DLQ, metrics.

A handler gets one `Delivery` and returns its outcome (`ok` or `skipped_duplicate`) once its
transaction committed; only then is the message acked. A failure is routed by kind:

* PermanentError (a body that can never be valid) goes to the DLQ at once, and so does a
  message without a message id (reason `invalid_message`): the handlers' idempotency key is
  that id, so under an empty key every such message after the first would be skipped;
* anything else is retried: the message is republished, confirmed, to the next retry queue
  of the ladder (its TTL brings it back) with the attempt count in our own `attempts` header,
  then acked; after the last step it goes to the DLQ with the error's `reason`;
* if even that republish fails, the message is handed back (nack + requeue) - never dropped.

A message that kills the process every time is stopped by the queue's delivery limit and
dead-lettered by RabbitMQ itself (reason `delivery_limit` in its x-death header).

The consumer lives on a robust channel: when the broker comes back, aio-pika restores it
(`declare_queue` registers the queue for that); /readyz fails while there is none.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustChannel
from aiohttp import web

from shared.broker import BROKER, Broker, persistent_copy
from shared.errors import PermanentError, TransientError
from shared.metrics import WorkerMetrics
from shared.tasks import cancel_and_wait
from shared.topology import WorkQueue
from shared.web import READINESS_CHECKS

log = structlog.get_logger(__name__)

# Headers we own on a message on its way through retries and into a DLQ (no `x-` prefix:
# that space belongs to RabbitMQ).
ATTEMPTS = "attempts"
FIRST_FAILED_AT = "first_failed_at"
LAST_FAILED_AT = "last_failed_at"
LAST_ERROR = "error"
REASON = "reason"
ORIGINAL_QUEUE = "original_queue"

_PUBLISH_TIMEOUT_S = 5.0
_START_TIMEOUT_S = 10.0
_START_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
_WATCH_INTERVAL_S = 2.0
# After the broker is ready again, how long the robust channel gets to restore the consumer.
_RECONSUME_AFTER_S = 20.0

# Database connections per worker process. Prefetched messages beyond this wait for a
# connection; PostgreSQL's default of 100 connections must fit every replica of every service.
POOL_SIZE = 10
_MAX_ERROR_CHARS = 500


class MissingMessageIdError(PermanentError):
    """A message without the message id every handler deduplicates on: never processed."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a handler sees of one message."""

    message_id: str
    routing_key: str
    body: bytes
    attempts: int


Handler = Callable[[Delivery], Awaitable[str]]


class Worker:
    def __init__(
        self,
        name: str,
        broker: Broker,
        queue: WorkQueue,
        handler: Handler,
        metrics: WorkerMetrics,
        *,
        prefetch: int = 32,
        shutdown_timeout_s: float = 10.0,
    ) -> None:
        self.name = name
        self._broker = broker
        self._queue = queue
        self._handler = handler
        self._metrics = metrics
        self._prefetch = prefetch
        self._shutdown_timeout_s = shutdown_timeout_s
        self._channel: AbstractRobustChannel | None = None
        self._consumer_tag: str | None = None
        self._consuming: aio_pika.abc.AbstractQueue | None = None
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._start_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._start_task = asyncio.create_task(self._run(), name=f"{self.name}-consumer")

    async def _run(self) -> None:
        """Consume, then watch: the robust channel restores the consumer after an outage; if
        it has not come back _RECONSUME_AFTER_S after the broker is ready again (the broker
        replaced a connection that never recovered), consume on a new channel."""
        await self._broker.wait_connected(timeout_s=float("inf"))
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
            if live or not self._broker.is_ready:
                lost_since = None  # counted from when the broker is ready again
                continue
            lost_since = lost_since or loop.time()
            if loop.time() - lost_since >= _RECONSUME_AFTER_S:
                log.error("worker.consuming_afresh", worker=self.name, queue=self._queue.name)
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
            channel = await self._broker.connection.channel()
            self._channel = channel
            await channel.set_qos(prefetch_count=self._prefetch)
            # declare_queue, not get_queue(ensure=False): only a queue the robust channel
            # declared itself is restored with its consumer when the connection comes back.
            # The queue taken the other way was never re-consumed after a broker restart.
            queue = await channel.declare_queue(self._queue.name, passive=True)
            self._consuming = queue
            self._consumer_tag = await queue.consume(self._on_message)
        log.info("worker.consuming", worker=self.name, queue=self._queue.name)

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

    async def stop(self) -> None:
        """Stop taking messages, let those in hand finish, hand back the rest."""
        if self._start_task is not None and not self._start_task.done():
            await cancel_and_wait(self._start_task)
        if self._consuming is not None and self._consumer_tag is not None:
            with contextlib.suppress(Exception):
                await self._consuming.cancel(self._consumer_tag)
        if self._in_flight:
            # Not finished in time: closing the channel returns them to the queue unacked.
            await asyncio.wait(self._in_flight, timeout=self._shutdown_timeout_s)
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._in_flight.add(task)
        try:
            await self._process(message)
        finally:
            if task is not None:
                self._in_flight.discard(task)

    async def _process(self, message: AbstractIncomingMessage) -> None:
        started = time.perf_counter()
        headers = message.headers or {}
        delivery = Delivery(
            message_id=message.message_id or "",
            routing_key=message.routing_key or "",
            body=message.body,
            attempts=_int(headers.get(ATTEMPTS)),
        )
        with structlog.contextvars.bound_contextvars(
            worker=self.name, message_id=delivery.message_id, routing_key=delivery.routing_key
        ):
            try:
                if not delivery.message_id:
                    raise MissingMessageIdError("message has no message_id (no idempotency key)")
                outcome = await self._handler(delivery)
            except PermanentError as e:
                outcome = await self._fail(message, delivery, e, retry=False)
            except Exception as e:
                outcome = await self._fail(message, delivery, e, retry=True)
            else:
                await message.ack()
            duration_s = time.perf_counter() - started
            self._metrics.observe(outcome, duration_s)
            log.info(
                "message.processed",
                outcome=outcome,
                attempts=delivery.attempts,
                duration_s=round(duration_s, 6),
            )

    async def _fail(
        self, message: AbstractIncomingMessage, delivery: Delivery, error: Exception, retry: bool
    ) -> str:
        attempts = delivery.attempts + 1
        retries = self._queue.retry_queues
        now = dt.datetime.now(dt.UTC).isoformat()
        headers: dict[str, Any] = dict(message.headers or {})
        headers.update(
            {
                ATTEMPTS: attempts,
                LAST_FAILED_AT: now,
                LAST_ERROR: f"{type(error).__name__}: {error}"[:_MAX_ERROR_CHARS],
                ORIGINAL_QUEUE: self._queue.name,
            }
        )
        headers.setdefault(FIRST_FAILED_AT, now)
        if retry and attempts <= len(retries):
            target, outcome = retries[attempts - 1], "retried"
        else:
            target, outcome = self._queue.dlq, "dead_lettered"
            if isinstance(error, PermanentError | TransientError):
                headers[REASON] = error.reason
            else:
                headers[REASON] = "retries_exhausted" if retry else "invalid_message"
        expected = isinstance(error, PermanentError | TransientError)
        (log.info if expected else log.error)(
            f"message.{outcome}",
            error=headers[LAST_ERROR],
            attempts=attempts,
            target=target,
            exc_info=not expected,
        )
        try:
            await self._broker.publish_to_queue(
                target, persistent_copy(message, headers), _PUBLISH_TIMEOUT_S
            )
        except Exception as e:
            log.warning("message.handed_back", error=repr(e))
            with contextlib.suppress(Exception):
                await message.nack(requeue=True)
            return "retried"
        await message.ack()
        return outcome


def _int(value: object) -> int:
    if isinstance(value, int | str | bytes):
        with contextlib.suppress(ValueError):
            return int(value)
    return 0


def worker_ctx(
    name: str,
    queue: WorkQueue,
    make_handler: Callable[[web.Application], Handler],
    metrics: WorkerMetrics,
    *,
    prefetch: int = 32,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that consumes `queue` with the handler built from the app."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        worker = Worker(name, app[BROKER], queue, make_handler(app), metrics, prefetch=prefetch)

        async def consumer() -> bool:
            return await worker.consuming()

        app[READINESS_CHECKS].append(consumer)
        worker.start()
        try:
            yield
        finally:
            await worker.stop()

    return ctx
