"""A worker's pause: taken once per outage, probed with a growing wait, resumed by itself."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge
from structlog.testing import capture_logs

from shared.errors import Dependency
from shared.worker.pause import Hold, Pause

PG, SMTP = Dependency.POSTGRESQL, Dependency.SMTP
BACKOFF_S = (0.01, 0.02, 0.04)


class Dependencies:
    """Probes that fail while a dependency is marked down, counting their calls."""

    def __init__(self) -> None:
        self.down: set[Dependency] = set()
        self.probed: dict[Dependency, int] = {}
        self.hooks: list[str] = []

    def probes(self) -> dict[Dependency, object]:
        def make(dependency: Dependency) -> object:
            async def probe() -> None:
                self.probed[dependency] = self.probed.get(dependency, 0) + 1
                if dependency in self.down:
                    raise ConnectionRefusedError("down")

            return probe

        return {d: make(d) for d in (PG, SMTP)}

    async def on_pause(self, hand_back: bool) -> None:
        self.hooks.append("pause" if hand_back else "hold")

    async def on_resume(self) -> None:
        self.hooks.append("resume")


def make_pause(deps: Dependencies) -> tuple[Pause, Gauge]:
    gauge = Gauge("p", "p", ["worker", "dependency"], registry=CollectorRegistry())
    pause = Pause(
        "email",
        deps.probes(),  # type: ignore[arg-type]
        gauge,
        deps.on_pause,
        deps.on_resume,
        backoff_s=BACKOFF_S,
    )
    return pause, gauge


def value(gauge: Gauge, dependency: Dependency) -> float:
    return gauge.labels(worker="email", dependency=dependency)._value.get()  # type: ignore[no-any-return]


async def until(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise TimeoutError


async def test_a_pause_lasts_until_the_probe_answers_and_logs_twice() -> None:
    deps = Dependencies()
    pause, gauge = make_pause(deps)
    deps.down.add(PG)
    with capture_logs() as logs:
        await pause.pause(PG, ConnectionRefusedError(111, "Connection refused"))
        await pause.pause(PG, ConnectionResetError())  # the same outage: nothing more
        assert not pause.running.is_set()
        assert value(gauge, PG) == 1
        [described] = pause.describe()
        assert described["dependency"] == "postgresql"
        assert described["error"] == "ConnectionRefusedError: [Errno 111] Connection refused"
        await until(lambda: deps.probed.get(PG, 0) >= 4)
        assert pause.is_paused
        deps.down.clear()
        await asyncio.wait_for(pause.running.wait(), 2)
    assert value(gauge, PG) == 0
    assert pause.describe() == []
    assert deps.hooks == ["pause", "resume"]
    assert [e["event"] for e in logs] == ["worker.paused", "worker.resumed"]
    await pause.close()


async def test_the_worker_resumes_only_when_every_dependency_it_paused_for_is_back() -> None:
    deps = Dependencies()
    pause, _ = make_pause(deps)
    deps.down.update({PG, SMTP})
    await pause.pause(PG, TimeoutError())
    await pause.pause(SMTP, ConnectionRefusedError())
    deps.down.discard(PG)
    await until(lambda: [p["dependency"] for p in pause.describe()] == ["smtp"])
    assert not pause.running.is_set()
    deps.down.clear()
    await asyncio.wait_for(pause.running.wait(), 2)
    assert deps.hooks == ["pause", "resume"]  # one pause of the worker, one resume
    await pause.close()


async def test_a_pause_soon_after_a_resume_waits_longer_than_the_last() -> None:
    deps = Dependencies()
    pause, _ = make_pause(deps)
    loop = asyncio.get_running_loop()
    waits = []
    for _ in range(4):  # up at the first probe each time: the wait alone grows
        started = loop.time()
        await pause.pause(SMTP, ConnectionRefusedError())
        await asyncio.wait_for(pause.running.wait(), 2)
        waits.append(loop.time() - started)
    assert waits[0] < BACKOFF_S[1]
    assert waits[1] >= BACKOFF_S[1]
    assert waits[2] >= BACKOFF_S[2]
    assert waits[3] >= BACKOFF_S[2]  # the last step repeats
    await pause.close()


async def test_closing_a_paused_worker_stops_its_probes() -> None:
    deps = Dependencies()
    pause, _ = make_pause(deps)
    deps.down.add(PG)
    await pause.pause(PG, TimeoutError())
    await until(lambda: deps.probed.get(PG, 0) >= 1)
    await pause.close()
    probed = deps.probed[PG]
    await asyncio.sleep(0.1)
    assert deps.probed[PG] == probed


HOLD = Hold("alice", "SMTP provider incident", dt.datetime(2026, 1, 1, tzinfo=dt.UTC))


async def test_an_operators_hold_outlasts_a_dependencys_pause_and_recovery() -> None:
    deps = Dependencies()
    pause, gauge = make_pause(deps)
    await pause.hold(HOLD)
    await pause.hold(HOLD)  # read again by the next re-read: nothing more
    assert pause.held == HOLD
    assert not pause.dependency_paused
    deps.down.add(PG)
    await pause.pause(PG, ConnectionRefusedError())
    deps.down.clear()
    await until(lambda: not pause.dependency_paused)
    assert pause.is_paused
    assert not pause.running.is_set()  # the probe that found PostgreSQL back ended no hold
    assert value(gauge, PG) == 0
    await pause.release()
    assert pause.running.is_set()
    # The hold kept what the worker held (False); the dependency came second: no hand back.
    assert deps.hooks == ["hold", "resume"]
    await pause.close()


async def test_an_operators_release_does_not_end_a_dependencys_pause() -> None:
    deps = Dependencies()
    pause, _ = make_pause(deps)
    deps.down.add(SMTP)
    await pause.pause(SMTP, ConnectionRefusedError())
    await pause.hold(HOLD)
    await pause.release()
    assert pause.dependency_paused
    assert not pause.running.is_set()
    deps.down.clear()
    await asyncio.wait_for(pause.running.wait(), 2)
    assert deps.hooks == ["pause", "resume"]
    await pause.close()
