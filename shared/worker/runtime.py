"""The worker runtime every consumer shares: batches of what has arrived, handed to the
handler (one transaction), the committed ones acked together, each failure routed alone to
its retry queue or DLQ (shared/worker/failures.py), handed back (nack) if even that fails. A failure
that is a dependency's outage (shared/outages.py) is no attempt of the message: it goes back
to its queue as it was, and the worker pauses until the dependency is back
(shared/worker/pause.py). An operator's pause keeps what the worker holds, in order, for when
it runs again (HOLD_S at most); an operator's rate cap sizes each batch by the tokens it got
from the bucket every replica shares (shared/worker/controls.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any, Protocol

import orjson
import structlog
from aio_pika.abc import AbstractIncomingMessage
from aiormq.abc import AbstractChannel
from aiormq.exceptions import ChannelInvalidStateError

from shared import tracing
from shared.amqp.broker import Broker
from shared.amqp.outgoing import persistent_copy
from shared.amqp.topology import WorkQueue
from shared.db import TRANSIENT_DB_ERRORS
from shared.errors import Dependency, PermanentError, TransientError
from shared.metrics import WorkerMetrics
from shared.outages import outage_of
from shared.process.tasks import cancel_and_wait
from shared.vocabulary import ATTEMPTS, LAST_ERROR, REPLAY, REPROCESS
from shared.worker import failures
from shared.worker.acks import AckWindow
from shared.worker.batches import BatchHandler, Delivery, Result, about_payment
from shared.worker.consumer import Consumer
from shared.worker.pause import Pause, Probe

log = structlog.get_logger(__name__)

_PUBLISH_TIMEOUT_S = 5.0

# Messages per batch at most, and batches in progress at once (each holds a connection).
# One batcher: what arrives while a batch is applied forms the next, so batches grow with the
# load; 128 costs less CPU per payment than 50, 256 no less (docs/performance.md). The email
# worker, which waits on its SMTP server, keeps smaller ones.
BATCH_SIZE = 128
BATCHERS = 1
# How long a batch that is not full waits for more messages: at a steady rate, a longer wait
# makes fewer, larger batches and a lower p99 (docs/performance.md).
LINGER_S = 0.02
# How long an operator's pause keeps the messages the worker had received, unacknowledged, so
# that they are the first it processes when it runs again (nothing reordered): then they are
# handed back like a dependency's pause does, to the back of the queue (RabbitMQ closes a
# channel holding a delivery past its consumer_timeout, 30 minutes by default).
HOLD_S = 600.0


class Throttle(Protocol):
    """A rate cap: `limited` false means none (then nothing is asked, the hot path untouched);
    `take(n)` waits until it may hand out some of the n, and returns how many (0: the worker
    was paused meanwhile)."""

    @property
    def limited(self) -> bool: ...

    async def take(self, wanted: int) -> int: ...


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
        probes: Mapping[Dependency, Probe] | None = None,
        throttle: Throttle | None = None,
        hold_s: float = HOLD_S,
    ) -> None:
        """`probes`: how to tell each dependency the worker needs is back after an outage
        (one without a probe is tried again with the next batch, after the pause's wait)."""
        self.name = name
        self._broker = broker
        self._queue = queue
        self._handler = handler
        self._metrics = metrics
        self._batch_size = batch_size
        self._batchers = batchers
        self._linger_s = linger_s
        # Enough prefetch for every batcher to take a full batch while the next ones arrive.
        self._consumer = Consumer(
            name, broker, queue.name, 2 * batch_size * batchers, self._on_message
        )
        self._shutdown_timeout_s = shutdown_timeout_s
        self._waiting: deque[AbstractIncomingMessage] = deque()
        self._arrived = asyncio.Event()
        self._gathering = asyncio.Lock()
        self._windows: dict[object, AckWindow] = {}
        self._batcher_tasks: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self._throttle = throttle
        self._hold_s = hold_s
        self._hold_timer: asyncio.Task[None] | None = None
        self.pause = Pause(name, probes or {}, metrics.paused, self._on_pause, self._on_resume)

    def start(self) -> None:
        self._consumer.start()
        self._batcher_tasks = [
            asyncio.create_task(self._take_batches(), name=f"{self.name}-batcher-{n}")
            for n in range(self._batchers)
        ]

    async def consuming(self) -> bool:
        """A consumer on the queue, and every batcher alive to take what it receives."""
        if any(task.done() for task in self._batcher_tasks):
            return False
        return await self._consumer.consuming()

    async def stop(self) -> None:
        """Stop taking messages, let the batches in hand finish, hand back the rest."""
        await self.pause.close()
        if self._hold_timer is not None:
            await cancel_and_wait(self._hold_timer)
        await self._consumer.stop()
        for task in self._batcher_tasks:  # waiting for the next batch, not in one
            await cancel_and_wait(task)
        if self._in_flight:
            # Not finished in time: closing the channel returns them to the queue unacked.
            await asyncio.wait(self._in_flight, timeout=self._shutdown_timeout_s)
        await self._consumer.close()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        if (window := self._window(message)) is None:
            return  # its channel closed already: RabbitMQ delivers it again
        window.received(message.delivery_tag or 0)
        self._waiting.append(message)
        self._arrived.set()

    def _window(self, message: AbstractIncomingMessage) -> AckWindow | None:
        """The ack window of the channel the message came on (a new one after the robust
        channel was restored: delivery tags start again at 1); None once that channel has
        closed (RabbitMQ took back its unacknowledged messages)."""
        channel = _open_channel(message)
        if channel is None:
            return None
        window = self._windows.get(channel)
        if window is None:
            self._windows = {c: w for c, w in self._windows.items() if not _closed(c)}
            window = self._windows[channel] = AckWindow()
        return window

    async def _take_batches(self) -> None:
        while True:
            await self.pause.running.wait()  # paused: no new batch
            # One batcher gathers the next batch at a time: the others are busy with theirs
            # or wait their turn, rather than all waking on one message and lingering
            # together, then cutting what arrived into several small batches.
            async with self._gathering:
                while not self._waiting:
                    self._arrived.clear()
                    await self._arrived.wait()
                if len(self._waiting) < self._batch_size:
                    await asyncio.sleep(self._linger_s)  # what arrives meanwhile joins it
                size = min(self._batch_size, len(self._waiting))
                if self._throttle is not None and self._throttle.limited:
                    # A pause meanwhile may have handed back what was waiting.
                    size = min(await self._throttle.take(size), len(self._waiting))
                taken = [self._waiting.popleft() for _ in range(size)]
            # Received on a channel that has closed since (RabbitMQ restarted): they are
            # RabbitMQ's again and come back on the new one; handled now, they could not be
            # acked.
            batch = [m for m in taken if _open_channel(m) is not None]
            if batch and self.pause.is_paused:  # paused while it gathered
                if self.pause.dependency_paused:
                    await self._hand_back(batch)
                else:  # an operator's pause: first in line when the worker runs again
                    self._waiting.extendleft(reversed(batch))
                continue
            if not batch:
                continue
            # Its own task, so that stop() can let it finish while no new batch starts.
            task = asyncio.create_task(self._process_or_hand_back(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            try:
                await asyncio.shield(task)
            except Exception as e:  # a batcher that died would stop the worker for good
                log.exception("batch.unhandled", worker=self.name, error=repr(e))

    async def _process_or_hand_back(self, batch: list[AbstractIncomingMessage]) -> None:
        try:
            await self._process(batch)
        except Exception as e:  # a channel closed under an ack, a bug: hand back the rest
            log.exception("batch.failed", worker=self.name, error=repr(e))
            unsettled = [
                m
                for m in batch
                if (window := self._window(m)) is not None and window.is_open(m.delivery_tag or 0)
            ]
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
        traced = (
            _trace(self.name, self._queue.name, deliveries)
            if tracing.worth_tracing([d.headers for d in deliveries])
            else None
        )
        if traced is not None:  # a message with a span of its own passes on that span's context
            deliveries = [
                d
                if traced.messages[i] is None
                else dataclasses.replace(d, headers=traced.headers(i))
                for i, d in enumerate(deliveries)
            ]
        try:
            await self._handle(messages, deliveries, handled, results, started, traced)
        except BaseException:
            if traced is not None:  # what raised is logged by the caller; the spans end
                traced.finish(["failed"] * len(messages))
            raise

    async def _handle(
        self,
        messages: list[AbstractIncomingMessage],
        deliveries: list[Delivery],
        handled: list[int],
        results: list[Result],
        started: float,
        traced: tracing.BatchTrace | None,
    ) -> None:
        with structlog.contextvars.bound_contextvars(worker=self.name):
            if handled:
                with traced.use() if traced is not None else contextlib.nullcontext():
                    answers = await self._handler([deliveries[i] for i in handled])
                for i, result in zip(handled, answers, strict=True):
                    results[i] = result
            ok = [m for m, r in zip(messages, results, strict=True) if isinstance(r, str)]
            outages = {
                i: (dependency, r)
                for i, r in enumerate(results)
                if isinstance(r, Exception) and (dependency := outage_of(r)) is not None
            }
            failed = [
                (i, r)
                for i, r in enumerate(results)
                if isinstance(r, Exception) and i not in outages
            ]
            outcomes = [r if isinstance(r, str) else "failed" for r in results]
            if outages:
                await self.pause.pause(*outages[min(outages)])
                await self._hand_back([messages[i] for i in outages])
                for i in outages:
                    outcomes[i] = "handed_back"
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
                if outcome != "handed_back":  # not finished: it comes again
                    self._metrics.observe(outcome, duration_s)
            self._observe_effects(deliveries, outcomes)
            if traced is not None:
                traced.finish(outcomes)
            log.info(
                "batch.processed",
                messages=len(messages),
                outcomes=dict(Counter(outcomes)),
                duration_s=round(duration_s, 6),
            )

    def _observe_effects(self, deliveries: list[Delivery], outcomes: list[str]) -> None:
        """The end-to-end latency of each message that took effect: from the webhook's
        arrival at ingest (the RECEIVED_AT header) to now. Not for an operator's replay or
        reprocess (the event arrived long ago on purpose)."""
        now = time.time()
        for delivery, outcome in zip(deliveries, outcomes, strict=True):
            if outcome != "ok" or REPLAY in delivery.headers or REPROCESS in delivery.headers:
                continue
            if (received := tracing.received_at(delivery.headers)) is not None:
                self._metrics.observe_effect(max(0.0, now - received))

    async def _on_pause(self, hand_back: bool) -> None:
        """Take nothing more; hand back what has arrived and waits for a batch (an operator's
        pause keeps it for HOLD_S first)."""
        await self._consumer.pause()
        if not hand_back:
            self._hold_timer = asyncio.create_task(
                self._hand_back_held(), name=f"{self.name}-hold-timer"
            )
            return
        await self._hand_back_waiting()

    async def _hand_back_waiting(self) -> None:
        waiting = [m for m in self._waiting if _open_channel(m) is not None]
        self._waiting.clear()
        await self._hand_back(waiting)

    async def _hand_back_held(self) -> None:
        await asyncio.sleep(self._hold_s)
        if self.pause.is_paused:
            log.info("worker.hold_handed_back", worker=self.name, messages=len(self._waiting))
            await self._hand_back_waiting()

    async def _on_resume(self) -> None:
        if self._hold_timer is not None:
            timer, self._hold_timer = self._hold_timer, None
            if timer is not asyncio.current_task():
                await cancel_and_wait(timer)
        await self._consumer.resume()
        if self._waiting:  # what an operator's pause kept: processed first
            self._arrived.set()

    async def _hand_back(self, messages: list[AbstractIncomingMessage]) -> None:
        """Back to the work queue as they came, no attempt counted: a copy with the same
        headers, then the ack (a nack would count towards the queue's delivery limit, which
        a long outage or a flapping one would reach). A channel closed already has handed
        them back to RabbitMQ itself; a copy that cannot be published is nacked."""
        if not messages:
            return
        errors = await asyncio.gather(*(self._return(m) for m in messages))
        await self._settle(messages, settled=True)
        if nacked := [e for e in errors if e is not None]:
            log.info("worker.handed_back_by_nack", messages=len(nacked), error=repr(nacked[0]))

    async def _return(self, message: AbstractIncomingMessage) -> Exception | None:
        if _open_channel(message) is None:
            return None
        headers: dict[str, Any] = dict(message.headers or {})
        headers.pop("x-delivery-count", None)  # the quorum queue's count: a new message starts at 0
        try:
            await self._broker.publish_to_queue(
                self._queue.name, persistent_copy(message, headers), _PUBLISH_TIMEOUT_S
            )
        except Exception as e:
            with contextlib.suppress(Exception):
                await message.nack(requeue=True)
            return e
        with contextlib.suppress(Exception):  # a duplicate at worst: handlers dedup
            await message.ack()
        return None

    async def _settle(self, messages: list[AbstractIncomingMessage], *, settled: bool) -> None:
        """Mark messages finished in their channel's ack window (`settled`: acked or nacked
        alone already) and ack as far as each window allows, one multiple-ack per channel."""
        by_channel: dict[AbstractChannel, list[AbstractIncomingMessage]] = {}
        for message in messages:
            # A closed channel's messages are RabbitMQ's again: it hands them out again, and
            # the handlers dedup.
            if (channel := _open_channel(message)) is not None:
                by_channel.setdefault(channel, []).append(message)
        for channel, group in by_channel.items():
            window = self._windows.get(channel)
            ack_to = (
                window.done([m.delivery_tag or 0 for m in group], settled=settled)
                if window
                else None
            )
            if ack_to is None:
                continue
            try:
                await channel.basic_ack(delivery_tag=ack_to, multiple=True)
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
        # The body is read again here, for a failed message only: never on the hot path.
        with about_payment(_payment_id(delivery.body)):
            return await self._route(message, delivery, error, retry=retry)

    async def _route(
        self,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        error: Exception,
        *,
        retry: bool,
    ) -> str:
        now = dt.datetime.now(dt.UTC)
        to = failures.route(self._queue, message.headers or {}, error, retry=retry, now=now)
        # The database timing out or going away is expected weather, as an SMTP server away
        # is: a line, not a traceback (an SMTP stall held a payment's email lock until a batch
        # waiting on it timed out: 32 error tracebacks in one chaos round).
        expected = isinstance(error, (PermanentError, TransientError, *TRANSIENT_DB_ERRORS))
        (log.info if expected else log.error)(
            f"message.{to.outcome}",
            message_id=delivery.message_id,
            routing_key=delivery.routing_key,
            error=to.headers[LAST_ERROR],
            attempts=to.headers[ATTEMPTS],
            target=to.target,
            exc_info=False if expected else error,
        )
        try:
            await self._broker.publish_to_queue(
                to.target, persistent_copy(message, to.headers), _PUBLISH_TIMEOUT_S
            )
        except Exception as e:
            log.warning("message.handed_back", message_id=delivery.message_id, error=repr(e))
            with contextlib.suppress(Exception):
                await message.nack(requeue=True)
            return "retried"
        await message.ack()
        return to.outcome


def _delivery(message: AbstractIncomingMessage) -> Delivery:
    return Delivery(
        message_id=message.message_id or "",
        routing_key=message.routing_key or "",
        body=message.body,
        attempts=failures.attempts_of(message.headers or {}),
        headers=message.headers or {},
    )


def _trace(name: str, queue: str, deliveries: list[Delivery]) -> tracing.BatchTrace:
    return tracing.BatchTrace(
        name,
        queue,
        [d.headers for d in deliveries],
        lambda i: (deliveries[i].message_id, _payment_id(deliveries[i].body)),
    )


def _payment_id(body: bytes) -> str | None:
    """The payment a message is about: provider events and order transitions both carry a
    top-level `payment_id`; None for a body without one (or no JSON object at all)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    value = payload.get("payment_id") if isinstance(payload, dict) else None
    return value if isinstance(value, str) else None


def _closed(channel: object) -> bool:
    return bool(getattr(channel, "is_closed", True))


def _open_channel(message: AbstractIncomingMessage) -> AbstractChannel | None:
    """The channel a message came on, or None once it has closed (aio-pika raises then)."""
    try:
        return message.channel
    except ChannelInvalidStateError:
        return None
