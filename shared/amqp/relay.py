"""The relay for rows committed but never confirmed by RabbitMQ (ingest's inbox, the orders
outbox, the parked events an order's registration released or their park expired): lock a
batch SKIP LOCKED, publish it with confirms, mark the confirmed rows, all in one transaction,
so replicas relay side by side and no row is published by two at once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg

from shared.amqp.broker import Broker
from shared.amqp.outgoing import Outgoing
from shared.db import Executor

Row = TypeVar("Row")
Outcome = list[tuple[Row, BaseException | None]]


# Publishes a batch of rows and waits for their confirms: None per confirmed row, else why not.
Publish = Callable[[Sequence[Row]], Awaitable[Sequence[BaseException | None]]]


def on_events_exchange(
    broker: Broker, to_outgoing: Callable[[Row], Outgoing], timeout_s: float
) -> Publish[Row]:
    """Publish each row as its Outgoing message on the events exchange."""

    async def publish(rows: Sequence[Row]) -> Sequence[BaseException | None]:
        return await broker.publish_many([to_outgoing(r) for r in rows], timeout_s)

    return publish


async def publish_unpublished(
    pool: asyncpg.Pool[Any],
    broker: Broker,
    lock_rows: Callable[[Executor, float, int], Awaitable[Sequence[Row]]],
    mark: Callable[[Executor, list[Row]], Awaitable[None]],
    publish: Publish[Row],
    *,
    older_than_s: float,
    batch: int,
) -> Outcome[Row]:
    """One batch of the unpublished rows committed more than `older_than_s` ago: each row with
    None if its publish was confirmed (and it is marked), else the error. Every confirmed row
    is marked, whatever failed before it: a row that keeps failing holds back no other.
    Nothing while the broker is not ready."""
    if not broker.is_ready:
        return []
    async with pool.acquire() as conn, conn.transaction():
        rows = await lock_rows(conn, older_than_s, batch)
        if not rows:
            return []
        results = await publish(rows)
        outcome = list(zip(rows, results, strict=True))
        confirmed = [row for row, error in outcome if error is None]
        if confirmed:
            await mark(conn, confirmed)
    return outcome


def confirmed(outcome: Outcome[Row]) -> int:
    return sum(error is None for _, error in outcome)


async def drain(relay_once: Callable[[], Awaitable[int]], batch: int) -> None:
    """Relay batches while each was full and all confirmed: more may be waiting."""
    while await relay_once() == batch:
        pass
