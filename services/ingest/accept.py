"""The accept path: concurrent webhooks stored in one INSERT per batch, their publishes sent
together, each request answered at a confirm of its event (at least once: a copy of an event
never confirmed publishes it again; the sweeper publishes what no confirm reached)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import OrderedDict
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import asyncpg
import structlog

from services.ingest.admission import AdmissionConfig, DrainRate
from services.ingest.webhook import Webhook
from shared import tracing
from shared.amqp.alarms import BlockedError
from shared.amqp.broker import Broker
from shared.amqp.outgoing import Outgoing
from shared.amqp.publish_together import publish_error
from shared.amqp.topology import routing_key
from shared.db import retry_deadlock
from shared.errors import PermanentError, UnavailableError
from shared.metrics import IngestMetrics
from shared.process.tasks import cancel_and_wait
from shared.providers.registry import message_of
from shared.queries import inbox as inbox_sql

log = structlog.get_logger(__name__)

# Confirms gathered into one statement that marks them published.
MARK_WINDOW_S = 0.02
# How long this process remembers a confirm: longer than an INSERT may take (db_timeout_s),
# so a copy whose INSERT read the row just before the mark committed still finds it.
CONFIRM_MEMORY_S = 10.0
# A publish of this process still unconfirmed after this long is not waited for by copies:
# they publish again (a lost confirm must not keep an event at 503 for good).
STALE_PUBLISH_S = 30.0


class UnstorableWebhookError(PermanentError):
    """PostgreSQL refuses the event's data itself (answered 400: retrying can't help)."""


class OverloadedError(UnavailableError):
    """The acceptor would not answer this webhook within its budget (or holds as many as it
    may): refused before any work."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # the payhooks_ingest_shed_total label


class Outcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class AcceptorConfig:
    max_batch: int = 256
    max_in_flight: int = 4
    # A batch goes when its oldest webhook has waited gather_s, or as soon as gather_enough
    # are waiting, or it is full (unless the acceptor is busy, see _gathers): a steady rate
    # makes batches of several, a closed loop of clients is not held (docs/performance.md).
    gather_s: float = 0.010
    gather_enough: int = 16
    # Webhooks waiting for a batch are admitted by their predicted wait (admission.py); this
    # caps them whatever the prediction, for memory (about 14 KB each, docs/ingest-burst.md),
    # above X-Hub's breaker-release burst of 10,000.
    max_pending: int = 20_000
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    db_timeout_s: float = 4.0
    publish_timeout_s: float = 4.0


class ConfirmMemory:
    """Event ids whose publish was confirmed, each kept at least `keep_s` seconds.

    An OrderedDict, oldest first: forgetting the oldest of a plain dict walks every slot
    deleted since it last resized, which slows ingest the longer it runs (docs/performance.md)."""

    def __init__(self, keep_s: float) -> None:
        self._keep_s = keep_s
        self._when: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._when

    def __len__(self) -> int:
        return len(self._when)

    def remember(self, event_id: str, now: float) -> None:
        """Note a confirm at `now` (monotonic seconds); forget the ones older than keep_s."""
        self._when[event_id] = now
        self._when.move_to_end(event_id)
        while now - next(iter(self._when.values())) > self._keep_s:
            self._when.popitem(last=False)


@dataclass(slots=True)
class _Item:
    webhook: Webhook
    headers: dict[str, str]
    # Awaited by the request until answered (a request that is cancelled cancels it, and the
    # batch then leaves it alone).
    future: asyncio.Future[Outcome]
    arrived: float  # event loop time
    # The headers its message carries for what follows (shared/tracing.py): when it arrived,
    # and the request span's trace context while tracing is on.
    carried: dict[str, str]


def outgoing(
    provider: str,
    event_id: str,
    event_type: str,
    body: bytes,
    carried: Mapping[str, str] | None = None,
) -> Outgoing:
    """The message of a stored webhook (message id = event id, routed by event type; AMQP
    short strings hold 255 bytes, the full type and id stay in the body and the inbox). Its
    body is the provider's event as payhooks' canonical one (X-Hub's is already), its id the
    event id (after the provider's prefix: X-Hub's is none)."""
    key = routing_key(event_type)
    message_id, canonical = message_of(provider, event_id, body)
    return Outgoing(key, canonical, message_id, key, {"provider": provider, **(carried or {})})


class Acceptor:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        broker: Broker,
        metrics: IngestMetrics,
        config: AcceptorConfig | None = None,
        *,
        provider: str,
    ) -> None:
        self._provider = provider  # whose webhooks: the inbox's provider column
        self._pool = pool
        self._broker = broker
        self._metrics = metrics
        self._config = config or AcceptorConfig()
        self._pending: list[_Item] = []
        self._wakeup = asyncio.Event()
        self._enough = asyncio.Event()  # gather_enough webhooks are waiting
        self._slots = asyncio.Semaphore(self._config.max_in_flight)
        self._running = 0
        self._running_rows = 0  # webhooks in the batches running
        self._drain = DrainRate(self._config.admission)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        # This process's publishes by event id until they settle (a copy arriving meanwhile
        # waits for that confirm), then the confirmed ones by when, for CONFIRM_MEMORY_S: a
        # copy whose INSERT read the row before its mark committed still finds the confirm.
        # Plain ids and times: tens of thousands of kept futures slow every full collection.
        self._publishes: dict[str, tuple[asyncio.Future[None], float]] = {}
        self._confirmed = ConfirmMemory(CONFIRM_MEMORY_S)
        self._to_mark: list[int] = []

    async def accept(self, webhook: Webhook, headers: dict[str, str], deadline: float) -> Outcome:
        """Store and publish; raise UnavailableError when either could not be done by
        `deadline` (event loop time), or at once (OverloadedError, BlockedError) when it
        cannot be done now or would not be done by then."""
        if self._broker.blocked:
            raise BlockedError()
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._admit(deadline, now)
        tracing.annotate(
            provider=self._provider, event_id=webhook.event_id, payment_id=webhook.payment_id
        )
        carried = {tracing.RECEIVED_AT: f"{time.time():.3f}", **tracing.current_headers()}
        item = _Item(webhook, headers, loop.create_future(), now, carried)
        self._pending.append(item)
        self._wakeup.set()
        if len(self._pending) >= self._config.gather_enough:
            self._enough.set()
        # The batch goes on whatever becomes of this request (a client that hangs up, the
        # deadline): it only answers a future still waiting.
        timer = loop.call_at(deadline, _expire, item.future)
        try:
            return await item.future
        finally:
            timer.cancel()

    def rows_per_s(self) -> float:
        """The accept rate admission predicts with now (webhooks/s)."""
        return self._drain.rows_per_s(asyncio.get_running_loop().time())

    def _admit(self, deadline: float, now: float) -> None:
        """Refuse (OverloadedError) a webhook that would be answered too late: the ones ahead
        of it at the measured rate take longer than its budget leaves (less a margin)."""
        pending = len(self._pending)
        if pending >= self._config.max_pending:
            raise OverloadedError(f"{pending} webhooks already wait for a batch", "pending_cap")
        ahead = pending + self._running_rows
        wait_s = self._drain.predicted_wait_s(ahead, now)
        if wait_s > deadline - now - self._config.admission.margin_s:
            raise OverloadedError(
                f"{ahead} webhooks ahead, about {wait_s:.1f} s at"
                f" {self._drain.rows_per_s(now):.0f}/s; {deadline - now:.1f} s of the budget left",
                "predicted_wait",
            )

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._dispatch(), name="acceptor")

    async def close(self) -> None:
        """Finish every batch already taken (and its marks), answer the rest 503."""
        if self._loop_task is not None:
            await cancel_and_wait(self._loop_task)
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        _fail(self._pending, UnavailableError("ingest is shutting down"))
        self._pending.clear()

    async def _dispatch(self) -> None:
        while True:
            await self._wakeup.wait()
            await self._slots.acquire()
            if self._gathers():
                goes_at = self._pending[0].arrived + self._config.gather_s
                if (wait := goes_at - asyncio.get_running_loop().time()) > 0:
                    self._enough.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._enough.wait()
            batch = self._pending[: self._config.max_batch]
            del self._pending[: self._config.max_batch]
            if not self._pending:
                self._wakeup.clear()
                self._drain.ran_dry()
            if batch:
                self._running += 1
                self._running_rows += len(batch)
                self._spawn(self._run(batch))
            else:
                self._slots.release()

    def _gathers(self) -> bool:
        """Whether the next batch waits for its oldest webhook to have waited gather_s: when
        it is not full and at most one other batch is in flight. With more in flight the
        acceptor is busy, webhooks pile up while a slot frees, and waiting would only slow
        a closed loop of clients (the prototype benchmark's wrk: c=64 ratio 0.82 waiting
        always, 0.99-1.03 so)."""
        pending = len(self._pending)
        return 0 < pending < min(self._config.gather_enough, self._config.max_batch) and (
            self._running <= 1
        )

    async def _run(self, batch: list[_Item]) -> None:
        try:
            await self._store_and_publish(batch)
        except Exception as e:  # never leave a request without an answer
            log.exception("ingest.batch_failed")
            _fail(batch, UnavailableError(f"accept failed: {e!r}"))
        finally:
            self._running -= 1
            self._running_rows -= len(batch)
            now = asyncio.get_running_loop().time()
            self._drain.finished(len(batch), now, waiting=bool(self._pending))
            self._metrics.accept_rate.set(self._drain.rows_per_s(now))
            self._slots.release()

    async def _store_and_publish(self, batch: list[_Item]) -> None:
        self._metrics.accept_batch_size.observe(len(batch))
        # Copies of one event inside a batch ride on the first copy (ON CONFLICT cannot
        # touch one row twice in a statement). Sorted: concurrent batches lock the rows they
        # share in the same order (no deadlock).
        groups: dict[str, list[_Item]] = {}
        for item in batch:
            groups.setdefault(inbox_sql.storable_text(item.webhook.event_id), []).append(item)
        entries = [
            inbox_sql.InboxEntry(
                key, w.event_type, w.payment_id, w.body, items[0].headers, len(items)
            )
            for key, items in sorted(groups.items())
            for w in [items[0].webhook]
        ]
        try:
            async with asyncio.timeout(self._config.db_timeout_s):
                stored = await self._store(entries)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            # The INSERT may still commit (a stalled connection): the next copy, or else the
            # sweeper, publishes such a row.
            log.warning("ingest.db_unavailable", error=repr(e), batch=len(batch))
            _fail(batch, UnavailableError("PostgreSQL unavailable"))
            return

        # Each stored event's requests are answered at the confirm of a publish of it: one
        # already in flight in this process, or one sent now.
        confirms: list[tuple[asyncio.Future[None], list[_Item]]] = []
        to_send: list[tuple[inbox_sql.InboxEntry, inbox_sql.StoredEntry]] = []
        for entry in entries:
            items = groups[entry.event_id]
            if (row := stored.get(entry.event_id)) is None:
                _fail(items, UnstorableWebhookError("the event cannot be stored as sent"))
            elif row.published or entry.event_id in self._confirmed:
                _answer(items, row.inserted)
            elif (running := self._running_publish(entry.event_id)) is not None:
                running.add_done_callback(functools.partial(_answer_at_confirm, items, row))
                confirms.append((running, items))
            else:
                to_send.append((entry, row))
        started = time.perf_counter()
        sent = await self._broker.start_publishes(
            [
                outgoing(
                    self._provider,
                    e.event_id,
                    e.event_type,
                    e.body,
                    groups[e.event_id][0].carried,
                )
                for e, _ in to_send
            ]
        )
        now = time.monotonic()
        for (_, row), future in zip(to_send, sent, strict=True):
            self._publishes[row.event_id] = (future, now)
            future.add_done_callback(functools.partial(self._settled, row))
            items = groups[row.event_id]
            future.add_done_callback(functools.partial(_answer_at_confirm, items, row))
            confirms.append((future, items))
        await self._broker.wait_confirms(
            [future for future, _ in confirms], self._config.publish_timeout_s
        )
        if sent:
            self._metrics.publish_confirm_duration.observe(time.perf_counter() - started)
        # A publish still unsettled now (its deadline passed, or RabbitMQ blocks publishers)
        # has an unknown outcome: 503, and a late confirm answers no one. (One settled in
        # this very moment is answered by its callback, which may not have run yet.)
        for future, items in confirms:
            if not future.done():
                _fail(items, UnavailableError("RabbitMQ did not confirm in time"))

    def _running_publish(self, event_id: str) -> asyncio.Future[None] | None:
        """This process's publish of the event still in flight; None if there is none or
        it went stale (then publish again)."""
        running = self._publishes.get(event_id)
        if running is None:
            return None
        future, started = running
        return future if time.monotonic() - started < STALE_PUBLISH_S else None

    def _settled(self, row: inbox_sql.StoredEntry, future: asyncio.Future[None]) -> None:
        running = self._publishes.get(row.event_id)
        if running is not None and running[0] is future:
            del self._publishes[row.event_id]
        if publish_error(future) is not None:
            return
        self._confirmed.remember(row.event_id, time.monotonic())
        if not self._to_mark:
            self._spawn(self._mark_published())
        self._to_mark.append(row.id)

    async def _mark_published(self) -> None:
        # One UPDATE for the confirms of a short window (a batch's confirms arrive together,
        # and the next batch's soon after), not one per row or per batch.
        await asyncio.sleep(MARK_WINDOW_S)
        ids, self._to_mark = sorted(self._to_mark), []
        try:
            await retry_deadlock(lambda: inbox_sql.mark_published_lazily(self._pool, ids))
        except Exception as e:  # the rows stay unpublished: the sweeper publishes them again
            log.warning("ingest.mark_failed", rows=len(ids), error=repr(e))

    async def _store(self, entries: list[inbox_sql.InboxEntry]) -> dict[str, inbox_sql.StoredEntry]:
        """Store the batch in one statement; by event id. If PostgreSQL refuses the data
        itself, store one by one so a single unstorable event can't fail its neighbours;
        the ones it refuses alone are left out of the answer."""
        try:
            rows = await retry_deadlock(
                lambda: inbox_sql.store_batch(self._pool, self._provider, entries)
            )
        except (asyncpg.DataError, asyncpg.ProgramLimitExceededError):
            # Refused data, or a value too large for an index: about the rows, not the server.
            if len(entries) == 1:
                log.warning("ingest.unstorable", event_id=entries[0].event_id, exc_info=True)
                return {}
            rows = []
            for entry in entries:
                rows.extend((await self._store([entry])).values())
        return {r.event_id: r for r in rows}

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _answer(items: list[_Item], inserted: bool) -> None:
    """Copies of one event, stored and published: the first copy of a new event is
    `accepted`, every other one a `duplicate`."""
    first, *copies = items
    _resolve(first, Outcome.ACCEPTED if inserted else Outcome.DUPLICATE)
    for copy in copies:
        _resolve(copy, Outcome.DUPLICATE)


def _answer_at_confirm(
    items: list[_Item], row: inbox_sql.StoredEntry, publish: asyncio.Future[None]
) -> None:
    if (error := publish_error(publish)) is None:
        _answer(items, row.inserted)
    else:
        log.warning("ingest.publish_failed", event_id=row.event_id, error=repr(error))
        _fail(items, UnavailableError("RabbitMQ did not confirm"))


def _expire(future: asyncio.Future[Outcome]) -> None:
    if not future.done():
        future.set_exception(UnavailableError("no answer within the budget"))


def _resolve(item: _Item, outcome: Outcome) -> None:
    if not item.future.done():
        item.future.set_result(outcome)


def _fail(items: Sequence[_Item], error: Exception) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(error)
