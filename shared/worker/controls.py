"""An operator's pause and rate cap as one worker replica sees them: the worker's
worker_controls row, read at startup, on every NOTIFY of a change and every REREAD_S besides
(a notification lost while the listener reconnected), applied to the worker's Pause (a hold,
shared/worker/pause.py) and to its batches (the token bucket every replica shares)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import asyncpg
import structlog

from shared.errors import Dependency
from shared.metrics import WorkerControlMetrics
from shared.queries import worker_controls as sql
from shared.worker import throttle
from shared.worker.pause import Hold, Pause

log = structlog.get_logger(__name__)

REREAD_S = 1.0
# A replica that could not read its controls for this long says so on /readyz: it may be
# running while its operator paused it, or the other way round.
STALE_AFTER_S = 10.0
_FIRST_READ_TIMEOUT_S = 5.0


class Controls:
    """The worker's controls; also its Throttle (shared/worker/runtime.py)."""

    def __init__(self, worker: str, pool: asyncpg.Pool[Any], metrics: WorkerControlMetrics) -> None:
        self._worker = worker
        self._pool = pool
        self._metrics = metrics
        self._pause: Pause | None = None
        self._row = sql.Controls(worker)
        self._read_at: float | None = None  # time.monotonic() of the last read that answered
        self._unread = False  # the last read failed
        self.wake = asyncio.Event()  # set by the NOTIFY listener
        self._changed = asyncio.Event()  # the cap changed: a take waiting for a token asks again
        metrics.set(worker, None, None)

    def attach(self, pause: Pause) -> None:
        self._pause = pause

    @property
    def limited(self) -> bool:
        return self._row.per_second is not None

    async def first_read(self) -> None:
        """Before the worker starts: an operator-paused worker takes nothing. PostgreSQL
        away: it starts as it would anyway, and the re-reads apply the pause once they can."""
        try:
            async with asyncio.timeout(_FIRST_READ_TIMEOUT_S):
                await self.refresh()
        except TimeoutError as e:
            log.warning("worker.controls_read_failed", worker=self._worker, error=repr(e))

    async def refresh(self) -> None:
        """Read the row and apply it. A read that fails is said once, when they start failing
        (PostgreSQL away: the worker's own pause says the rest), and once when one answers."""
        try:
            row = await sql.controls(self._pool, self._worker)
        except Exception as e:
            if not self._unread:
                log.warning("worker.controls_read_failed", worker=self._worker, error=repr(e))
            self._unread = True
            return
        if self._unread:
            log.info("worker.controls_read", worker=self._worker)
        self._unread = False
        self._read_at = time.monotonic()
        await self.apply(row)

    async def apply(self, row: sql.Controls) -> None:
        before, self._row = self._row, row
        if row.per_second != before.per_second:
            log.info(
                "worker.rate_limited" if row.per_second is not None else "worker.rate_unlimited",
                worker=self._worker,
                per_second=row.per_second,
                by=row.throttled_by,
            )
            self._changed.set()
        self._metrics.set(self._worker, row.paused_at, row.per_second)
        if self._pause is None:
            return
        if row.paused_at is not None:
            await self._pause.hold(
                Hold(row.paused_by or "", row.paused_reason or "", row.paused_at)
            )
            self._changed.set()  # a take waiting for a token gives up
        else:
            await self._pause.release()

    async def take(self, wanted: int) -> int:
        """Wait for tokens from the shared bucket; how many of `wanted` it got (0 when the
        worker was paused meanwhile; all of them once the cap is lifted)."""
        while True:
            if self._pause is not None and self._pause.is_paused:
                return 0
            try:
                taken = await sql.take(self._pool, self._worker, wanted)
            except Exception as e:  # PostgreSQL away: a dependency's pause, as a batch's would
                if self._pause is None:
                    raise
                await self._pause.pause(Dependency.POSTGRESQL, e)
                return 0
            if taken is None:  # lifted meanwhile
                return wanted
            if taken.granted > 0:
                return taken.granted
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(throttle.wait_s(taken.tokens_left, taken.per_second)):
                    await self._changed.wait()

    def ready(self) -> bool:
        """Read recently enough to trust (readiness while the operator's pause holds it)."""
        return self._read_at is not None and time.monotonic() - self._read_at < STALE_AFTER_S

    def describe(self) -> dict[str, object]:
        """What /readyz shows: the operator's pause and the cap, when set."""
        details: dict[str, object] = {}
        if self._row.paused_at is not None:
            details["operator_pause"] = {
                "by": self._row.paused_by,
                "reason": self._row.paused_reason,
                "since": self._row.paused_at.isoformat(),
            }
        if self._row.per_second is not None:
            details["rate_limit"] = {
                "per_second": self._row.per_second,
                "by": self._row.throttled_by,
                "since": None
                if self._row.throttled_at is None
                else self._row.throttled_at.isoformat(),
            }
        if self._read_at is None or not self.ready():
            details["controls_unread"] = True
        return details
