"""`make soak MINUTES=30` / `python -m tests.chaos.soak`: the whole system for a long while at
about half of what it can process, watched for growth.

First it measures the capacity (payments fully processed per second: a burst of payments
through ingest, orders, bonuses and email), then runs the simulator's traffic at `--load`
(0.5) of it for `--minutes`, sampling every 10 s: RSS and open file descriptors of every
service, PostgreSQL connections of its database, work queue depths and ingest's p99 (from its
own histogram). It prints the first and the last ten minutes side by side (thirds for runs
shorter than 30 minutes) and the check of every payment at the end. No fault is injected.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import aiohttp
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from services.sim.summary import expect
from shared.process.logs import configure_logging
from tests.chaos import storm, verdict
from tests.chaos.stack import Stack
from tests.conftest import TEST_AMQP_URL, TEST_DATABASE_URL

BONUS_POINTS = 500
SAMPLE_S = 10.0
WINDOW_S = 600.0


@dataclass
class Sample:
    t: float
    rss_mb: float
    fds: int
    pg_connections: int
    queued: int
    p99_ms: float | None
    per_service_rss: dict[str, float] = field(default_factory=dict)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _buckets(text: str) -> dict[float, float]:
    for family in text_string_to_metric_families(text):
        if family.name == "payhooks_ingest_duration_seconds":
            return {
                float(s.labels["le"]): s.value for s in family.samples if s.name.endswith("_bucket")
            }
    return {}


def p99_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The 99th percentile between two scrapes of a cumulative histogram (bucket upper bound)."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0.0
    if total <= 0:
        return None
    for le, count in delta:
        if count >= 0.99 * total:
            return le * 1000
    return None


class Watcher:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.samples: list[Sample] = []
        self._last_buckets: dict[float, float] = {}

    async def sample(self, session: aiohttp.ClientSession, started: float) -> Sample:
        pids = self.stack.service_pids()
        per_service = {name: _rss_mb(pid) for name, pid in pids.items()}
        fds = sum(_fds(pid) for pid in pids.values())
        conn = await asyncpg.connect(self.stack.admin_url, timeout=5)
        try:
            pg = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                self.stack.database,
            )
        finally:
            await conn.close()
        queued = 0
        connection = await aio_pika.connect(self.stack.amqp_url, timeout=5)
        async with connection:
            channel = await connection.channel()
            for work in self.stack.topology.work.values():
                queue = await channel.declare_queue(work.name, passive=True)
                queued += queue.declaration_result.message_count or 0
        async with session.get(f"{self.stack.ingest_url}/metrics") as response:
            buckets = _buckets(await response.text())
        p99 = p99_ms(self._last_buckets, buckets)
        self._last_buckets = buckets
        sample = Sample(
            t=time.monotonic() - started,
            rss_mb=sum(per_service.values()),
            fds=fds,
            pg_connections=int(pg),
            queued=queued,
            p99_ms=p99,
            per_service_rss=per_service,
        )
        self.samples.append(sample)
        return sample

    async def run(self, started: float) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while True:
                try:
                    await self.sample(session, started)
                except Exception as e:  # a missed sample is reported, not fatal
                    print(f"sample failed: {e!r}", file=sys.stderr)
                await asyncio.sleep(SAMPLE_S)


async def _all_right(
    stack: Stack, plan: storm.scenario.Plan, timeout_s: float
) -> dict[str, dict[str, str]]:
    expectations = [expect(p, BONUS_POINTS) for p in plan.payments]
    ids = [p.payment_id for p in plan.payments]
    deadline = time.monotonic() + timeout_s
    while True:
        found = verdict.judge(
            expectations, await verdict.observe(stack.database_url, ids, stack.smtp)
        )
        if not any(set(why) - {"story"} for why in found.values()) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(2.0)


async def capacity(stack: Stack, payments: int) -> float:
    """Payments fully processed per second for a burst of `payments` (no lost webhooks)."""
    config = storm.StormConfig(payments=payments, sends_per_s=1000, concurrency=64, lost_rate=0)
    plan = await storm.prepare(stack, config)
    started = time.monotonic()
    await storm.deliver(stack, plan, config)
    await _all_right(stack, plan, timeout_s=600)
    return payments / (time.monotonic() - started)


def _summary(samples: list[Sample], lo: float, hi: float) -> dict[str, str]:
    window = [s for s in samples if lo <= s.t < hi]
    if not window:
        return {}
    p99s = [s.p99_ms for s in window if s.p99_ms is not None]

    def mean_max(values: list[float], unit: str) -> str:
        return f"{statistics.fmean(values):.1f} / {max(values):.1f} {unit}"

    return {
        "services RSS (mean / max)": mean_max([s.rss_mb for s in window], "MB"),
        "open fds (mean / max)": mean_max([float(s.fds) for s in window], ""),
        "PostgreSQL connections (mean / max)": mean_max(
            [float(s.pg_connections) for s in window], ""
        ),
        "messages queued (mean / max)": mean_max([float(s.queued) for s in window], ""),
        "ingest p99 (mean / max)": mean_max(p99s, "ms") if p99s else "-",
    }


async def soak(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    stack = Stack(TEST_DATABASE_URL, TEST_AMQP_URL, args.out, name="soak", proxied=False)
    watcher = Watcher(stack)
    try:
        await stack.start(args.out / "soak.log")
        rate = args.rate or args.load * await capacity(stack, args.capacity_payments)
        if not args.rate:
            print(f"capacity measured; soaking at {rate:.1f} payments/s", file=sys.stderr)
        duration_s = args.minutes * 60
        config = storm.StormConfig(payments=max(1, round(rate * duration_s)), concurrency=32)
        plan = await storm.prepare(stack, config)
        config = storm.StormConfig(
            payments=config.payments,
            sends_per_s=len(plan.sends) / duration_s,
            concurrency=32,
        )
        started = time.monotonic()
        sampler = asyncio.create_task(watcher.run(started))
        records = await storm.deliver(stack, plan, config)
        traffic_s = time.monotonic() - started
        found = await _all_right(stack, plan, timeout_s=300)
        sampler.cancel()
        dead = await stack.dead_letters()
    finally:
        await stack.close()
    with (args.out / "soak-samples.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t_s", "rss_mb", "fds", "pg_connections", "queued", "p99_ms"])
        for s in watcher.samples:
            writer.writerow(
                [f"{s.t:.0f}", f"{s.rss_mb:.1f}", s.fds, s.pg_connections, s.queued, s.p99_ms]
            )
    span = watcher.samples[-1].t if watcher.samples else 0.0
    window = min(WINDOW_S, span / 3)
    first, last = (
        _summary(watcher.samples, 0, window),
        _summary(watcher.samples, span - window, span + 1),
    )
    answers = [c for r in records for c in r.http_statuses]
    problems = verdict.counts(found)
    print(
        f"soak: {args.minutes:g} min at {rate:.1f} payments/s ({len(plan.payments)} payments,"
        f" {len(answers)} answers, traffic {traffic_s:.0f} s)"
    )
    print(
        f"\n| sampled every {SAMPLE_S:g} s | first {window / 60:.0f} min"
        f" | last {window / 60:.0f} min |"
    )
    print("|---|---|---|")
    for key in first:
        print(f"| {key} | {first[key]} | {last.get(key, '-')} |")
    wrong = len(found) - problems.get("story", 0) if found else 0
    print(
        f"\ncheck: {len(plan.payments) - len(found)}/{len(plan.payments)} payments as expected;"
        f" problems {problems}; dead letters {dead};"
        f" 5xx {sum(1 for c in answers if c and c >= 500)}"
    )
    return 0 if wrong == 0 and not any(dead.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--load", type=float, default=0.5, help="share of the measured capacity")
    parser.add_argument("--rate", type=float, default=None, help="payments/s (skips measuring)")
    parser.add_argument("--capacity-payments", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=Path("chaos-out"))
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
