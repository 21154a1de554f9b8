"""How a worker's handler takes a batch of deliveries.

`in_one_transaction`: the batch's messages are applied in one transaction in a fixed order
(the handler's `sort_key`, a payment id) so that two batches taking the same rows never
deadlock. When a message fails, the transaction is rolled back and the batch applied again
without it, a savepoint per message this time (two round trips per message, paid only by a
batch that had a failure); each failed message is routed on its own (retry ladder, DLQ). A
failure of the database itself (connection, deadlock, timeout) fails the whole batch:
nothing was applied and every message is routed as failed.

`apply_each`: every message under its own savepoint of a transaction the caller holds, for a
handler with work of its own between the messages and the commit (the email worker sends
its emails there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from shared.db import TRANSIENT_DB_ERRORS, Executor


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a handler sees of one message."""

    message_id: str
    routing_key: str
    body: bytes
    attempts: int


# What a batch handler answers for each delivery, in order: its outcome (`ok`,
# `skipped_duplicate`) once committed, or the exception that failed it.
Result = str | Exception
BatchHandler = Callable[[Sequence[Delivery]], Awaitable[list[Result]]]
# One message handled on its own, in its own transaction.
Handler = Callable[[Delivery], Awaitable[str]]


@dataclass(slots=True)
class Step:
    """One message's part of a batch transaction: its place in the batch, the connection
    (inside the message's savepoint) and what to do once the batch has committed (metrics,
    logs, wake-ups)."""

    index: int
    conn: Executor
    then: list[Callable[[], None]] = field(default_factory=list)

    def after_commit(self, action: Callable[[], None]) -> None:
        self.then.append(action)


StepHandler = Callable[[Step, Delivery], Awaitable[str]]


async def apply_each(
    conn: PoolConnectionProxy[Any],
    deliveries: Sequence[Delivery],
    handle: StepHandler,
    sort_key: Callable[[Delivery], str],
    *,
    skip: int | None = None,
) -> tuple[list[Result | None], list[Step]]:
    """Each delivery (but the one at `skip`) under its own savepoint of `conn`'s transaction,
    in `sort_key` order: the outcome or exception of each (None if not applied) and the steps
    that succeeded."""
    results: list[Result | None] = [None] * len(deliveries)
    succeeded: list[Step] = []
    for i in _ordered(deliveries, sort_key):
        if i == skip:
            continue
        step = Step(i, conn)
        try:
            async with conn.transaction():  # a savepoint
                results[i] = await handle(step, deliveries[i])
        except Exception as e:
            results[i] = e
        else:
            succeeded.append(step)
    return results, succeeded


class _WithoutIt(Exception):
    """One message failed: the batch is rolled back and applied again without it."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(index)
        self.index, self.error = index, error


def in_one_transaction(
    pool: asyncpg.Pool[Any], handle: StepHandler, sort_key: Callable[[Delivery], str]
) -> BatchHandler:
    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        results: list[Result | None] = [None] * len(deliveries)
        try:
            try:
                results, steps = await _all_or_nothing(pool, deliveries, handle, sort_key)
            except _WithoutIt as failed:  # rare: again, a savepoint per message this time
                async with pool.acquire() as conn, conn.transaction():
                    results, steps = await apply_each(
                        conn, deliveries, handle, sort_key, skip=failed.index
                    )
                    results[failed.index] = failed.error
        except Exception as e:  # the commit or the connection failed: nothing was applied
            return [e if r is None or isinstance(r, str) else r for r in results]
        for step in steps:
            for action in step.then:
                action()
        return [r if r is not None else RuntimeError("not handled") for r in results]

    return run


async def _all_or_nothing(
    pool: asyncpg.Pool[Any],
    deliveries: Sequence[Delivery],
    handle: StepHandler,
    sort_key: Callable[[Delivery], str],
) -> tuple[list[Result | None], list[Step]]:
    """Every delivery in one transaction; _WithoutIt as soon as one message fails (the
    transaction rolled back), a database failure as itself."""
    results: list[Result | None] = [None] * len(deliveries)
    steps: list[Step] = []
    async with pool.acquire() as conn, conn.transaction():
        for i in _ordered(deliveries, sort_key):
            steps.append(step := Step(i, conn))
            try:
                results[i] = await handle(step, deliveries[i])
            except TRANSIENT_DB_ERRORS:
                raise  # the database, not the message: the whole batch fails
            except Exception as e:
                raise _WithoutIt(i, e) from e
    return results, steps


def _ordered(deliveries: Sequence[Delivery], sort_key: Callable[[Delivery], str]) -> list[int]:
    return sorted(range(len(deliveries)), key=lambda i: _key(sort_key, deliveries[i]))


def one_by_one(handle: BatchHandler) -> Handler:
    """A batch handler called with one delivery at a time, raising what failed it."""

    async def run(delivery: Delivery) -> str:
        [result] = await handle([delivery])
        if isinstance(result, Exception):
            raise result
        return result

    return run


def _key(sort_key: Callable[[Delivery], str], delivery: Delivery) -> str:
    try:
        return sort_key(delivery)
    except Exception:  # a body the handler will reject: its place in the order doesn't matter
        return ""
