"""Batch handlers as tests drive them: a step handler in one transaction, and a batch handler
called with one delivery at a time (the services use shared/worker/batches.py's apply_set_batch)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from shared.worker.batches import (
    BatchHandler,
    Delivery,
    Result,
    StepHandler,
    apply_batch,
    committed,
)

# One message handled on its own, in its own transaction.
Handler = Callable[[Delivery], Awaitable[str]]


def in_one_transaction(
    pool: asyncpg.Pool[Any],
    handle: StepHandler,
    sort_key: Callable[[Delivery], str],
    marks: str | None = None,
) -> BatchHandler:
    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        try:
            results, steps = await apply_batch(pool, deliveries, handle, sort_key, marks=marks)
        except Exception as e:  # nothing was applied: every message is retried
            return [e] * len(deliveries)
        return committed(results, steps)

    return run


def one_by_one(handle: BatchHandler) -> Handler:
    """A batch handler called with one delivery at a time, raising what failed it."""

    async def run(delivery: Delivery) -> str:
        [result] = await handle([delivery])
        if isinstance(result, Exception):
            raise result
        return result

    return run
