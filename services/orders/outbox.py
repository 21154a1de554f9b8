"""The outbox relay: publishes `order.*` rows committed with their transition, with confirms,
then marks them. A crash before the mark publishes a row twice (consumers dedup by message
id); never zero times.

The rows a batch of this process commits are handed over as they are (`committed`) and
published at once: no statement reads them back, and the mark is one statement that doesn't
wait for its WAL flush (a mark lost in a crash only publishes the row again). A sweep every
`poll_interval_s` publishes, oldest first, the rows no hand-over published within `grace_s`:
a process killed after its commit, a broker away, a confirm that never came. Replicas sweep
without publishing each other's rows twice (SKIP LOCKED). The order the rows go out in
doesn't matter to the consumers: bonuses and emails follow the order's current status."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
import structlog

from shared.amqp.broker import Broker
from shared.amqp.outgoing import Outgoing
from shared.amqp.relay import confirmed, drain, on_events_exchange, publish_unpublished
from shared.db import Executor
from shared.messages import ORDER_TRANSITION_SCHEMA
from shared.process.tasks import keep_running
from shared.queries import outbox as outbox_sql

log = structlog.get_logger(__name__)

_BATCH = 200
_HEADERS = {"schema": ORDER_TRANSITION_SCHEMA}  # every outbox row is an order transition
_PUBLISH_TIMEOUT_S = 5.0
# A row younger than this is left to the hand-over (whose publish waits at most
# _PUBLISH_TIMEOUT_S for its confirm): the sweep takes it only if that failed.
GRACE_S = 5.0


class OutboxRelay:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        broker: Broker,
        *,
        poll_interval_s: float = 1.0,
        grace_s: float = GRACE_S,
    ) -> None:
        self._pool = pool
        self._broker = broker
        self._poll_interval_s = poll_interval_s
        self._grace_s = grace_s
        self._wakeup = asyncio.Event()
        self._committed: list[Outgoing] = []
        self._next_sweep = 0.0

    def committed(
        self,
        rows: Sequence[tuple[str, str, bytes]],
        headers: Sequence[Mapping[str, str]] | None = None,
    ) -> None:
        """Outbox rows (message id, routing key, body) a transaction just committed, and
        each one's carried headers if any: publish them now, not at the next sweep."""
        self._committed.extend(
            Outgoing(routing_key, body, message_id, routing_key, {**_HEADERS, **carried})
            for (message_id, routing_key, body), carried in zip(
                rows, headers or [{}] * len(rows), strict=True
            )
        )
        self._wakeup.set()

    async def run_forever(self) -> None:
        await keep_running(self._step, self._poll_interval_s, "outbox.relay_failed", self._wakeup)

    async def _step(self) -> None:
        await self.publish_committed()
        loop = asyncio.get_running_loop()
        if loop.time() >= self._next_sweep:
            self._next_sweep = loop.time() + self._poll_interval_s
            await drain(lambda: self.relay_once(self._grace_s), _BATCH)

    async def publish_committed(self) -> int:
        """Publish the rows handed over since the last time; mark the confirmed ones. Return
        how many were confirmed (the others are the sweep's)."""
        messages, self._committed = self._committed, []
        if not messages or not self._broker.is_ready:
            return 0
        results = await self._broker.publish_many(messages, _PUBLISH_TIMEOUT_S)
        done = self._confirmed(messages, results)
        if done:
            await outbox_sql.mark_outbox_published_lazily(self._pool, done)
        return len(done)

    async def relay_once(self, older_than_s: float = 0.0) -> int:
        """Publish one batch of unpublished rows committed more than `older_than_s` ago;
        return how many were confirmed."""
        outcome = await publish_unpublished(
            self._pool,
            self._broker,
            outbox_sql.lock_unpublished_outbox,
            _mark,
            on_events_exchange(self._broker, _outgoing, _PUBLISH_TIMEOUT_S),
            older_than_s=older_than_s,
            batch=_BATCH,
        )
        for row, error in outcome:
            if error is not None:
                _publish_failed(row.message_id, error)
        return confirmed(outcome)

    @staticmethod
    def _confirmed(
        messages: Sequence[Outgoing], results: Sequence[BaseException | None]
    ) -> list[str]:
        """The message ids of the confirmed publishes. Every confirmed row is marked,
        whatever failed before it: all of them were sent, and leaving them unmarked would
        only send them again (and a row that keeps failing would hold back every row after
        it)."""
        done = []
        for message, error in zip(messages, results, strict=True):
            if error is None:
                done.append(message.message_id)
            else:
                _publish_failed(message.message_id, error)
        return done


def _publish_failed(message_id: str, error: BaseException) -> None:
    log.warning("outbox.publish_failed", message_id=message_id, error=repr(error))


def _outgoing(row: outbox_sql.OutboxMessage) -> Outgoing:
    headers = {**_HEADERS, **row.headers} if row.headers else _HEADERS
    return Outgoing(row.routing_key, row.body, row.message_id, row.routing_key, headers)


async def _mark(conn: Executor, rows: list[outbox_sql.OutboxMessage]) -> None:
    await outbox_sql.mark_outbox_published(conn, [row.message_id for row in rows])
