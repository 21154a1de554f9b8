"""Load for `bench.workers`: client processes sending the paid webhooks as fast as ingest
accepts them or paced to a rate, each noting when every event was first accepted (bench.load's
Sender, with a rate)."""

from __future__ import annotations

import time
from typing import Any

import uvloop

from bench.load import ClientProcesses, Delivery, Sender, Tally, share_of


async def _client(
    url: str,
    deliveries: list[Delivery],
    concurrency: int,
    rate: float,
    max_seconds: float,
    barrier: Any,
) -> tuple[Tally, dict[str, float]]:
    sender = Sender(url, deliveries, concurrency)
    await sender.open()  # before the start
    barrier.wait(timeout=max_seconds)  # blocks the loop on purpose: nothing else to do
    tally = Tally(started=time.monotonic())
    stamped: dict[str, float] = {}
    cpu_started = time.process_time()
    await sender.drive(rate, tally.started + max_seconds, tally, stamped)
    tally.finished = time.monotonic()
    tally.cpu_s = time.process_time() - cpu_started
    tally.ok_ids = set(stamped)
    sender.close()
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
    but each also returns when each of its events was accepted). With several URLs (copies of
    ingest), process i sends to URL i modulo their number."""

    def __init__(
        self,
        url: str | list[str],
        deliveries: list[Delivery],
        concurrency: int,
        rate: float,
        processes: int,
        max_seconds: float,
    ) -> None:
        urls = [url] if isinstance(url, str) else url  # copies of ingest: process i -> i % n
        shares = [
            (
                urls[i % len(urls)],
                deliveries[i::processes],
                share_of(concurrency, processes, i),
                rate / processes,
                max_seconds,
            )
            for i in range(processes)
        ]
        super().__init__(_client_process, shares, max_seconds, start_timeout_s=60)


async def warm_up(url: str, deliveries: list[Delivery], concurrency: int) -> Tally:
    sender = Sender(url, deliveries, concurrency)
    tally = Tally()
    try:
        await sender.open()
        await sender.drive(0, time.monotonic() + 120, tally, {})
    finally:
        sender.close()
    return tally
