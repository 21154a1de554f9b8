"""How a worker's handler takes a batch of deliveries.

`in_one_transaction`: the batch's messages are applied in one transaction, each under its own
savepoint, in a fixed order (the handler's `sort_key`, a payment id) so that two batches
taking the same rows never deadlock. A message that fails rolls back to its savepoint alone
and is routed on its own (retry ladder, DLQ); the others commit together. If the commit
itself fails, nothing of the batch was applied and every message is routed as failed.

`apply_each` is that loop alone, for a handler with work of its own between the messages and
the commit (the email worker sends its emails there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from shared.db import Executor


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
) -> tuple[list[Result | None], list[Step]]:
    """Each delivery under its own savepoint of `conn`'s transaction, in `sort_key` order:
    the outcome or exception of each (None if never reached) and the steps that succeeded."""
    results: list[Result | None] = [None] * len(deliveries)
    succeeded: list[Step] = []
    for i in sorted(range(len(deliveries)), key=lambda i: _key(sort_key, deliveries[i])):
        step = Step(i, conn)
        try:
            async with conn.transaction():  # a savepoint
                results[i] = await handle(step, deliveries[i])
        except Exception as e:
            results[i] = e
        else:
            succeeded.append(step)
    return results, succeeded


def in_one_transaction(
    pool: asyncpg.Pool[Any], handle: StepHandler, sort_key: Callable[[Delivery], str]
) -> BatchHandler:
    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        results: list[Result | None] = [None] * len(deliveries)
        try:
            async with pool.acquire() as conn, conn.transaction():
                results, committed = await apply_each(conn, deliveries, handle, sort_key)
        except Exception as e:  # the commit (or the connection) failed: nothing was applied
            return [r if isinstance(r, Exception) else e for r in results]
        for step in committed:
            for action in step.then:
                action()
        return [r if r is not None else RuntimeError("not handled") for r in results]

    return run


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
