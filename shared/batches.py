"""How a worker's handler takes a batch of deliveries.

`in_one_transaction`: the batch's messages are applied in one transaction, each under its own
savepoint, in a fixed order (the handler's `sort_key`, a payment id) so that two batches
taking the same rows never deadlock. A message that fails rolls back to its savepoint alone
and is routed on its own (retry ladder, DLQ); the others commit together. If the commit
itself fails, nothing of the batch was applied and every message is routed as failed.

`each_alone`: every delivery handled by its own handler call, concurrently (the email worker:
its SMTP send happens inside its own transaction).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

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
    """One message's part of a batch transaction: its connection (inside the message's
    savepoint) and what to do once the batch has committed (metrics, logs, wake-ups)."""

    conn: Executor
    then: list[Callable[[], None]] = field(default_factory=list)

    def after_commit(self, action: Callable[[], None]) -> None:
        self.then.append(action)


StepHandler = Callable[[Step, Delivery], Awaitable[str]]


def in_one_transaction(
    pool: asyncpg.Pool[Any], handle: StepHandler, sort_key: Callable[[Delivery], str]
) -> BatchHandler:
    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        results: list[Result | None] = [None] * len(deliveries)
        order = sorted(range(len(deliveries)), key=lambda i: _key(sort_key, deliveries[i]))
        committed: list[Step] = []
        try:
            async with pool.acquire() as conn, conn.transaction():
                for i in order:
                    step = Step(conn)
                    try:
                        async with conn.transaction():  # a savepoint
                            results[i] = await handle(step, deliveries[i])
                    except Exception as e:
                        results[i] = e
                    else:
                        committed.append(step)
        except Exception as e:  # the commit (or the connection) failed: nothing was applied
            return [r if isinstance(r, Exception) else e for r in results]
        for step in committed:
            for action in step.then:
                action()
        return [r if r is not None else RuntimeError("not handled") for r in results]

    return run


def each_alone(handle: Handler) -> BatchHandler:
    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        results = await asyncio.gather(*(handle(d) for d in deliveries), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # cancelled: the messages go back to the queue unacked
        return [r for r in results if isinstance(r, str | Exception)]

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
