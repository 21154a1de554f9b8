"""A worker paused for a dependency that is down: it takes no work while any of its
dependencies is paused, probes each with a growing backoff, and resumes by itself once all
answer. One log line when it pauses, one when it resumes; the gauge and /readyz say why.

An operator's pause (`payhooks worker pause`, shared/worker/controls.py) is a hold on the same
pause: the worker runs again only once no dependency is paused *and* no hold is on, so a
probe that finds its dependency back never ends an operator's pause, and a resume by the
operator never ends a dependency's."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Gauge

from shared.errors import Dependency
from shared.process.tasks import cancel_and_wait
from shared.worker.failures import MAX_ERROR_CHARS, error_text

log = structlog.get_logger(__name__)

# A probe returns once the dependency takes work again; it raises (or does not answer within
# PROBE_TIMEOUT_S) while it is down.
Probe = Callable[[], Awaitable[None]]

# The wait before each probe. A pause that comes again soon after a resume (a database whose
# connections are being killed, a relay answering 4xx to every email) goes on where the last
# one ended instead of at the start: the pauses grow, no busy loop.
BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
# A pause this long after the last resume starts at the beginning of BACKOFF_S again.
CALM_AFTER_S = 60.0
PROBE_TIMEOUT_S = 5.0

Hook = Callable[[], Awaitable[None]]
# Called when the worker goes from running to paused: True to hand back what it holds (a
# dependency is down), False to keep it, in order, for when it runs again (an operator's hold).
PauseHook = Callable[[bool], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Hold:
    """An operator's pause, as the worker_controls row says it."""

    by: str
    reason: str
    at: dt.datetime

    def as_json(self) -> dict[str, Any]:
        return {"by": self.by, "reason": self.reason, "since": self.at.isoformat()}


@dataclass(slots=True)
class _Paused:
    since: float  # event loop time
    at: dt.datetime
    error: str
    task: asyncio.Task[None] | None = None


class Pause:
    """The pauses of one worker, by dependency. `on_pause` runs when the worker goes from
    running to paused (stop consuming, hand back what it holds), `on_resume` when the last
    pause ends (consume again); both are awaited in order, never at the same time."""

    def __init__(
        self,
        worker: str,
        probes: Mapping[Dependency, Probe],
        gauge: Gauge,
        on_pause: PauseHook,
        on_resume: Hook,
        *,
        backoff_s: tuple[float, ...] = BACKOFF_S,
    ) -> None:
        self._worker = worker
        self._probes = probes
        self._gauge = gauge
        self._on_pause, self._on_resume = on_pause, on_resume
        self._backoff_s = backoff_s
        self._paused: dict[Dependency, _Paused] = {}
        # Per dependency: the BACKOFF_S step its next pause starts at, and its last resume.
        self._step: dict[Dependency, int] = {}
        self._resumed_at: dict[Dependency, float] = {}
        self._held: Hold | None = None
        self._transitions = asyncio.Lock()
        self.running = asyncio.Event()
        self.running.set()
        for dependency in probes:
            gauge.labels(worker=worker, dependency=dependency).set(0)

    @property
    def is_paused(self) -> bool:
        return bool(self._paused) or self._held is not None

    @property
    def dependency_paused(self) -> bool:
        return bool(self._paused)

    @property
    def held(self) -> Hold | None:
        return self._held

    async def hold(self, hold: Hold) -> None:
        """The operator's pause (a new reason or actor replaces the one shown)."""
        async with self._transitions:
            if self._held == hold:
                return
            first = not self.is_paused
            was, self._held = self._held, hold
            self.running.clear()
            if was is None:
                log.warning("worker.held", worker=self._worker, by=hold.by, reason=hold.reason)
            if first:
                await self._on_pause(False)

    async def release(self) -> None:
        """End the operator's pause: the worker runs again unless a dependency is down."""
        async with self._transitions:
            if self._held is None:
                return
            held, self._held = self._held, None
            log.info(
                "worker.released",
                worker=self._worker,
                by=held.by,
                held_s=round((dt.datetime.now(dt.UTC) - held.at).total_seconds(), 3),
                waiting_for=[str(d) for d in self._paused],
            )
            if not self._paused and self._held is None:
                await self._on_resume()
                self.running.set()

    async def pause(self, dependency: Dependency, error: BaseException) -> None:
        """Pause for `dependency` (nothing more if it is paused already)."""
        async with self._transitions:
            if dependency in self._paused:
                return
            loop = asyncio.get_running_loop()
            now = loop.time()
            if now - self._resumed_at.get(dependency, -CALM_AFTER_S) >= CALM_AFTER_S:
                self._step[dependency] = 0
            first = not self.is_paused
            paused = self._paused[dependency] = _Paused(
                now, dt.datetime.now(dt.UTC), error_text(error)[:MAX_ERROR_CHARS]
            )
            self.running.clear()
            self._gauge.labels(worker=self._worker, dependency=dependency).set(1)
            log.warning(
                "worker.paused",
                worker=self._worker,
                dependency=str(dependency),
                error=paused.error,
                probe_in_s=self._delay(dependency),
            )
            if first:
                await self._on_pause(True)
            paused.task = asyncio.create_task(
                self._probe_until_up(dependency), name=f"{self._worker}-probe-{dependency}"
            )

    def describe(self) -> list[dict[str, Any]]:
        """What /readyz shows of each pause."""
        now = asyncio.get_running_loop().time()
        return [
            {
                "dependency": str(dependency),
                "since": p.at.isoformat(),
                "paused_s": round(now - p.since, 1),
                "error": p.error,
            }
            for dependency, p in self._paused.items()
        ]

    async def close(self) -> None:
        for paused in list(self._paused.values()):
            if paused.task is not None:
                # Its resume may be consuming again: aio-pika can swallow a cancellation
                # while it opens a channel.
                await cancel_and_wait(paused.task, again_after_s=1.0)

    def _delay(self, dependency: Dependency) -> float:
        step = self._step.get(dependency, 0)
        return self._backoff_s[min(step, len(self._backoff_s) - 1)]

    async def _probe_until_up(self, dependency: Dependency) -> None:
        probe = self._probes.get(dependency)
        while True:
            await asyncio.sleep(self._delay(dependency))
            self._step[dependency] = self._step.get(dependency, 0) + 1
            if probe is None:
                break  # nothing to ask: the next message is the probe
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    await probe()
            except Exception:  # still down: the pause line said so once
                continue
            break
        await self._resume(dependency)

    async def _resume(self, dependency: Dependency) -> None:
        async with self._transitions:
            paused = self._paused.pop(dependency)
            loop = asyncio.get_running_loop()
            self._resumed_at[dependency] = loop.time()
            self._gauge.labels(worker=self._worker, dependency=dependency).set(0)
            log.info(
                "worker.resumed",
                worker=self._worker,
                dependency=str(dependency),
                paused_s=round(loop.time() - paused.since, 3),
            )
            if not self._paused and self._held is None:  # an operator's hold outlasts it
                await self._on_resume()
                self.running.set()
