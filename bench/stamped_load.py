"""Load for `bench.workers`: client processes sending the paid webhooks as fast as ingest
accepts them or paced to a rate, each noting when every event was first accepted. They send
through bench.raw_http's lean connections: on the same two cores as the system measured, the
load generator's own CPU is taken from the services."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import uvloop

from bench.load import REQUEST_TIMEOUT_S, ClientProcesses, Delivery, Tally, share_of
from bench.load import _drive as _drive_aiohttp
from bench.raw_http import RawConnection, post_request


async def _drive(
    connections: list[RawConnection],
    requests: list[bytes],
    ids: list[str],
    rate: float,
    deadline: float,
    tally: Tally,
    stamped: dict[str, float],
) -> None:
    """The connections sending the requests in turn, as fast as ingest answers or, with a
    `rate`, request i no earlier than i/rate s after the start (a late one goes at once);
    when each event id (`ids[i]`) was first answered 200 goes into `stamped`."""
    turns = iter(range(len(requests)))
    latencies = tally.latencies_s
    started = time.monotonic()

    async def connection(raw: RawConnection) -> None:
        try:
            for i in turns:
                if rate > 0 and (delay := started + i / rate - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                if time.monotonic() > deadline:
                    return
                sent = time.perf_counter()
                status, answer = await raw.send(requests[i])
                latencies.append(time.perf_counter() - sent)
                if status == 200:
                    stamped.setdefault(ids[i], time.time())
                tally.count(status, answer)
        finally:
            raw.close()

    await asyncio.gather(*(connection(raw) for raw in connections))


async def _client(
    url: str,
    deliveries: list[Delivery],
    concurrency: int,
    rate: float,
    max_seconds: float,
    barrier: Any,
) -> tuple[Tally, dict[str, float]]:
    requests = [post_request(url, headers, body) for headers, body in deliveries]
    ids = [headers["X-Webhook-Id"] for headers, _ in deliveries]
    connections = [RawConnection(url) for _ in range(concurrency)]
    await asyncio.gather(*(raw.open() for raw in connections))  # before the start
    barrier.wait(timeout=max_seconds)  # blocks the loop on purpose: nothing else to do
    tally = Tally(started=time.monotonic())
    stamped: dict[str, float] = {}
    cpu_started = time.process_time()
    deadline = tally.started + max_seconds
    await _drive(connections, requests, ids, rate, deadline, tally, stamped)
    tally.finished = time.monotonic()
    tally.cpu_s = time.process_time() - cpu_started
    tally.ok_ids = set(stamped)
    return tally, stamped


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
        await _drive_aiohttp(session, url, deliveries, concurrency, deadline, tally, set())
    return tally
