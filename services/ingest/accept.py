"""The accept path: store and publish webhooks in shared batches (group commit).

Concurrent requests hand their webhook to one Acceptor. A batch shares one INSERT statement
(one commit) and one burst of publishes whose confirms are awaited together, so at load the
cost of a round-trip to PostgreSQL and to RabbitMQ is paid once per batch, not per request.
Batches form by themselves: while `max_in_flight` batches are busy, newcomers queue up and
leave together in the next one, up to `max_pending` of them: beyond that (overload), or while
RabbitMQ blocks publishers, a request is refused at once (503). A request is answered
`accepted` only when its row is committed and its message confirmed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import asyncpg
import structlog

from services.ingest.publishing import (
    ClaimedPublisher,
    ClaimedRow,
    outgoing,
    retry_deadlock,
    wait_published,
)
from services.ingest.webhook import Webhook
from shared.broker import BlockedError, Broker
from shared.errors import PermanentError, UnavailableError
from shared.metrics import IngestMetrics
from shared.queries import inbox as inbox_sql
from shared.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

PROVIDER = "xhub"


class UnstorableWebhookError(PermanentError):
    """PostgreSQL refuses the event's data itself (answered 400: retrying can't help)."""


class OverloadedError(UnavailableError):
    """More webhooks wait for a batch than the acceptor admits: refused before any work."""


class Outcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class AcceptorConfig:
    max_batch: int = 256
    max_in_flight: int = 2
    # Webhooks waiting for a batch. Beyond it the wait would only grow (more arrive than the
    # batches take) until the handler's budget runs out: refuse at once instead. Two batches'
    # worth keeps the batches full; the last one in waits about three batch times.
    max_pending: int = 512
    db_timeout_s: float = 4.0
    publish_timeout_s: float = 4.0
    # How long a claim on an unconfirmed row lasts before a retry or the sweeper may take it
    # over: longer than a batch's own deadlines, short against the provider's ladder.
    claim_lease_s: float = 10.0
    # How long after its arrival a copy waits for another holder of the event's claim (another
    # replica) to publish or let go of it before 503; a publish from here may follow, and
    # both together stay inside the handler's ACCEPT_BUDGET_S.
    holder_wait_s: float = 3.0


def _new_future() -> asyncio.Future[Outcome]:
    future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
    # The request may be gone (client hung up) when its batch fails: mark the error seen.
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


@dataclass(slots=True)
class _Item:
    webhook: Webhook
    headers: dict[str, str]
    future: asyncio.Future[Outcome] = field(default_factory=_new_future)
    arrived: float = field(default_factory=time.monotonic)


class AbandonedClaims:
    """Claims of this process's batches that gave up without knowing whether their rows were
    written; remembered for one lease, after which any claim lapses anyway."""

    def __init__(self, lease_s: float) -> None:
        self._lease_s = lease_s
        self._until: dict[uuid.UUID, float] = {}

    def add(self, claim: uuid.UUID) -> None:
        self._until[claim] = time.monotonic() + self._lease_s

    def active(self) -> list[uuid.UUID]:
        now = time.monotonic()
        for claim in [c for c, until in self._until.items() if until < now]:
            del self._until[claim]
        return list(self._until)


class Acceptor:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        broker: Broker,
        metrics: IngestMetrics,
        config: AcceptorConfig | None = None,
    ) -> None:
        self._pool = pool
        self._broker = broker
        self._metrics = metrics
        self._config = config or AcceptorConfig()
        self._pending: list[_Item] = []
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(self._config.max_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self.publisher = ClaimedPublisher(pool, broker, self._config.publish_timeout_s)
        self._abandoned = AbandonedClaims(self._config.claim_lease_s)

    async def accept(self, webhook: Webhook, headers: dict[str, str]) -> Outcome:
        """Store and publish; raise UnavailableError when either could not be done, or at
        once (OverloadedError, BlockedError) when it cannot be done now."""
        if len(self._pending) >= self._config.max_pending:
            raise OverloadedError(f"{len(self._pending)} webhooks already wait for a batch")
        if self._broker.blocked:
            raise BlockedError()
        item = _Item(webhook, headers)
        self._pending.append(item)
        self._wakeup.set()
        # Shielded: a client that hangs up does not cancel the batch its request sits in.
        return await asyncio.shield(item.future)

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._dispatch(), name="acceptor")

    async def close(self) -> None:
        """Finish every batch already taken, answer the rest 503."""
        if self._loop_task is not None:
            await cancel_and_wait(self._loop_task)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for item in self._pending:
            if not item.future.done():
                item.future.set_exception(UnavailableError("ingest is shutting down"))
        self._pending.clear()
        await self.publisher.close()

    async def _dispatch(self) -> None:
        while True:
            await self._wakeup.wait()
            await self._slots.acquire()
            batch = self._pending[: self._config.max_batch]
            del self._pending[: self._config.max_batch]
            if not self._pending:
                self._wakeup.clear()
            if not batch:
                self._slots.release()
                continue
            task = asyncio.create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Item]) -> None:
        try:
            await self._store_and_publish(batch)
        except Exception as e:  # never leave a request without an answer
            log.exception("ingest.batch_failed")
            _fail(batch, UnavailableError(f"accept failed: {e!r}"))
        finally:
            self._slots.release()

    async def _store_and_publish(self, batch: list[_Item]) -> None:
        self._metrics.accept_batch_size.observe(len(batch))
        # Copies of one event inside a batch ride on the first copy (ON CONFLICT cannot
        # touch one row twice in a statement).
        groups: dict[str, list[_Item]] = {}
        for item in batch:
            key = inbox_sql.storable_text(item.webhook.event_id)
            groups.setdefault(key, []).append(item)
        # Sorted: concurrent batches lock the rows they share in the same order (no deadlock).
        entries = [
            inbox_sql.InboxEntry(
                event_id=key,
                event_type=w.event_type,
                payment_id=w.payment_id,
                body=w.body,
                headers=items[0].headers,
            )
            for key, items in sorted(groups.items())
            for w in [items[0].webhook]
        ]
        held = self.publisher.reserve([e.event_id for e in entries])
        claim = uuid.uuid4()
        try:
            async with asyncio.timeout(self._config.db_timeout_s):
                stored = await retry_deadlock(lambda: self._store(entries, claim))
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            # The INSERT may still commit (a stalled connection): its rows would sit claimed by
            # a batch that is gone. Copies arriving later may take such a claim over at once.
            self._abandoned.add(claim)
            for event_id, placeholder in held.items():
                self.publisher.settle_reserved(event_id, placeholder, ok=False)
            log.warning("ingest.db_unavailable", error=repr(e), batch=len(batch))
            _fail(batch, UnavailableError("PostgreSQL unavailable"))
            return
        to_publish = [
            ClaimedRow(
                stored[e.event_id].id,
                e.event_id,
                outgoing(PROVIDER, e.event_id, e.event_type, e.body),
            )
            for e in entries
            if e.event_id in stored and stored[e.event_id].must_publish
        ]
        publishing = {row.event_id for row in to_publish}
        for event_id, placeholder in held.items():
            if event_id not in publishing:
                row = stored.get(event_id)
                self.publisher.settle_reserved(
                    event_id, placeholder, ok=bool(row and row.published)
                )
        started = time.perf_counter()
        results = await self.publisher.publish(claim, to_publish, held)
        if to_publish:
            self._metrics.publish_confirm_duration.observe(time.perf_counter() - started)
        errors = {row.event_id: err for row, err in zip(to_publish, results, strict=True)}
        for event_id, items in groups.items():
            row = stored.get(event_id)
            if row is None:
                _fail(items, UnstorableWebhookError("the event cannot be stored as sent"))
            elif event_id in errors:  # this batch published it
                if (error := errors[event_id]) is not None:
                    log.warning("ingest.publish_failed", event_id=event_id, error=repr(error))
                    _fail(items, UnavailableError("RabbitMQ did not confirm"))
                else:
                    first, *copies = items
                    _resolve(first, Outcome.ACCEPTED if row.inserted else Outcome.DUPLICATE)
                    for copy in copies:
                        _resolve(copy, Outcome.DUPLICATE)
            elif row.published:
                for item in items:
                    _resolve(item, Outcome.DUPLICATE)
            else:
                self._await_other_publish(row.id, event_id, items)

    def _await_other_publish(self, row_id: int, event_id: str, items: list[_Item]) -> None:
        """A copy of an event whose first copy is stored but not yet confirmed.

        If this process is publishing it, the copies wait for that confirm (the request
        budget bounds the wait). Otherwise another replica, or a batch that gave up, holds
        the claim: the copies watch the row for its publish, and take the claim over if it
        is released or lapses. Never 200 before a confirm.
        """
        if event_id in self.publisher.recently_confirmed:
            for item in items:
                _resolve(item, Outcome.DUPLICATE)
            return
        pending = self.publisher.in_flight.get(event_id)
        if pending is None:
            self._spawn(self._await_holder(row_id, event_id, items))
        else:
            self._spawn(self._await_in_process(pending, items))

    async def _await_in_process(self, pending: asyncio.Future[None], items: list[_Item]) -> None:
        if await wait_published(pending):
            for item in items:
                _resolve(item, Outcome.DUPLICATE)
        else:
            _fail(items, UnavailableError("the first copy of this event was not confirmed"))

    async def _await_holder(self, row_id: int, event_id: str, items: list[_Item]) -> None:
        webhook = items[0].webhook
        row = ClaimedRow(
            row_id, event_id, outgoing(PROVIDER, event_id, webhook.event_type, webhook.body)
        )
        try:
            published = await self.publisher.publish_after_holder(
                row,
                deadline=min(item.arrived for item in items) + self._config.holder_wait_s,
                lease_s=self._config.claim_lease_s,
                abandoned=self._abandoned.active,
            )
        except Exception as e:  # never leave a request without an answer
            log.warning("ingest.holder_wait_failed", event_id=event_id, error=repr(e))
            published = False
        if published:
            for item in items:
                _resolve(item, Outcome.DUPLICATE)
        else:
            _fail(items, UnavailableError("the first copy of this event is not confirmed yet"))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store(
        self, entries: list[inbox_sql.InboxEntry], claim: uuid.UUID
    ) -> dict[str, inbox_sql.StoredEntry]:
        """Store the batch in one statement; by event id. If PostgreSQL refuses the data
        itself, store one by one so a single unstorable event can't fail its neighbours;
        the ones it refuses alone are left out of the answer."""
        lease = self._config.claim_lease_s
        try:
            rows = await inbox_sql.store_batch(
                self._pool, PROVIDER, entries, claim, lease, self._abandoned.active()
            )
        except (asyncpg.DataError, asyncpg.ProgramLimitExceededError):
            # Refused data, or a value too large for an index: about the rows, not the server.
            if len(entries) == 1:
                log.warning("ingest.unstorable", event_id=entries[0].event_id, exc_info=True)
                return {}
            rows = []
            for entry in entries:
                rows.extend((await self._store([entry], claim)).values())
        return {r.event_id: r for r in rows}


def _resolve(item: _Item, outcome: Outcome) -> None:
    if not item.future.done():
        item.future.set_result(outcome)


def _fail(items: Sequence[_Item], error: Exception) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(error)
