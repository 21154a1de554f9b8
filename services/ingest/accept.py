"""The accept path: store and publish webhooks in shared batches (group commit).

Concurrent requests hand their webhook to one Acceptor. A batch shares one INSERT statement
(one commit) and one burst of publishes whose confirms are awaited together, so at load the
cost of a round-trip to PostgreSQL and to RabbitMQ is paid once per batch, not per request.
Batches form by themselves: while `max_in_flight` batches are busy, newcomers queue up and
leave together in the next one. A request is answered `accepted` only when its row is
committed and its message confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import asyncpg
import structlog

from services.ingest.webhook import Webhook
from shared import queries
from shared.broker import Broker, Outgoing
from shared.errors import PermanentError, UnavailableError
from shared.metrics import IngestMetrics
from shared.topology import message_id, routing_key

log = structlog.get_logger(__name__)

PROVIDER = "xhub"


class UnstorableWebhookError(PermanentError):
    """PostgreSQL refuses the event's data itself (answered 400: retrying can't help)."""


class Outcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class AcceptorConfig:
    max_batch: int = 256
    max_in_flight: int = 4
    db_timeout_s: float = 4.0
    publish_timeout_s: float = 4.0
    # How long a request's claim on an unconfirmed row lasts before the sweeper may take it.
    claim_lease_s: float = 15.0


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


def outgoing(provider: str, event_id: str, event_type: str, body: bytes) -> Outgoing:
    # AMQP short strings hold 255 bytes: the full event type and id stay in the body/inbox.
    key = routing_key(event_type)
    return Outgoing(
        routing_key=key,
        body=body,
        message_id=message_id(event_id),
        type=key,
        headers={"provider": provider},
    )


async def publish_claimed(
    pool: asyncpg.Pool[Any],
    broker: Broker,
    claim: uuid.UUID,
    rows: Sequence[tuple[int, Outgoing]],
    timeout_s: float,
) -> list[BaseException | None]:
    """Publish claimed rows; release the claims of those that failed. One result per row."""
    results = await broker.publish_many([o for _, o in rows], timeout_s)
    failed = [row_id for (row_id, _), err in zip(rows, results, strict=True) if err is not None]
    if failed:
        with contextlib.suppress(Exception):
            await queries.release_claims(pool, failed, claim)
    return results


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

    async def accept(self, webhook: Webhook, headers: dict[str, str]) -> Outcome:
        """Store and publish; raise UnavailableError when either could not be done."""
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
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for item in self._pending:
            if not item.future.done():
                item.future.set_exception(UnavailableError("ingest is shutting down"))
        self._pending.clear()

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
        published: list[int] = []
        try:
            published = await self._store_and_publish(batch)
        except Exception as e:  # never leave a request without an answer
            log.exception("ingest.batch_failed")
            _fail(batch, UnavailableError(f"accept failed: {e!r}"))
        finally:
            self._slots.release()
        if published:
            # After the answers: a lost mark only means the sweeper publishes a second copy,
            # which consumers dedup by message id.
            try:
                await queries.mark_published(self._pool, published)
            except Exception as e:
                log.warning("ingest.mark_published_failed", error=repr(e), rows=len(published))

    async def _store_and_publish(self, batch: list[_Item]) -> list[int]:
        self._metrics.accept_batch_size.observe(len(batch))
        # Copies of one event inside a batch ride on the first copy (ON CONFLICT cannot
        # touch one row twice in a statement).
        groups: dict[str, list[_Item]] = {}
        for item in batch:
            key = queries.storable_text(item.webhook.event_id)
            groups.setdefault(key, []).append(item)
        entries = [
            queries.InboxEntry(
                event_id=key,
                event_type=w.event_type,
                payment_id=w.payment_id,
                body=w.body,
                headers=items[0].headers,
            )
            for key, items in groups.items()
            for w in [items[0].webhook]
        ]
        claim = uuid.uuid4()
        try:
            async with asyncio.timeout(self._config.db_timeout_s):
                stored = await self._store(entries, claim)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            log.warning("ingest.db_unavailable", error=repr(e), batch=len(batch))
            _fail(batch, UnavailableError("PostgreSQL unavailable"))
            return []
        to_publish = [
            (stored[e.event_id].id, outgoing(PROVIDER, e.event_id, e.event_type, e.body))
            for e in entries
            if e.event_id in stored and stored[e.event_id].must_publish
        ]
        started = time.perf_counter()
        results = await publish_claimed(
            self._pool, self._broker, claim, to_publish, self._config.publish_timeout_s
        )
        if to_publish:
            self._metrics.publish_confirm_duration.observe(time.perf_counter() - started)
        failures = {
            row_id: err for (row_id, _), err in zip(to_publish, results, strict=True) if err
        }
        for event_id, items in groups.items():
            row = stored.get(event_id)
            if row is None:
                _fail(items, UnstorableWebhookError("the event cannot be stored as sent"))
                continue
            if row.id in failures:
                log.warning(
                    "ingest.publish_failed", event_id=event_id, error=repr(failures[row.id])
                )
                _fail(items, UnavailableError("RabbitMQ did not confirm"))
                continue
            first, *copies = items
            _resolve(first, Outcome.ACCEPTED if row.inserted else Outcome.DUPLICATE)
            for copy in copies:
                _resolve(copy, Outcome.DUPLICATE)
        return [row_id for row_id, _ in to_publish if row_id not in failures]

    async def _store(
        self, entries: list[queries.InboxEntry], claim: uuid.UUID
    ) -> dict[str, queries.StoredEntry]:
        """Store the batch in one statement; by event id. If PostgreSQL refuses the data
        itself, store one by one so a single unstorable event can't fail its neighbours;
        the ones it refuses alone are left out of the answer."""
        lease = self._config.claim_lease_s
        try:
            rows = await queries.store_batch(self._pool, PROVIDER, entries, claim, lease)
        except asyncpg.DataError:
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
