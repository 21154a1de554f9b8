"""Publishing inbox rows this process holds a claim on, and settling each claim.

On confirm the row is marked published (in the background: a lost mark only means the
sweeper sends a second copy, which consumers dedup by message id). On a definite failure
the claim is released so the provider's next retry may publish at once. While the outcome
is unknown (no confirm yet, the broker may still have it) the claim is kept and the publish
is left running: a late confirm still marks the row, and until then `in_flight` lets
concurrent copies of the event wait for it instead of publishing a second message. A copy
whose row someone else holds (another replica) watches the row instead, and takes the claim
over if that holder lets it go.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import structlog

from shared.broker import Broker, Outgoing, publish_error, retrieve_exception
from shared.errors import UnavailableError
from shared.queries import inbox as inbox_sql
from shared.topology import message_id, routing_key

log = structlog.get_logger(__name__)

# Longer than any batch's deadlines: the gap between a copy's INSERT (which saw the row still
# unpublished) and its answer.
CONFIRM_MEMORY_S = 30.0
# Confirms gathered into one `published_at` UPDATE.
MARK_WINDOW_S = 0.02
# How often a copy waiting for another holder's publish looks at the row again.
HOLDER_POLL_S = 0.03

T = TypeVar("T")


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


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    id: int
    event_id: str
    message: Outgoing


class ClaimedPublisher:
    def __init__(self, pool: asyncpg.Pool[Any], broker: Broker, timeout_s: float) -> None:
        self._pool = pool
        self._broker = broker
        self._timeout_s = timeout_s
        # Event ids a batch of this process is storing or publishing right now, so that a
        # copy arriving meanwhile waits for that outcome instead of answering too early.
        self.in_flight: dict[str, asyncio.Future[None]] = {}
        # Event ids confirmed lately: a copy whose INSERT saw the row unpublished just before
        # the mark committed still finds the confirm. Plain ids, not futures: tens of
        # thousands of live futures make every full garbage collection slow.
        self.recently_confirmed: dict[str, float] = {}
        self._confirm_order: collections.deque[tuple[float, str]] = collections.deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._to_mark: list[int] = []

    def reserve(self, event_ids: Sequence[str]) -> dict[str, asyncio.Future[None]]:
        """Announce the events a batch is about to store; returns the ones it now holds."""
        loop = asyncio.get_running_loop()
        held = {}
        for event_id in event_ids:
            if event_id not in self.in_flight:
                placeholder: asyncio.Future[None] = loop.create_future()
                placeholder.add_done_callback(retrieve_exception)
                self.in_flight[event_id] = held[event_id] = placeholder
        return held

    def settle_reserved(self, event_id: str, placeholder: asyncio.Future[None], ok: bool) -> None:
        """A held event this batch did not publish itself: say how it stands."""
        if self.in_flight.get(event_id) is placeholder:
            del self.in_flight[event_id]
        if not placeholder.done():
            if ok:
                placeholder.set_result(None)
            else:
                placeholder.set_exception(UnavailableError("not confirmed by this process"))

    async def publish(
        self,
        claim: uuid.UUID,
        rows: Sequence[ClaimedRow],
        held: dict[str, asyncio.Future[None]] | None = None,
    ) -> list[BaseException | None]:
        """Publish and wait up to the timeout; None per confirmed row, else why not."""
        futures = self._broker.start_publishes([r.message for r in rows])
        for row, future in zip(rows, futures, strict=True):
            placeholder = (held or {}).get(row.event_id)
            if placeholder is not None:
                future.add_done_callback(functools.partial(_chain, placeholder))
            self.in_flight[row.event_id] = future
            future.add_done_callback(functools.partial(self._settle, claim, row))
        await self._broker.wait_confirms(futures, self._timeout_s)
        return [publish_error(f) for f in futures]

    async def publish_after_holder(
        self,
        row: ClaimedRow,
        *,
        deadline: float,
        lease_s: float,
        abandoned: Callable[[], Sequence[uuid.UUID]],
    ) -> bool:
        """Wait for whoever holds the row's claim (another replica, say) to publish it; if the
        claim is released or lapses, or is one of `abandoned`, take it over and publish from
        here. True once the row is published; False if that is not so by `deadline`
        (time.monotonic) or the publish from here is not confirmed."""
        while True:
            state = await inbox_sql.claim_state(self._pool, row.id, abandoned())
            if state.published:
                return True
            if state.free:
                claim = uuid.uuid4()
                if await inbox_sql.take_over_claim(self._pool, row.id, claim, lease_s, abandoned()):
                    log.info("ingest.claim_taken_over", event_id=row.event_id)
                    [error] = await self.publish(claim, [row])
                    return error is None
                # Another copy or the sweeper claimed it first: wait for that publish instead.
            if time.monotonic() + HOLDER_POLL_S > deadline:
                return False
            await asyncio.sleep(HOLDER_POLL_S)

    async def close(self) -> None:
        """Let the marks and releases already started finish."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _settle(self, claim: uuid.UUID, row: ClaimedRow, future: asyncio.Future[None]) -> None:
        if self.in_flight.get(row.event_id) is future:
            del self.in_flight[row.event_id]
        if publish_error(future) is None:
            now = time.monotonic()
            self.recently_confirmed[row.event_id] = now
            self._confirm_order.append((now, row.event_id))
            self._forget_old_confirms(now)
            if not self._to_mark:
                self._spawn(self._mark_published())
            self._to_mark.append(row.id)
        else:
            self._spawn(inbox_sql.release_claims(self._pool, [row.id], claim))

    async def _mark_published(self) -> None:
        # One UPDATE for the confirms of a short window (a batch's confirms arrive together,
        # and the next batch's soon after), not one per row or per batch.
        await asyncio.sleep(MARK_WINDOW_S)
        ids, self._to_mark = self._to_mark, []
        await retry_deadlock(lambda: inbox_sql.mark_published(self._pool, sorted(ids)))

    def _forget_old_confirms(self, now: float) -> None:
        horizon = now - CONFIRM_MEMORY_S
        while self._confirm_order and self._confirm_order[0][0] < horizon:
            at, event_id = self._confirm_order.popleft()
            if self.recently_confirmed.get(event_id) == at:
                del self.recently_confirmed[event_id]

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception as e:  # the sweeper settles whatever this could not
                log.warning("ingest.claim_settle_failed", error=repr(e))

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def retry_deadlock(statement: Callable[[], Awaitable[T]], attempts: int = 3) -> T:
    """Run a statement again when PostgreSQL broke a deadlock by aborting it (it was rolled
    back as a whole, so running it again is safe)."""
    for attempt in range(1, attempts + 1):
        try:
            return await statement()
        except asyncpg.DeadlockDetectedError:
            if attempt == attempts:
                raise
            log.info("ingest.deadlock_retried", attempt=attempt)
    raise AssertionError("unreachable")  # the loop either returns or raises


def _chain(placeholder: asyncio.Future[None], future: asyncio.Future[None]) -> None:
    if placeholder.done():
        return
    error = publish_error(future)
    if error is None:
        placeholder.set_result(None)
    else:
        placeholder.set_exception(error)


async def wait_published(future: asyncio.Future[None]) -> bool:
    """Wait for another request's publish of the same event; True once it is confirmed."""
    with contextlib.suppress(Exception):
        await asyncio.shield(future)
    return future.done() and publish_error(future) is None
