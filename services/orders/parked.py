"""The parked relay: publishes the events an order's registration released back to the orders
queue (raw body, message id and headers as they came: the worker dedups on the id), and
dead-letters the events still parked after UNKNOWN_PAYMENT_PARK_SECONDS to orders.dlq with
reason unknown_payment, the headers the worker runtime would have written
(shared/worker/failures.py).

A registration commits the release and a NOTIFY (shared/queries/parked.py); every replica
listens and wakes at once, and a sweep every `poll_interval_s` catches what a lost
notification left. Replicas never publish a row together (SKIP LOCKED), and a row is marked
in the transaction that locked it, after the confirm: a crash in between publishes it twice
(the worker's processed mark makes the second a no-op), never zero times. Its own rows
and target (one queue, not the events exchange), through the same relay as the outbox and
ingest's sweeper (shared/amqp/relay.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import aio_pika
import asyncpg
import structlog
from aio_pika.abc import DeliveryMode

from shared.amqp.broker import Broker
from shared.amqp.relay import Publish, confirmed, drain, publish_unpublished
from shared.amqp.topology import WorkQueue
from shared.db import Executor
from shared.errors import UnknownPaymentError
from shared.metrics import OrderMetrics
from shared.process.tasks import keep_running
from shared.queries import parked as parked_sql
from shared.vocabulary import FIRST_FAILED_AT
from shared.worker import failures

log = structlog.get_logger(__name__)

_BATCH = 200
_PUBLISH_TIMEOUT_S = 5.0


class ParkedRelay:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        broker: Broker,
        queue: WorkQueue,
        park_s: float,
        metrics: OrderMetrics,
        *,
        poll_interval_s: float = 1.0,
    ) -> None:
        self._pool = pool
        self._broker = broker
        self._queue = queue
        self._park_s = park_s
        self._metrics = metrics
        self._poll_interval_s = poll_interval_s
        self.wake = asyncio.Event()  # set by the NOTIFY listener

    async def run_forever(self) -> None:
        await keep_running(self._step, self._poll_interval_s, "parked.relay_failed", self.wake)

    async def _step(self) -> None:
        await drain(self.release_once, _BATCH)
        await drain(self.dead_letter_once, _BATCH)

    async def release_once(self) -> int:
        """Publish one batch of released events to the orders queue; return how many were
        confirmed (the others stay for the next pass)."""
        outcome = await publish_unpublished(
            self._pool,
            self._broker,
            lambda conn, _, limit: parked_sql.lock_released(conn, limit),
            _mark_published,
            self._publisher(self._queue.name, lambda row: row.headers),
            older_than_s=0.0,
            batch=_BATCH,
        )
        now = dt.datetime.now(dt.UTC)
        for row, error in outcome:
            if error is None:
                log.info(
                    "order.parked_released",
                    message_id=row.event_id,
                    payment_id=row.payment_id,
                    parked_s=round((now - row.parked_at).total_seconds(), 3),
                )
        done = confirmed(outcome)
        self._metrics.parked_released.inc(done)
        return done

    async def dead_letter_once(self) -> int:
        """Move one batch of events parked longer than the park to the orders DLQ; return
        how many were confirmed there."""
        now = dt.datetime.now(dt.UTC)
        outcome = await publish_unpublished(
            self._pool,
            self._broker,
            lambda conn, _, limit: parked_sql.lock_expired(conn, self._park_s, limit),
            _mark_dead_lettered,
            self._publisher(self._queue.dlq, lambda row: self._dead_letter_headers(row, now)),
            older_than_s=0.0,
            batch=_BATCH,
        )
        for row, error in outcome:
            if error is None:
                log.info(
                    "message.dead_lettered",
                    message_id=row.event_id,
                    payment_id=row.payment_id,
                    reason=UnknownPaymentError.reason,
                    target=self._queue.dlq,
                )
        done = confirmed(outcome)
        self._metrics.parked_dead_lettered.inc(done)
        return done

    def _dead_letter_headers(self, row: parked_sql.ParkedRow, now: dt.datetime) -> dict[str, Any]:
        error = UnknownPaymentError(
            f"no order registered for payment {row.payment_id}"
            f" within {self._park_s:g} s (UNKNOWN_PAYMENT_PARK_SECONDS)"
        )
        route = failures.route(self._queue, row.headers, error, retry=False, now=now)
        # It has waited for its order since it was parked: that is when it first failed.
        route.headers[FIRST_FAILED_AT] = row.parked_at.isoformat()
        return route.headers

    def _publisher(
        self, queue: str, headers: Callable[[parked_sql.ParkedRow], dict[str, Any]]
    ) -> Publish[parked_sql.ParkedRow]:
        """Publish each row's event to `queue` with `headers(row)` (started in row order, the
        confirms awaited together)."""

        async def publish(
            rows: Sequence[parked_sql.ParkedRow],
        ) -> list[BaseException | None]:
            results = await asyncio.gather(
                *(
                    self._broker.publish_to_queue(
                        queue, _message(row, headers(row)), _PUBLISH_TIMEOUT_S
                    )
                    for row in rows
                ),
                return_exceptions=True,
            )
            errors: list[BaseException | None] = []
            for row, result in zip(rows, results, strict=True):
                if isinstance(result, BaseException):
                    log.warning(
                        "parked.publish_failed",
                        message_id=row.event_id,
                        queue=queue,
                        error=repr(result),
                    )
                    errors.append(result)
                else:
                    errors.append(None)
            return errors

        return publish


async def _mark_published(conn: Executor, rows: list[parked_sql.ParkedRow]) -> None:
    await parked_sql.mark_published(conn, [r.id for r in rows])


async def _mark_dead_lettered(conn: Executor, rows: list[parked_sql.ParkedRow]) -> None:
    await parked_sql.mark_dead_lettered(conn, [r.id for r in rows])


def _message(row: parked_sql.ParkedRow, headers: dict[str, Any]) -> aio_pika.Message:
    """The event as the worker first received it: body, message id, type, headers."""
    return aio_pika.Message(
        row.body,
        headers=headers,
        message_id=row.event_id,
        type=row.routing_key,
        content_type="application/json",
        delivery_mode=DeliveryMode.PERSISTENT,
        timestamp=dt.datetime.now(dt.UTC),
    )
