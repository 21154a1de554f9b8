"""Load generation for `bench.ingest`: signed deliveries, client processes (`bench.workers`'s
are built on the same ClientProcesses), latency stats.

Deliveries are generated up front (signing is not part of what is measured). Each client
process drives its share with a fixed pool of workers over one keep-alive TCPConnector;
the processes start the measured phase together at a barrier, after a warm-up.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import aiohttp
import orjson
import uvloop

from shared.xhub.events import status_changed
from shared.xhub.signatures import signed_headers

Delivery = tuple[dict[str, str], bytes]

REQUEST_TIMEOUT_S = 15.0
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Plan:
    deliveries: list[Delivery]
    distinct_ids: int


def _payload(rng: random.Random, serial: int, body_size: int) -> bytes:
    payment_id = f"pay_{serial:010d}"
    created_at = f"2026-11-30T10:{serial // 60 % 60:02d}:{serial % 60:02d}Z"
    payload: dict[str, Any]
    if rng.random() < 0.8:
        status = rng.choice(("paid", "paid", "paid", "failed", "pending"))
        amount = f"{rng.randint(100, 999_999) / 100:.2f}"
        external_id = f"ord_{serial:010d}"
        payload = status_changed(
            payment_id, status, amount, "USD", created_at, external_id=external_id
        )
    else:
        payload = {
            "event": "refund.succeeded",
            "refund_id": f"ref_{serial:010d}",
            "payment_id": payment_id,
            "amount": f"{rng.randint(100, 99_999) / 100:.2f}",
            "currency": "EUR",
            "created_at": created_at,
        }
    payload["description"] = ""
    pad = max(0, body_size - len(orjson.dumps(payload)))
    payload["description"] = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=pad))
    return orjson.dumps(payload)


def make_plan(
    n: int,
    duplicate_share: float,
    secret: bytes,
    *,
    id_prefix: str,
    body_size: int = 1024,
    window: int = 128,
    seed: int = 1,
) -> Plan:
    """`n` signed deliveries; a `duplicate_share` of them resend an earlier event.

    Half of the resends repeat one of the last `window` events (likely still in flight: the
    concurrent-duplicate case), the other half any earlier one (a provider retry).
    """
    rng = random.Random(seed)
    dups = round(n * duplicate_share)
    kinds = [True] * dups + [False] * (n - dups)
    rng.shuffle(kinds)
    if kinds and kinds[0]:  # the first delivery cannot be a resend: swap with a new one
        first_new = kinds.index(False)
        kinds[0], kinds[first_new] = False, True
    now_s = time.time()
    events: list[tuple[str, bytes]] = []
    deliveries: list[Delivery] = []
    for is_dup in kinds:
        if is_dup:
            pool = events[-window:] if rng.random() < 0.5 else events
            event_id, body = rng.choice(pool)
        else:
            serial = len(events)
            event_id, body = f"{id_prefix}{serial:08d}", _payload(rng, serial, body_size)
            events.append((event_id, body))
        headers = signed_headers(secret, event_id, body, now_s)
        deliveries.append((headers, body))
    return Plan(deliveries, len(events))


@dataclass(slots=True)
class Tally:
    """What one client process saw in the measured phase."""

    latencies_s: array[float] = field(default_factory=lambda: array("d"))
    accepted: int = 0
    duplicate: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    started: float = 0.0
    finished: float = 0.0
    cpu_s: float = 0.0
    # Every event id answered 200 at least once, warm-up included: each must be stored.
    ok_ids: set[str] = field(default_factory=set)

    @property
    def errors(self) -> int:
        return sum(self.statuses.values()) - self.accepted - self.duplicate

    def count(self, status: int, answer: bytes) -> None:
        """One answer: 200 accepted or duplicate, else its status (0: the client's error,
        named in `answer`)."""
        if status == 200 and b'"accepted"' in answer:
            self.accepted += 1
            self.statuses["200"] += 1
        elif status == 200 and b'"duplicate"' in answer:
            self.duplicate += 1
            self.statuses["200"] += 1
        else:
            self.statuses[str(status) if status else answer.decode()] += 1


async def _drive(
    session: aiohttp.ClientSession,
    url: str,
    deliveries: list[Delivery],
    concurrency: int,
    deadline: float,
    tally: Tally,
    ok_ids: set[str],
) -> None:
    remaining = iter(deliveries)
    latencies = tally.latencies_s

    async def worker() -> None:
        for headers, body in remaining:
            if time.monotonic() > deadline:
                return
            started = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    answer = await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as e:
                status, answer = 0, type(e).__name__.encode()
            latencies.append(time.perf_counter() - started)
            if status == 200:
                ok_ids.add(headers["X-Webhook-Id"])
            tally.count(status, answer)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _client(
    url: str,
    warmup: list[Delivery],
    deliveries: list[Delivery],
    concurrency: int,
    max_seconds: float,
    barrier: Any,
) -> Tally:
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        ok_ids: set[str] = set()
        deadline = time.monotonic() + max_seconds
        await _drive(session, url, warmup, concurrency, deadline, Tally(), ok_ids)
        barrier.wait(timeout=max_seconds)  # blocks the loop on purpose: nothing else to do
        tally = Tally(started=time.monotonic(), ok_ids=ok_ids)
        cpu_started = time.process_time()
        deadline = tally.started + max_seconds
        await _drive(session, url, deliveries, concurrency, deadline, tally, ok_ids)
        tally.finished = time.monotonic()
        tally.cpu_s = time.process_time() - cpu_started
    return tally


def _client_process(
    url: str,
    warmup: list[Delivery],
    deliveries: list[Delivery],
    concurrency: int,
    max_seconds: float,
    barrier: Any,
    results: Any,
) -> None:
    tally = uvloop.run(_client(url, warmup, deliveries, concurrency, max_seconds, barrier))
    results.put(tally)


class ClientProcesses(Generic[R]):
    """Client processes that start their measured phase together at a barrier, each putting
    one result (R) on a queue.

    `target(*share, barrier, results)` runs in each process, one `share` of arguments each.
    Use: `start()`, then `wait_started()` returns when the measured phase begins, then
    `join()` returns one result per process.
    """

    def __init__(
        self,
        target: Callable[..., None],
        shares: list[tuple[Any, ...]],
        max_seconds: float,
        start_timeout_s: float,
    ) -> None:
        context = multiprocessing.get_context("fork")  # the deliveries are inherited, not copied
        self._barrier = context.Barrier(len(shares) + 1)
        self._results = context.Queue()
        self._max_seconds = max_seconds
        self._start_timeout_s = start_timeout_s
        self._processes = [
            context.Process(target=target, args=(*share, self._barrier, self._results), daemon=True)
            for share in shares
        ]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def start(self) -> None:
        for process in self._processes:
            process.start()

    def wait_started(self) -> None:
        self._barrier.wait(timeout=self._start_timeout_s)

    def join(self) -> list[R]:
        results: list[R] = [
            self._results.get(timeout=self._max_seconds + REQUEST_TIMEOUT_S + 30)
            for _ in self._processes
        ]
        for process in self._processes:
            process.join(timeout=10)
        return results

    def stop(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)


def share_of(concurrency: int, processes: int, i: int) -> int:
    """Process i's part of the connections: an even split, the remainder to the first ones."""
    return concurrency // processes + (i < concurrency % processes)


class Clients(ClientProcesses[Tally]):
    """`processes` client processes splitting the deliveries and the concurrency between them;
    the measured phase begins after each has sent its share of the warm-up."""

    def __init__(
        self,
        url: str,
        warmup: list[Delivery],
        deliveries: list[Delivery],
        concurrency: int,
        processes: int,
        max_seconds: float,
    ) -> None:
        shares = [
            (
                url,
                warmup[i::processes],
                deliveries[i::processes],
                share_of(concurrency, processes, i),
                max_seconds,
            )
            for i in range(processes)
        ]
        super().__init__(_client_process, shares, max_seconds, start_timeout_s=max_seconds + 30)


@dataclass(frozen=True, slots=True)
class Summary:
    requests: int
    accepted: int
    duplicate: int
    errors: int
    statuses: dict[str, int]
    elapsed_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    client_cpu_s: float
    ok_ids: set[str]

    @property
    def accepted_per_s(self) -> float:
        return self.accepted / self.elapsed_s

    @property
    def duplicate_per_s(self) -> float:
        return self.duplicate / self.elapsed_s

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.elapsed_s


def summarize(tallies: list[Tally]) -> Summary:
    latencies = sorted(x for t in tallies for x in t.latencies_s)
    statuses: Counter[str] = Counter()
    for t in tallies:
        statuses.update(t.statuses)

    def quantile_ms(q: float) -> float:
        if not latencies:
            return float("nan")
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    return Summary(
        requests=len(latencies),
        accepted=sum(t.accepted for t in tallies),
        duplicate=sum(t.duplicate for t in tallies),
        errors=sum(t.errors for t in tallies),
        statuses=dict(statuses),
        elapsed_s=max(t.finished for t in tallies) - min(t.started for t in tallies),
        p50_ms=quantile_ms(0.50),
        p99_ms=quantile_ms(0.99),
        max_ms=latencies[-1] * 1000 if latencies else float("nan"),
        client_cpu_s=sum(t.cpu_s for t in tallies),
        ok_ids=set().union(*(t.ok_ids for t in tallies)),
    )
