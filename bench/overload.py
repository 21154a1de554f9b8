"""Overload bench: ingest at twice what it can take, with no workers, then RabbitMQ blocking it.

    python -m bench.overload [--capacity-seconds 10] [--seconds 20] [--factor 2]

It starts its own `payhooks run ingest` (free port, database `payhooks_bench`, AMQP prefix
`bench-overload.`, no workers: the orders queue only grows) and, against 127.0.0.1 only:
1. capacity: closed-loop load (bench.load, 64 connections) for --capacity-seconds: accepted/s;
2. overload: --factor times that, offered at a fixed rate (bench.stamped_load, up to
   --concurrency connections) for --seconds: answers by status, latency, ingest RSS sampled
   every 0.5 s, and whether every event answered 200 is stored;
3. connection.blocked: 100 webhooks/s while RabbitMQ's memory alarm blocks publishers for 6 s
   (the watermark is put back in a `finally`): time to the first 503, latency while blocked,
   /readyz meanwhile, time to the first 200 after the alarm cleared.
At the end the server is stopped, its queues are deleted and the inbox emptied.
Exit status 1 if an answer was a 5xx other than 503, took 10 s or more, or a 200 is not stored.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import asyncpg

from bench.backing import INBOX_TABLES, reset, topology_of
from bench.blocked import BlockedRun, run_blocked
from bench.ingest import BENCH_DATABASE_URL, DEFAULT_AMQP_URL, Server
from bench.load import Clients, Summary, make_plan, summarize
from bench.observe import peak_rss_mb, wait_quiet
from bench.processes import migrate, service_env
from bench.stamped_load import Clients as PacedClients
from tests.rabbitmq_alarm import unavailable_reason

BUDGET_MS = 10_000.0  # the provider's hard budget (SPEC section 3)


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class RssSampler(threading.Thread):
    """The server's RSS every `interval_s` until stopped."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            if (mb := rss_mb(self.pid)) is not None:
                self.samples.append(mb)


async def stored(database_url: str, event_ids: set[str]) -> int:
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM inbox WHERE event_id = ANY($1::text[])", list(event_ids)
        )
    finally:
        await conn.close()
    return int(count)


def capacity(args: argparse.Namespace, url: str, secret: bytes) -> Summary:
    run_id = f"cap-{uuid.uuid4().hex[:8]}-"
    warmup = make_plan(1000, 0.0, secret, id_prefix=run_id + "w")
    plan = make_plan(args.capacity_max, 0.0, secret, id_prefix=run_id + "m")
    clients = Clients(url, warmup.deliveries, plan.deliveries, 64, 2, args.capacity_seconds)
    clients.start()
    try:
        clients.wait_started()
        return summarize(clients.join())
    finally:
        clients.stop()


def overload(
    args: argparse.Namespace, url: str, secret: bytes, rate: float, pid: int
) -> tuple[Summary, list[float]]:
    plan = make_plan(
        int(rate * args.seconds), 0.0, secret, id_prefix=f"ovl-{uuid.uuid4().hex[:8]}-"
    )
    clients = PacedClients(url, plan.deliveries, args.concurrency, rate, 2, args.seconds)
    sampler = RssSampler(pid)
    clients.start()
    try:
        clients.wait_started()
        sampler.start()
        results = clients.join()
    finally:
        sampler.done.set()
        clients.stop()
    return summarize([tally for tally, _ in results]), sampler.samples


def others(statuses: dict[str, int]) -> tuple[int, int]:
    """(5xx other than 503, answers that were no HTTP answer at all)."""
    other_5xx = sum(n for s, n in statuses.items() if s.isdigit() and s[0] == "5" and s != "503")
    return other_5xx, sum(n for s, n in statuses.items() if not s.isdigit())


def report_overload(s: Summary, rate: float, rss: list[float], hwm: float | None) -> bool:
    other_5xx, no_answer = others(s.statuses)
    print(f"  offered {rate:,.0f}/s, sent {s.requests_per_s:,.0f}/s for {s.elapsed_s:.1f} s")
    print(
        f"  answered 200: {s.statuses.get('200', 0):,} ({s.accepted_per_s:,.0f}/s)"
        f"  503: {s.statuses.get('503', 0):,}  other 5xx: {other_5xx}  no answer: {no_answer}"
        f"  other: { {k: v for k, v in s.statuses.items() if k[0] not in '5' and k != '200'} }"
    )
    print(f"  latency p50 / p99 / max: {s.p50_ms:.0f} / {s.p99_ms:.0f} / {s.max_ms:.0f} ms")
    if rss:
        print(
            f"  ingest RSS MB: start {rss[0]:.0f}, max {max(rss):.0f}, end {rss[-1]:.0f}"
            f" (peak over the process's life {hwm or 0:.0f})"
        )
    return other_5xx == 0 and no_answer == 0 and s.max_ms < BUDGET_MS


def report_blocked(run: BlockedRun) -> bool:
    during = run.during_block()
    first_503 = run.first_after(run.alarm_requested, 503)
    back_200 = run.first_after(run.alarm_cleared, 200)
    latencies = sorted(done - sent for sent, done, _ in during)
    statuses = sorted({s for _, _, s in during})
    setting_s = run.alarm_set - run.alarm_requested
    if first_503 is None:
        print("  no 503")
    else:
        print(
            f"  first 503 {first_503:.3f} s after `rabbitmqctl` began (it took {setting_s:.3f} s)"
        )
    if latencies:
        print(
            f"  while blocked: {len(during)} answers {statuses}, latency max"
            f" {latencies[-1] * 1000:.0f} ms, p50 {latencies[len(latencies) // 2] * 1000:.0f} ms"
        )
    print(f"  /readyz while blocked: {run.readiness}")
    if back_200 is None:
        print("  no 200 after the alarm cleared")
    else:
        print(f"  first 200 {back_200:.3f} s after the watermark was put back")
    ok = all(s in (200, 503) for s in statuses) and bool(latencies) and latencies[-1] < 10
    return ok and first_503 is not None


def run(args: argparse.Namespace) -> bool:
    secret = secrets.token_hex(16)
    env = service_env(
        ("INGEST_TLS_", "XHUB_", "AMQP_"),
        database_url=args.database_url,
        amqp_url=args.amqp_url,
        prefix=args.prefix,
        secret=secret,
        log_level="WARNING",
    )
    topology = topology_of(env)
    migrate(args.database_url)
    asyncio.run(reset(args.database_url, args.amqp_url, topology, INBOX_TABLES))
    ok = True
    with open(args.server_log, "ab") as log, tempfile.TemporaryFile() as errors:
        server = Server("ingest", env, log, errors)
        try:
            server.start()
            url = f"{server.base_url}/webhooks/xhub"
            print(f"ingest pid {server.pid} on {server.base_url}, no workers", flush=True)
            wait_quiet(args.quiet_wait)
            cap = capacity(args, url, secret.encode())
            print(
                f"capacity: {cap.accepted_per_s:,.0f} accepted/s (64 connections,"
                f" {cap.elapsed_s:.1f} s), p50 {cap.p50_ms:.0f} ms, p99 {cap.p99_ms:.0f} ms",
                flush=True,
            )
            rate = args.factor * cap.accepted_per_s
            print(f"overload: {args.factor:g}x capacity, up to {args.concurrency} connections")
            summary, rss = overload(args, url, secret.encode(), rate, server.pid)
            ok &= report_overload(summary, rate, rss, peak_rss_mb(server.pid))
            kept = asyncio.run(stored(args.database_url, summary.ok_ids))
            print(f"  events answered 200 and stored: {kept:,} of {len(summary.ok_ids):,}")
            ok &= kept == len(summary.ok_ids)
            if reason := unavailable_reason():
                print(f"connection.blocked: skipped, {reason}")
            else:
                print("connection.blocked: 100 webhooks/s, RabbitMQ's memory alarm for 6 s")
                plan = make_plan(1200, 0.0, secret.encode(), id_prefix="blk-")
                blocked = asyncio.run(run_blocked(url, plan.deliveries, 100, 3.0, 6.0))
                ok &= report_blocked(blocked)
        finally:
            server.stop()
            asyncio.run(reset(args.database_url, args.amqp_url, topology, INBOX_TABLES))
    print("verdict:", "ok" if ok else "FAILED")
    return ok


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__.split("\n")[0])
    p.add_argument("--capacity-seconds", type=float, default=10.0)
    p.add_argument("--capacity-max", type=int, default=40_000, help="requests at most")
    p.add_argument("--seconds", type=float, default=20.0, help="overload duration")
    p.add_argument("--factor", type=float, default=2.0, help="offered load / capacity")
    p.add_argument("--concurrency", type=int, default=1024, help="connections at most")
    p.add_argument("--quiet-wait", type=float, default=60.0)
    p.add_argument("--database-url", default=BENCH_DATABASE_URL)
    p.add_argument("--amqp-url", default=os.environ.get("AMQP_URL", DEFAULT_AMQP_URL))
    p.add_argument("--prefix", default="bench-overload.")
    p.add_argument("--server-log", default=os.devnull, help="where the ingest logs")
    args = p.parse_args(argv)
    if not args.prefix:
        p.error("the server's queues are deleted at the end: --prefix must not be empty")
    return args


def main(argv: list[str] | None = None) -> int:
    return 0 if run(parse_args(argv)) else 1


if __name__ == "__main__":
    sys.exit(main())
