"""The worker runtime every consumer shares: batches, ack after commit, retry ladder, DLQ.

Messages are taken in batches of what has arrived (up to BATCH_SIZE, BATCHERS batches at a
time). The handler answers each delivery's outcome (`ok`, `skipped_duplicate`) once committed,
or the exception that failed it (shared/batches.py: one transaction per batch, a savepoint
per message). The committed ones are acked together, with one multiple-ack as far as no
earlier delivery is still in another batch; a failure is routed alone, by kind:

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
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import aio_pika
import aiormq
import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustChannel
from aiohttp import web

from shared.acks import AckWindow
from shared.batches import BatchHandler, Delivery, Result
from shared.broker import BROKER, Broker, persistent_copy
from shared.errors import PermanentError, TransientError
from shared.metrics import WorkerMetrics
from shared.tasks import cancel_and_wait
from shared.topology import WorkQueue
from shared.vocabulary import (
    ATTEMPTS,
    FIRST_FAILED_AT,
    LAST_ERROR,
    LAST_FAILED_AT,
    ORIGINAL_QUEUE,
    REASON,
)
from shared.web import READINESS_CHECKS

log = structlog.get_logger(__name__)

_PUBLISH_TIMEOUT_S = 5.0
_START_TIMEOUT_S = 10.0
_START_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
_WATCH_INTERVAL_S = 2.0
# After the broker is ready again, how long the robust channel gets to restore the consumer.
_RECONSUME_AFTER_S = 20.0

# Database connections per worker process; PostgreSQL's default of 100 connections must fit
# every replica of every service.
POOL_SIZE = 10
# Messages per batch at most, and batches in progress at once (each holds a connection).
BATCH_SIZE = 50
BATCHERS = 3
# How long a batch that is not full waits for more messages. bench.workers at a steady 215
# payments/s (half the maximum): 2 ms gave batches of one or two, 8.3 ms of CPU per payment
# and an end-to-end p99 of 446 ms (near capacity at that batch size); 10 ms gave 6.2 ms and
# p99 69 ms. Under full load batches fill before it runs out.
LINGER_S = 0.01
_MAX_ERROR_CHARS = 500


class MissingMessageIdError(PermanentError):
    """A message without the message id every handler deduplicates on: never processed."""


class Worker:
    """Consumes one queue in batches: each batcher takes what has arrived (up to
    `batch_size`), hands it to the handler, routes the failures alone and acks the rest
    with one multiple-ack as far as no earlier delivery is still being worked on."""

    def __init__(
        self,
        name: str,
        broker: Broker,
        queue: WorkQueue,
        handler: BatchHandler,
        metrics: WorkerMetrics,
        *,
        batch_size: int = BATCH_SIZE,
        batchers: int = BATCHERS,
        linger_s: float = LINGER_S,
        shutdown_timeout_s: float = 10.0,
    ) -> None:
        self.name = name
        self._broker = broker
        self._queue = queue
        self._handler = handler
        self._metrics = metrics
        self._batch_size = batch_size
        self._batchers = batchers
        self._linger_s = linger_s
        # Enough for every batcher to take a full batch while the next ones arrive.
        self._prefetch = 2 * batch_size * batchers
        self._shutdown_timeout_s = shutdown_timeout_s
        self._channel: AbstractRobustChannel | None = None
        self._consumer_tag: str | None = None
        self._consuming: aio_pika.abc.AbstractQueue | None = None
        self._waiting: deque[AbstractIncomingMessage] = deque()
        self._arrived = asyncio.Event()
        self._windows: dict[object, AckWindow] = {}
        self._batcher_tasks: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self._start_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._start_task = asyncio.create_task(self._run(), name=f"{self.name}-consumer")
        self._batcher_tasks = [
            asyncio.create_task(self._take_batches(), name=f"{self.name}-batcher-{n}")
            for n in range(self._batchers)
        ]

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
        """Stop taking messages, let the batches in hand finish, hand back the rest."""
        if self._start_task is not None and not self._start_task.done():
            await cancel_and_wait(self._start_task)
        if self._consuming is not None and self._consumer_tag is not None:
            with contextlib.suppress(Exception):
                await self._consuming.cancel(self._consumer_tag)
        for task in self._batcher_tasks:  # waiting for the next batch, not in one
            await cancel_and_wait(task)
        if self._in_flight:
            # Not finished in time: closing the channel returns them to the queue unacked.
            await asyncio.wait(self._in_flight, timeout=self._shutdown_timeout_s)
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self._window(message).received(message.delivery_tag or 0)
        self._waiting.append(message)
        self._arrived.set()

    def _window(self, message: AbstractIncomingMessage) -> AckWindow:
        """The ack window of the channel the message came on (a new one after the robust
        channel was restored: delivery tags start again at 1)."""
        channel = message.channel
        window = self._windows.get(channel)
        if window is None:
            self._windows = {c: w for c, w in self._windows.items() if not _closed(c)}
            window = self._windows[channel] = AckWindow()
        return window

    async def _take_batches(self) -> None:
        while True:
            while not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
            if len(self._waiting) < self._batch_size:
                await asyncio.sleep(self._linger_s)  # what arrives meanwhile joins the batch
            batch = [
                self._waiting.popleft() for _ in range(min(self._batch_size, len(self._waiting)))
            ]
            # Its own task, so that stop() can let it finish while no new batch starts.
            task = asyncio.create_task(self._process_or_hand_back(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            await asyncio.shield(task)

    async def _process_or_hand_back(self, batch: list[AbstractIncomingMessage]) -> None:
        try:
            await self._process(batch)
        except Exception as e:  # a channel closed under an ack, a bug: hand back the rest
            log.exception("batch.failed", worker=self.name, error=repr(e))
            unsettled = [m for m in batch if self._window(m).is_open(m.delivery_tag or 0)]
            for message in unsettled:
                with contextlib.suppress(Exception):
                    await message.nack(requeue=True)
            await self._settle(unsettled, settled=True)

    async def _process(self, messages: list[AbstractIncomingMessage]) -> None:
        started = time.perf_counter()
        deliveries = [_delivery(m) for m in messages]
        handled = [i for i, d in enumerate(deliveries) if d.message_id]
        results: list[Result] = [
            MissingMessageIdError("message has no message_id (no idempotency key)")
        ] * len(messages)
        with structlog.contextvars.bound_contextvars(worker=self.name):
            if handled:
                for i, result in zip(
                    handled, await self._handler([deliveries[i] for i in handled]), strict=True
                ):
                    results[i] = result
            ok = [m for m, r in zip(messages, results, strict=True) if isinstance(r, str)]
            failed = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
            outcomes = [r if isinstance(r, str) else "failed" for r in results]
            routed = await asyncio.gather(
                *(
                    self._fail(
                        messages[i], deliveries[i], e, retry=not isinstance(e, PermanentError)
                    )
                    for i, e in failed
                )
            )
            for (i, _), outcome in zip(failed, routed, strict=True):
                outcomes[i] = outcome
            await self._settle([messages[i] for i, _ in failed], settled=True)
            await self._settle(ok, settled=False)
            duration_s = time.perf_counter() - started
            for outcome in outcomes:
                self._metrics.observe(outcome, duration_s)
            log.info(
                "batch.processed",
                messages=len(messages),
                outcomes=dict(Counter(outcomes)),
                duration_s=round(duration_s, 6),
            )

    async def _settle(self, messages: list[AbstractIncomingMessage], *, settled: bool) -> None:
        """Mark messages finished in their channel's ack window (`settled`: acked or nacked
        alone already) and ack as far as each window allows, one multiple-ack per channel."""
        by_channel: dict[object, list[AbstractIncomingMessage]] = {}
        for message in messages:
            by_channel.setdefault(message.channel, []).append(message)
        for channel, group in by_channel.items():
            tags = [m.delivery_tag or 0 for m in group]
            ack_to = self._window(group[0]).done(tags, settled=settled)
            if ack_to is None or _closed(channel):
                continue  # closed: the broker hands them out again, the handlers dedup
            try:
                await group[0].channel.basic_ack(delivery_tag=ack_to, multiple=True)
            except Exception as e:
                log.warning("batch.ack_failed", worker=self.name, error=repr(e))

    async def _fail(
        self,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        error: Exception,
        *,
        retry: bool,
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
            message_id=delivery.message_id,
            routing_key=delivery.routing_key,
            error=headers[LAST_ERROR],
            attempts=attempts,
            target=target,
            exc_info=False if expected else error,
        )
        try:
            await self._broker.publish_to_queue(
                target, persistent_copy(message, headers), _PUBLISH_TIMEOUT_S
            )
        except Exception as e:
            log.warning("message.handed_back", message_id=delivery.message_id, error=repr(e))
            with contextlib.suppress(Exception):
                await message.nack(requeue=True)
            return "retried"
        await message.ack()
        return outcome


def _delivery(message: AbstractIncomingMessage) -> Delivery:
    return Delivery(
        message_id=message.message_id or "",
        routing_key=message.routing_key or "",
        body=message.body,
        attempts=_int((message.headers or {}).get(ATTEMPTS)),
    )


def _closed(channel: object) -> bool:
    return bool(getattr(channel, "is_closed", True))


def _int(value: object) -> int:
    if isinstance(value, int | str | bytes):
        with contextlib.suppress(ValueError):
            return int(value)
    return 0


def worker_ctx(
    name: str,
    queue: WorkQueue,
    make_handler: Callable[[web.Application], BatchHandler],
    metrics: WorkerMetrics,
    *,
    batch_size: int = BATCH_SIZE,
    batchers: int = BATCHERS,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context that consumes `queue` with the handler built from the app."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        worker = Worker(
            name,
            app[BROKER],
            queue,
            make_handler(app),
            metrics,
            batch_size=batch_size,
            batchers=batchers,
        )

        async def consumer() -> bool:
            return await worker.consuming()

        app[READINESS_CHECKS].append(consumer)
        worker.start()
        try:
            yield
        finally:
            await worker.stop()

    return ctx
