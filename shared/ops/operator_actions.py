"""Operator actions, each done and recorded in the audit trail by one function: the api, the
console and the CLI only parse their input and render the answer, so no edge can act unaudited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeAlias

import asyncpg
from aio_pika.abc import AbstractChannel
from asyncpg.pool import PoolConnectionProxy

from shared import resolution
from shared.amqp.topology import Topology
from shared.db import Executor
from shared.errors import UnavailableError
from shared.ops import dlq, dlq_lock, erasure, order_resolution, worker_input
from shared.ops.connections import UnreachableError
from shared.ops.dlq_moves import Progress, Selection, purge, requeue
from shared.ops.order_input import order_json
from shared.ops.replay import Plan, ReplayPublishError, plan, publish
from shared.ops.replay_selection import ReplayRequest
from shared.queries import audit
from shared.queries import orders as orders_sql
from shared.queries import worker_controls as worker_sql
from shared.queries.orders import NewOrder

# Where the audit row goes: a pool or connection at hand, or one to open after the action
# (the CLI's: a database that cannot be reached then is logged, the action stands).
Trail: TypeAlias = "Executor | Callable[[], AbstractAsyncContextManager[Executor]]"


class Edge(StrEnum):
    """Through which the operator acted: the audit trail's `source`."""

    API = "api"
    CONSOLE = "console"
    CLI = "cli"


@dataclass(frozen=True, slots=True)
class Operator:
    name: str  # a token's name, or `cli:` and the OS user
    edge: Edge


async def _record(trail: Trail, action: audit.Action) -> None:
    if not callable(trail):
        await audit.record(trail, action)
        return
    try:
        async with trail() as conn:
            await audit.record(conn, action)
    except UnreachableError as e:
        audit.not_recorded(action, e)


@dataclass(frozen=True, slots=True)
class Requeued:
    """What a requeue moved (or a dry run would move), and the ids it did not find."""

    ids: list[str]
    not_found: list[str]
    dry_run: bool

    def as_json(self) -> dict[str, Any]:
        """The one answer of every edge (SPEC section 7, with the api's dry-run fields)."""
        return {
            "requeued": 0 if self.dry_run else len(self.ids),
            "would_requeue": len(self.ids) if self.dry_run else None,
            "dry_run": self.dry_run,
            "ids": self.ids,
            "not_found": self.not_found,
        }


async def requeue_recorded(
    channel: AbstractChannel,
    queue: str,
    selection: Selection,
    by: Operator,
    trail: Trail,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> tuple[Requeued, list[dlq.DeadLetter]]:
    """Requeue from the DLQ `queue` (its full name) and record it; a dry run is no action.
    Also returns the letters themselves, for the edges that list them."""
    result = await requeue(
        channel, queue, selection, limit=limit, dry_run=dry_run, progress=progress
    )
    ids = [letter.id for letter in result.requeued]
    if not dry_run:
        what = selection.as_json() | ({} if limit is None else {"limit": limit})
        await _record(
            trail, audit.Action(by.name, by.edge.value, audit.REQUEUE, queue, ids, len(ids), what)
        )
    return Requeued(ids, result.not_found, dry_run), result.requeued


@dataclass(frozen=True, slots=True)
class Purged:
    messages: list[dlq.DeadLetter]

    def as_json(self) -> dict[str, Any]:
        return {"purged": len(self.messages), "messages": [d.as_json() for d in self.messages]}


async def purge_recorded(
    channel: AbstractChannel,
    queue: str,
    by: Operator,
    trail: Trail,
    *,
    progress: Progress | None = None,
) -> Purged:
    """Delete every message now in the DLQ `queue` and record it."""
    removed = await purge(channel, queue, progress=progress)
    ids = [d.id for d in removed]
    await _record(trail, audit.Action(by.name, by.edge.value, audit.PURGE, queue, ids, len(ids)))
    return Purged(removed)


@dataclass(frozen=True, slots=True)
class Registered:
    order: dict[str, Any]  # as the api shows it
    created: bool  # False: the same order was already registered

    def as_json(self) -> dict[str, Any]:
        return self.order


async def register_order_recorded(db: Executor, order: NewOrder, by: Operator) -> Registered:
    """Register the order (idempotent on its id) and record it when it is new;
    orders_sql.OrderConflictError if its id or payment id is another order's."""
    row, created = await orders_sql.register_order(db, order)
    if created:
        registered = audit.Action(
            by.name, by.edge.value, audit.ORDER_REGISTER, order.order_id, [order.payment_id], 1
        )
        await _record(db, registered)
    return Registered(order_json(row), created)


async def dead_letters_or_reason(
    channel: Callable[[], AbstractAsyncContextManager[AbstractChannel]],
    topology: Topology,
    payment_id: str,
) -> tuple[list[dlq.DeadLetter], str | None]:
    """A payment's dead letters, or none and why they could not be read: the database holds
    most of a payment's story, so a view gives it and says what is missing."""
    try:
        async with channel() as opened:
            letters = await dlq.dead_letters_for_payment(
                opened, topology, payment_id, lock_wait_s=dlq_lock.VIEW_LOCK_WAIT_S
            )
    except (UnavailableError, UnreachableError, dlq_lock.DlqBusyError, dlq.MissingQueueError) as e:
        return [], str(e)
    return letters, None


async def replay_recorded(
    db: Executor,
    channel: Callable[[], AbstractAsyncContextManager[AbstractChannel]],
    topology: Topology,
    request: ReplayRequest,
    by: Operator,
    trail: Trail,
    *,
    dry_run: bool,
) -> Plan:
    """Replay stored events (shared/ops/replay.py) and record it: the selection, the workers,
    reprocess and its reason, the counts per worker, the event ids. A dry run counts and
    moves nothing (no record). A publish that fails half-way is recorded with what was
    published before it, then raised (ReplayPublishError)."""
    planned = await plan(db, request)
    planned.dry_run = dry_run
    if dry_run:
        return planned
    try:
        async with channel() as opened:  # only a real run needs RabbitMQ
            await publish(opened, topology, planned)
    except ReplayPublishError:
        await _record(trail, _replayed(planned, by, partial=True))
        raise
    await _record(trail, _replayed(planned, by, partial=False))
    return planned


def _replayed(planned: Plan, by: Operator, *, partial: bool) -> audit.Action:
    what = {
        **planned.request.as_json(),
        "replay_id": planned.replay_id,
        "workers": {w: p.as_json() for w, p in planned.workers.items()},
        "reprocess": planned.request.reprocess,
        "reason": planned.request.reason,
        "no_route": planned.no_route,
    } | ({"partial": True} if partial else {})
    target = ",".join(planned.workers) or "-"
    return audit.Action(
        by.name, by.edge.value, audit.REPLAY, target, planned.event_ids, planned.published, what
    )


async def resolve_order_recorded(
    db: Executor,
    payment_id: str,
    request: resolution.Request,
    by: Operator,
    dead_lettered: order_resolution.DeadLettered | None = None,
) -> order_resolution.Resolved:
    """Move the payment's order to `request.to` as the operator's transition, with its audit
    row, in one transaction under the payment's lock (the one the orders worker takes, so a
    provider event and a resolve never interleave). The transition goes out through the
    outbox as any `order.*` one does, so the ledger and the emails follow it exactly as they
    follow a provider's. Raises PaymentNotFoundError, InFlightError (an event of the payment
    is parked, or stored and not yet processed by the orders worker; one in orders.dlq, as
    `dead_lettered` tells, is not on its way), or resolution.ResolveRefusedError
    (shared/ops/order_resolution.py does the work)."""

    async def record(conn: Executor, resolved: order_resolution.Resolved) -> None:
        detail = {
            "from": resolved.from_status,
            "to": resolved.to_status,
            "forced": resolved.forced,
            "reason": resolved.reason,
        }
        action = audit.Action(
            by.name, by.edge.value, audit.ORDER_RESOLVE, payment_id, [resolved.event_id], 1, detail
        )
        await audit.record_in_transaction(conn, action)

    who = (by.name, by.edge.value)
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            return await order_resolution.resolve(
                conn, payment_id, request, who, dead_lettered, record
            )
    return await order_resolution.resolve(db, payment_id, request, who, dead_lettered, record)


# Workers: an operator's pause and rate cap (shared/worker/controls.py applies them). Each
# changes the worker's row, NOTIFYs every replica and records the action, in one transaction.


class WorkerStateError(ValueError):
    """The action would change nothing: paused already, not paused, no cap to lift."""


@dataclass(frozen=True, slots=True)
class WorkerChanged:
    controls: worker_sql.Controls
    previous: dict[str, Any]  # what the action replaced or ended

    def as_json(self) -> dict[str, Any]:
        return self.controls.as_json() | {"previous": self.previous}


async def pause_worker_recorded(
    pool: Executor, worker: str, reason: str, by: Operator
) -> WorkerChanged:
    """Pause every replica of `worker`; WorkerStateError if it is paused already (resume it
    first: who paused it, and why, is never overwritten)."""
    worker = _known_worker(worker)
    async with _transaction(pool) as conn:
        paused = await worker_sql.pause(conn, worker, by.name, reason)
        if paused is None:
            now = await worker_sql.controls(conn, worker)
            raise WorkerStateError(
                f"{worker} is paused already, by {now.paused_by} since"
                f" {now.paused_at.isoformat() if now.paused_at else '?'}: {now.paused_reason}"
            )
        await worker_sql.notify(conn, worker)
        action = audit.Action(
            by.name, by.edge.value, worker_input.PAUSE, worker, [], 1, {"reason": reason}
        )
        await audit.record(conn, action)
        return WorkerChanged(await worker_sql.controls(conn, worker), {})


async def resume_worker_recorded(pool: Executor, worker: str, by: Operator) -> WorkerChanged:
    """End the operator's pause of `worker`; WorkerStateError if it is not paused."""
    worker = _known_worker(worker)
    async with _transaction(pool) as conn:
        ended = await worker_sql.resume(conn, worker)
        if ended is None or ended.paused_at is None:
            raise WorkerStateError(f"{worker} is not paused")
        await worker_sql.notify(conn, worker)
        was = {
            "paused_by": ended.paused_by,
            "paused_reason": ended.paused_reason,
            "paused_at": ended.paused_at.isoformat(),
        }
        await audit.record(
            conn, audit.Action(by.name, by.edge.value, worker_input.RESUME, worker, [], 1, was)
        )
        return WorkerChanged(await worker_sql.controls(conn, worker), was)


async def throttle_worker_recorded(
    pool: Executor, worker: str, per_second: float, by: Operator
) -> WorkerChanged:
    """Cap `worker` at `per_second` messages per second over all its replicas (a cap it had
    is replaced)."""
    worker = _known_worker(worker)
    async with _transaction(pool) as conn:
        previous = await worker_sql.throttle(conn, worker, per_second, by.name)
        await worker_sql.notify(conn, worker)
        what = {"per_second": per_second, "previous_per_second": previous}
        await audit.record(
            conn, audit.Action(by.name, by.edge.value, worker_input.THROTTLE, worker, [], 1, what)
        )
        return WorkerChanged(
            await worker_sql.controls(conn, worker), {"rate_limit_per_second": previous}
        )


async def unthrottle_worker_recorded(pool: Executor, worker: str, by: Operator) -> WorkerChanged:
    """Lift `worker`'s cap; WorkerStateError if it has none."""
    worker = _known_worker(worker)
    async with _transaction(pool) as conn:
        lifted = await worker_sql.unthrottle(conn, worker)
        if lifted is None:
            raise WorkerStateError(f"{worker} has no rate limit")
        await worker_sql.notify(conn, worker)
        what = {"previous_per_second": lifted}
        await audit.record(
            conn,
            audit.Action(by.name, by.edge.value, worker_input.UNTHROTTLE, worker, [], 1, what),
        )
        return WorkerChanged(
            await worker_sql.controls(conn, worker), {"rate_limit_per_second": lifted}
        )


def _known_worker(raw: str) -> str:
    """The worker's own name (`emails` is the email worker); WorkerInputError if none."""
    worker = worker_input.worker_name(raw)
    if worker is None:
        raise worker_input.WorkerInputError(f"no worker {raw!r}: one of {worker_input.WORKERS}")
    return worker


@asynccontextmanager
async def _transaction(db: Executor) -> AsyncIterator[Executor]:
    """A transaction on `db`'s connection (a pool lends one)."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn, conn.transaction():
            yield conn
    else:
        async with db.transaction():
            yield db


async def erase_recorded(
    db: Executor, selector: erasure.Selector, by: Operator, archive_dir: Path | None = None
) -> erasure.Erased:
    """Erase a person's data (shared/ops/erasure.py) and record it, in one transaction: an
    erasure never stands unrecorded. Every request is recorded, one that found nothing left to
    change too (count 0: the evidence that it was asked and done). The audit row never holds
    the address: its target is `email`, `user:<id>` or `order:<id>`, its ids the orders
    erased now, its count the rows changed and its filter those counts per table.
    erasure.PersonNotFoundError (nothing recorded) for an unknown user or order id; the
    archive errors of erasure.erase (nothing erased, nothing recorded). The archive files the
    erasure replaced are removed after the commit."""

    async def run(conn: asyncpg.Connection[Any] | PoolConnectionProxy[Any]) -> erasure.Erased:
        async with conn.transaction():
            erased = await erasure.erase(conn, selector, archive_dir)
            detail = {
                "by": selector.by.value,
                "rows": erased.rows,
                "already_erased": erased.already_erased,
            }
            action = audit.Action(
                by.name,
                by.edge.value,
                audit.PERSON_ERASE,
                selector.target(),
                erased.orders,
                erased.changed,
                detail,
            )
            await audit.record_in_transaction(conn, action)
            return erased

    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            erased = await run(conn)
    else:
        erased = await run(db)
    # Committed: the archive files it replaced (holding the address) go.
    for path in erased.replaced_files:
        await asyncio.to_thread(path.unlink, missing_ok=True)
    return erased
