"""Load for `bench.workers`: client processes sending the paid webhooks as fast as ingest
accepts them or paced to a rate, each noting when every event was first accepted."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import uvloop

from bench.load import REQUEST_TIMEOUT_S, ClientProcesses, Delivery, Tally, _drive, share_of


class _Stamped(set[str]):
    """The `ok_ids` of bench.load._drive, noting when each event id was first answered 200."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, float] = {}

    def add(self, event_id: str) -> None:
        self.at.setdefault(event_id, time.time())
        super().add(event_id)


async def _drive_paced(
    session: aiohttp.ClientSession,
    url: str,
    deliveries: list[Delivery],
    concurrency: int,
    rate: float,
    deadline: float,
    tally: Tally,
    ok_ids: _Stamped,
) -> None:
    """Like bench.load._drive, but delivery i leaves no earlier than i/rate s after the start."""
    started = time.monotonic()
    limit = asyncio.Semaphore(concurrency)

    async def one(headers: dict[str, str], body: bytes) -> None:
        async with limit:
            await _drive(session, url, [(headers, body)], 1, deadline, tally, ok_ids)

    tasks = []
    for i, (headers, body) in enumerate(deliveries):
        if (delay := started + i / rate - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        if time.monotonic() > deadline:
            break
        tasks.append(asyncio.create_task(one(headers, body)))
    await asyncio.gather(*tasks)


async def _client(
    url: str,
    deliveries: list[Delivery],
    concurrency: int,
    rate: float,
    max_seconds: float,
    barrier: Any,
) -> tuple[Tally, dict[str, float]]:
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        health = url.replace("/webhooks/xhub", "/healthz")

        async def touch() -> None:  # open the keep-alive connections before the start
            async with session.get(health) as response:
                await response.read()

        await asyncio.gather(*(touch() for _ in range(concurrency)))
        barrier.wait(timeout=max_seconds)  # blocks the loop on purpose: nothing else to do
        tally = Tally(started=time.monotonic())
        stamped = _Stamped()
        cpu_started = time.process_time()
        deadline = tally.started + max_seconds
        if rate > 0:
            await _drive_paced(
                session, url, deliveries, concurrency, rate, deadline, tally, stamped
            )
        else:
            await _drive(session, url, deliveries, concurrency, deadline, tally, stamped)
        tally.finished = time.monotonic()
        tally.cpu_s = time.process_time() - cpu_started
        tally.ok_ids = set(stamped)
    return tally, stamped.at


def _client_process(
    url: str,
    deliveries: list[Delivery],
    concurrency: int,
    rate: float,
    max_seconds: float,
    barrier: Any,
    results: Any,
) -> None:
    results.put(uvloop.run(_client(url, deliveries, concurrency, rate, max_seconds, barrier)))


class Clients(ClientProcesses[tuple[Tally, dict[str, float]]]):
    """Client processes sharing the deliveries, the concurrency and the rate (as bench.load's,
    but each also returns when each of its events was accepted)."""

    def __init__(
        self,
        url: str,
        deliveries: list[Delivery],
        concurrency: int,
        rate: float,
        processes: int,
        max_seconds: float,
    ) -> None:
        shares = [
            (
                url,
                deliveries[i::processes],
                share_of(concurrency, processes, i),
                rate / processes,
                max_seconds,
            )
            for i in range(processes)
        ]
        super().__init__(_client_process, shares, max_seconds, start_timeout_s=60)


async def warm_up(url: str, deliveries: list[Delivery], concurrency: int) -> Tally:
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    tally = Tally()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        deadline = time.monotonic() + 120
        await _drive(session, url, deliveries, concurrency, deadline, tally, set())
    return tally
