"""How a worker's handler takes a batch: one transaction in a fixed order (no deadlock between
batches), again with a savepoint per message after a failure, the failed one routed alone;
a failure of the database itself fails the whole batch (nothing applied, all retried). The
batch's processed marks (the idempotency key) are read in one statement first and written in
one statement last."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg
import structlog

from shared.db import TRANSIENT_DB_ERRORS, Executor
from shared.errors import Dependency
from shared.outages import outage_of
from shared.queries import processed as processed_sql
from shared.vocabulary import REPLAY, REPROCESS

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a handler sees of one message."""

    message_id: str
    routing_key: str
    body: bytes
    attempts: int
    headers: Mapping[str, Any] = field(default_factory=dict)  # the message's, as received


# What a batch handler answers for each delivery, in order: its outcome (`ok`,
# `skipped_duplicate`) once committed, or the exception that failed it.
Result = str | Exception
BatchHandler = Callable[[Sequence[Delivery]], Awaitable[list[Result]]]


@dataclass(slots=True)
class Step:
    """One message's part of a batch transaction: its place in the batch, the connection and
    what to do once the batch has committed (metrics, logs, wake-ups)."""

    index: int
    conn: Executor
    then: list[Callable[[], None]] = field(default_factory=list)
    # What the handler leaves for the batch's `before_commit` (the email to send).
    value: Any = None
    # The message's sort key: its payment id in every worker ("" where the body has none).
    key: str = ""
    # What its processed mark records (the orders worker: the decision's reason).
    outcome: str = "ok"
    # False: the message took no effect to mark (the orders worker parked it): a later copy,
    # released or requeued, must still be processed.
    marked: bool = True

    def after_commit(self, action: Callable[[], None]) -> None:
        self.then.append(action)


StepHandler = Callable[[Step, Delivery], Awaitable[str]]
# Work of a handler's own between the batch's messages and its commit (the email worker's
# claims and sends): by their index in the batch, the steps whose result it changed, an
# exception failing one (it leaves the committed steps), a string its new outcome.
BeforeCommit = Callable[[Executor, list[Step]], Awaitable[Mapping[int, Result]]]
# What a handler does for the whole batch first thing in its transaction, in one statement:
# lock or read the rows of the batch's distinct keys (payment ids).
StartBatch = Callable[[Executor, list[str]], Awaitable[None]]


# How many times a batch is applied again after a copy of one of its events, handled by
# another batch meanwhile, committed first (its mark then skips it).
_RACES = 3


class _Raced(Exception):
    """A copy of one of the batch's events committed its mark first: apply it again."""


class _WithoutIt(Exception):
    """One message failed: the batch is rolled back and applied again without it."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(index)
        self.index, self.error = index, error


async def apply_batch(
    pool: asyncpg.Pool[Any],
    deliveries: Sequence[Delivery],
    handle: StepHandler,
    sort_key: Callable[[Delivery], str],
    before_commit: BeforeCommit | None = None,
    start: StartBatch | None = None,
    marks: str | None = None,
) -> tuple[list[Result | None], list[Step]]:
    """Apply the batch in one transaction (see above) and commit: the outcome or exception of
    each delivery and the steps committed. `start` runs first in the transaction (in each
    attempt); `before_commit` runs last and answers the steps it failed (they leave the
    committed ones) or whose outcome it changed. Raises what failed the database
    (connection, commit, deadlock): then nothing was applied. The savepoints cost two round
    trips per message, paid only by a batch that had a failure.

    `marks`: the worker whose processed marks make a redelivery a no-op. An event it has
    handled (or an earlier copy in this batch) is `skipped_duplicate` without reaching
    `handle`; the others' marks are written with their effects, before `before_commit`. A
    copy handled concurrently that commits its mark first leaves this batch's insert of the
    mark without a row: the batch is rolled back and applied again, and skips it then."""
    hooks = (before_commit, start, marks)
    for _ in range(_RACES):
        try:
            try:
                return await _attempt(pool, deliveries, handle, sort_key, hooks, without=None)
            except _WithoutIt as failed:  # rare: again, a savepoint per message this time
                return await _attempt(pool, deliveries, handle, sort_key, hooks, without=failed)
        except _Raced:
            continue
    raise RuntimeError(f"copies of this batch's events committed first {_RACES} times running")


async def _attempt(
    pool: asyncpg.Pool[Any],
    deliveries: Sequence[Delivery],
    handle: StepHandler,
    sort_key: Callable[[Delivery], str],
    hooks: tuple[BeforeCommit | None, StartBatch | None, str | None],
    without: _WithoutIt | None,
) -> tuple[list[Result | None], list[Step]]:
    """All or nothing (`without` None: _WithoutIt at the first message that fails), or all
    but the message `without` names, each under a savepoint (a failure is its result)."""
    results: list[Result | None] = [None] * len(deliveries)
    steps: list[Step] = []
    keys = [_key(sort_key, d) for d in deliveries]
    before_commit, start, marks = hooks
    async with pool.acquire() as conn, conn.transaction():
        if start is not None:
            await start(conn, sorted({key for key in keys if key}))
        # Read after start's locks: a copy that held them has committed its mark by now.
        handled = (
            await processed_sql.processed_of(conn, marks, [d.message_id for d in deliveries])
            if marks is not None
            else set()
        )
        # Marked before this batch, applied again once because an operator asked for it
        # (the REPROCESS header of a replay): such a message keeps the mark it has.
        marked_before, again = frozenset(handled), set[str]()
        for i in sorted(range(len(deliveries)), key=keys.__getitem__):
            message_id = deliveries[i].message_id
            if marks is not None and message_id in handled:
                if (
                    message_id in again
                    or message_id not in marked_before
                    or not reprocessing(deliveries[i])
                ):
                    results[i] = "skipped_duplicate"
                    continue
                again.add(message_id)
            step = Step(i, conn, key=keys[i])
            if message_id in again:
                step.after_commit(_reprocessed(marks, deliveries[i]))
            try:
                if without is None:
                    with about_payment(step.key):
                        results[i] = await handle(step, deliveries[i])
                elif i == without.index:
                    results[i] = without.error
                    continue
                else:
                    async with conn.transaction():  # a savepoint
                        with about_payment(step.key):
                            results[i] = await handle(step, deliveries[i])
            except TRANSIENT_DB_ERRORS:
                raise  # the database, not the message: the whole batch fails
            except Exception as e:
                if outage_of(e) is Dependency.POSTGRESQL:
                    raise  # a connection the server terminated under it, say: as above
                if without is None:
                    raise _WithoutIt(i, e) from e
                results[i] = e
                continue
            steps.append(step)
            handled.add(deliveries[i].message_id)  # a later copy in the batch is a duplicate
        to_mark = [s for s in steps if s.marked and deliveries[s.index].message_id not in again]
        if marks is not None and to_mark:
            marked = await processed_sql.mark_all_processed(
                conn, marks, [(deliveries[s.index].message_id, s.outcome) for s in to_mark]
            )
            if len(marked) < len(to_mark):
                raise _Raced
        if before_commit is not None:
            changed = await before_commit(conn, steps)
            for i, result in changed.items():
                results[i] = result
            steps = [step for step in steps if not isinstance(results[step.index], Exception)]
    return results, steps


class SetBatch(Protocol):
    """A handler that reads and writes a batch's rows together: `start` first in the batch's
    transaction (lock or read the rows of its keys), `handle` each message, `write` what the
    committed messages decided just before the commit (the email worker also sends there).
    Made afresh for each batch."""

    async def start(self, conn: Executor, keys: list[str]) -> None: ...

    async def handle(self, step: Step, delivery: Delivery) -> str: ...

    async def write(self, conn: Executor, steps: list[Step]) -> Mapping[int, Result]: ...


# What a batch whose `write` did what no rollback undoes (an email sent) answers when the
# batch failed after all (the commit, say): each delivery's result, given the error and how
# many deliveries there were. Without one, every delivery's result is the error.
Failed = Callable[[Exception, int], Awaitable[list[Result]]]


async def apply_set_batch(
    pool: asyncpg.Pool[Any],
    deliveries: Sequence[Delivery],
    batch: SetBatch,
    sort_key: Callable[[Delivery], str],
    marks: str | None = None,
    *,
    failed: Failed | None = None,
) -> list[Result]:
    """apply_batch for a SetBatch, committed: every delivery's result, after the committed
    steps' after-commit actions. A batch that failed as a whole (nothing applied) is retried
    whole, each delivery's result the error, unless `failed` says otherwise."""
    try:
        results, steps = await apply_batch(
            pool,
            deliveries,
            batch.handle,
            sort_key,
            before_commit=batch.write,
            start=batch.start,
            marks=marks,
        )
    except Exception as e:  # nothing was committed: every message is retried (or `failed`)
        return [e] * len(deliveries) if failed is None else await failed(e, len(deliveries))
    return committed(results, steps)


def committed(results: list[Result | None], steps: list[Step]) -> list[Result]:
    """After apply_batch's commit: each committed step's after-commit actions, and every
    delivery's result."""
    for step in steps:
        with about_payment(step.key):
            for action in step.then:
                action()
    return [r if r is not None else RuntimeError("not handled") for r in results]


def reprocessing(delivery: Delivery) -> bool:
    """Whether an operator's replay asked to apply this message although it was marked
    processed: the REPROCESS header (any non-empty value), which only a publisher with AMQP
    credentials can set; never anything in the body (shared/ops/replay.py)."""
    value = delivery.headers.get(REPROCESS)
    return isinstance(value, str | bytes) and len(value) > 0


def _reprocessed(worker: str | None, delivery: Delivery) -> Callable[[], None]:
    def logged() -> None:
        replay = delivery.headers.get(REPLAY)
        log.info(
            "message.reprocessed",
            worker=worker,
            message_id=delivery.message_id,
            replay=replay.decode() if isinstance(replay, bytes) else replay,
        )

    return logged


def keys_of(deliveries: Sequence[Delivery], sort_key: Callable[[Delivery], str]) -> list[str]:
    """The distinct keys (payment ids) of a batch, for reading its rows in one statement."""
    return sorted({key for d in deliveries if (key := _key(sort_key, d))})


def about_payment(payment_id: str | None) -> contextlib.AbstractContextManager[object]:
    """Every line logged within carries `payment_id` (structlog contextvars), if there is one:
    bound from what the batch read anyway, so no body is parsed again for it."""
    if not payment_id:
        return contextlib.nullcontext()
    return structlog.contextvars.bound_contextvars(payment_id=payment_id)


def _key(sort_key: Callable[[Delivery], str], delivery: Delivery) -> str:
    try:
        return sort_key(delivery)
    except Exception:  # a body the handler will reject: its place in the order doesn't matter
        return ""
