"""Load generation for `bench.ingest`: signed deliveries, client processes (`bench.workers`'s
are built on the same ClientProcesses), latency stats.

Deliveries are generated up front (signing is not part of what is measured). Each client
process drives its share over a fixed set of lean keep-alive connections (Sender);
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

import orjson
import uvloop

from bench.raw_http import REQUEST_TIMEOUT_S, RawConnection, post_request
from shared.providers.xhub.events import status_changed
from shared.providers.xhub.signatures import signed_headers

Delivery = tuple[dict[str, str], bytes]

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


class Sender:
    """Deliveries as ready-made requests over `concurrency` lean keep-alive connections
    (bench.raw_http): on the same two cores as the system measured, the load generator's own
    CPU is taken from the services (aiohttp's client took ~0.65 ms per request)."""

    def __init__(self, url: str, deliveries: list[Delivery], concurrency: int) -> None:
        self.requests = [post_request(url, headers, body) for headers, body in deliveries]
        self.ids = [headers["X-Webhook-Id"] for headers, _ in deliveries]
        self.connections = [RawConnection(url) for _ in range(concurrency)]

    async def open(self) -> None:
        await asyncio.gather(*(raw.open() for raw in self.connections))

    def close(self) -> None:
        for raw in self.connections:
            raw.close()

    async def drive(
        self, rate: float, deadline: float, tally: Tally, answered_at: dict[str, float]
    ) -> None:
        """Send every request, each connection taking the next in turn, as fast as ingest
        answers or, with a `rate`, request i no earlier than i/rate s after the start (a late
        one goes at once); when each event id was first answered 200 goes into
        `answered_at`."""
        turns = iter(range(len(self.requests)))
        latencies = tally.latencies_s
        started = time.monotonic()

        async def connection(raw: RawConnection) -> None:
            for i in turns:
                if rate > 0 and (delay := started + i / rate - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                if time.monotonic() > deadline:
                    return
                sent = time.perf_counter()
                status, answer = await raw.send(self.requests[i])
                latencies.append(time.perf_counter() - sent)
                if status == 200:
                    answered_at.setdefault(self.ids[i], time.time())
                tally.count(status, answer)

        await asyncio.gather(*(connection(raw) for raw in self.connections))


async def _client(
    url: str,
    warmup: list[Delivery],
    deliveries: list[Delivery],
    concurrency: int,
    max_seconds: float,
    barrier: Any,
) -> Tally:
    answered: dict[str, float] = {}
    warm = Sender(url, warmup, concurrency)
    await warm.open()
    await warm.drive(0, time.monotonic() + max_seconds, Tally(), answered)
    warm.close()
    sender = Sender(url, deliveries, concurrency)
    await sender.open()
    barrier.wait(timeout=max_seconds)  # blocks the loop on purpose: nothing else to do
    tally = Tally(started=time.monotonic())
    cpu_started = time.process_time()
    await sender.drive(0, tally.started + max_seconds, tally, answered)
    tally.finished = time.monotonic()
    tally.cpu_s = time.process_time() - cpu_started
    tally.ok_ids = set(answered)
    sender.close()
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

    def wait_started(self, before: Callable[[], None] | None = None) -> None:
        """Return when the measured phase begins; `before` runs once every process is done
        with its warm-up and waits for it (ANALYZE, say)."""
        if before is not None:
            deadline = time.monotonic() + self._start_timeout_s
            while self._barrier.n_waiting < len(self._processes):
                if time.monotonic() > deadline or not all(p.is_alive() for p in self._processes):
                    break  # the barrier's own timeout or a dead client's results say why
                time.sleep(0.02)
            else:
                before()
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
