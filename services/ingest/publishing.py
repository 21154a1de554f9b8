"""Publishing inbox rows this process holds a claim on, and settling each claim.

On confirm the row is marked published (in the background: a lost mark only means the
sweeper sends a second copy, which consumers dedup by message id). On a definite failure
the claim is released so the provider's next retry may publish at once. While the outcome
is unknown (no confirm yet, the broker may still have it) the claim is kept and the publish
is left running: a late confirm still marks the row, and until then `in_flight` lets
concurrent copies of the event wait for it instead of publishing a second message.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog

from shared import queries
from shared.broker import Broker, Outgoing, publish_error
from shared.topology import message_id, routing_key

log = structlog.get_logger(__name__)

# Longer than any batch's deadlines: the gap between a copy's INSERT (which saw the row still
# unpublished) and its answer.
CONFIRM_MEMORY_S = 30.0


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
        # Publishes under way, and confirmed ones for a while after: a copy whose INSERT saw
        # the row unpublished just before the mark committed must still find the confirm.
        self.in_flight: dict[str, asyncio.Future[None]] = {}
        self._confirmed: collections.deque[tuple[float, str, asyncio.Future[None]]] = (
            collections.deque()
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._to_mark: list[ClaimedRow] = []

    async def publish(
        self, claim: uuid.UUID, rows: Sequence[ClaimedRow]
    ) -> list[BaseException | None]:
        """Publish and wait up to the timeout; None per confirmed row, else why not."""
        futures = self._broker.start_publishes([r.message for r in rows])
        for row, future in zip(rows, futures, strict=True):
            self.in_flight[row.event_id] = future
            future.add_done_callback(functools.partial(self._settle, claim, row))
        if futures:
            await asyncio.wait(futures, timeout=self._timeout_s)
        return [publish_error(f) for f in futures]

    async def close(self) -> None:
        """Let the marks and releases already started finish."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _settle(self, claim: uuid.UUID, row: ClaimedRow, future: asyncio.Future[None]) -> None:
        if publish_error(future) is None:
            if not self._to_mark:
                self._spawn(self._mark_published())
            self._to_mark.append(row)
            self._confirmed.append((time.monotonic(), row.event_id, future))
            self._forget_old_confirms()
        else:
            self._forget(row, future)
            self._spawn(queries.release_claims(self._pool, [row.id], claim))

    def _forget(self, row: ClaimedRow, future: asyncio.Future[None]) -> None:
        if self.in_flight.get(row.event_id) is future:
            del self.in_flight[row.event_id]

    async def _mark_published(self) -> None:
        # One UPDATE for every confirm that lands in the same moment (a batch's confirms
        # arrive together), not one per row.
        await asyncio.sleep(0)
        rows, self._to_mark = self._to_mark, []
        await queries.mark_published(self._pool, [r.id for r in rows])

    def _forget_old_confirms(self) -> None:
        horizon = time.monotonic() - CONFIRM_MEMORY_S
        while self._confirmed and self._confirmed[0][0] < horizon:
            _, event_id, future = self._confirmed.popleft()
            if self.in_flight.get(event_id) is future:
                del self.in_flight[event_id]

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception as e:  # the sweeper settles whatever this could not
                log.warning("ingest.claim_settle_failed", error=repr(e))

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def wait_published(future: asyncio.Future[None]) -> bool:
    """Wait for another request's publish of the same event; True once it is confirmed."""
    with contextlib.suppress(Exception):
        await asyncio.shield(future)
    return future.done() and publish_error(future) is None
