"""The event ids of refused webhooks (401, 5xx), kept for `payhooks missing`: noted in a
bounded in-process buffer as they are answered, written to refused_webhooks by a background
task. Best-effort by design: a 503 because PostgreSQL is down cannot be written then, so it
waits in the buffer until the database answers; the buffer never grows past MAX_BUFFERED
(beyond it refusals are dropped and counted in the log). A 401's id is untrusted: only ids
of at most MAX_ID_CHARS printable characters are kept, never a body or a signature."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
import structlog

from shared.process.tasks import keep_running
from shared.queries import refused as refused_sql

log = structlog.get_logger(__name__)

MAX_BUFFERED: Final = 10_000  # distinct (event id, status) waiting to be written
MAX_ID_CHARS: Final = 255
FLUSH_BATCH: Final = 1000
FLUSH_INTERVAL_S: Final = 1.0


@dataclass(slots=True)
class _Pending:
    outcome: str
    first_at: dt.datetime
    last_at: dt.datetime
    refusals: int


def keepable_id(event_id: str | None) -> str | None:
    """The id as stored, or None when it is not one to keep (absent, too long, not
    printable)."""
    if not event_id or len(event_id) > MAX_ID_CHARS or not event_id.isprintable():
        return None
    return event_id


class Refusals:
    def __init__(self, provider: str, max_buffered: int = MAX_BUFFERED) -> None:
        self._provider = provider
        self._max = max_buffered
        self._pending: dict[tuple[str, int], _Pending] = {}
        self.dropped = 0  # refusals not kept: buffer full, or the id not one to keep

    def note(self, event_id: str | None, status: int, outcome: str) -> None:
        """A webhook answered `status` (401 or 5xx)."""
        kept = keepable_id(event_id)
        if kept is None:
            self.dropped += 1
            return
        now = dt.datetime.now(dt.UTC)
        pending = self._pending.get((kept, status))
        if pending is not None:
            pending.last_at, pending.outcome = now, outcome
            pending.refusals += 1
        elif len(self._pending) < self._max:
            self._pending[(kept, status)] = _Pending(outcome, now, now, 1)
        else:
            self.dropped += 1

    def __len__(self) -> int:
        return len(self._pending)

    async def flush(self, pool: asyncpg.Pool[Any]) -> int:
        """Write up to FLUSH_BATCH noted refusals; on failure they stay noted (merged with
        those noted meanwhile) and the error goes up. How many rows were written."""
        if self.dropped:
            log.warning("webhook.refusals_dropped", dropped=self.dropped, buffered=len(self))
            self.dropped = 0
        keys = list(self._pending)[:FLUSH_BATCH]
        if not keys:
            return 0
        taken = {k: self._pending.pop(k) for k in keys}
        try:
            return await refused_sql.record(
                pool,
                [
                    refused_sql.Refusal(
                        self._provider, e, s, p.outcome, p.first_at, p.last_at, p.refusals
                    )
                    for (e, s), p in taken.items()
                ],
            )
        except BaseException:
            for key, p in taken.items():
                self._merge_back(key, p)
            raise

    def _merge_back(self, key: tuple[str, int], p: _Pending) -> None:
        now = self._pending.get(key)
        if now is None:
            self._pending[key] = p  # may pass the bound by what was taken: at most a batch
            return
        now.first_at = min(now.first_at, p.first_at)
        now.refusals += p.refusals

    async def run_forever(self, pool: asyncpg.Pool[Any]) -> None:
        async def step() -> None:
            while await self.flush(pool) == FLUSH_BATCH:
                pass

        await keep_running(step, FLUSH_INTERVAL_S, "webhook.refusals_not_written")
