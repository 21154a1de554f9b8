"""Ingest benchmark: the batched accept path against the naive one, on this machine.

    python -m bench.ingest [--n 50000] [--concurrency 64] [--duplicates 0.1]
    python -m bench.ingest --url http://127.0.0.1:8080 --pid PID   # an ingest already running

By default it starts, one after the other, `payhooks run ingest` and `python -m
bench.naive_ingest` as its own subprocesses (own port, database `payhooks_bench`, AMQP prefix
`bench.`, logs to /dev/null), drives the same kind of load at each, checks that every distinct
event is stored once and published (queued at least once; once per ingest process), then
stops the server and deletes its queues and exchanges. With --url it only drives load (and
checks by event id) at a service it does not own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from typing import IO
from urllib.parse import urlsplit

import aio_pika
import asyncpg

from bench.backing import INBOX_TABLES, analyze, first_node, own_vhost, reset, topology_of
from bench.load import Clients, Plan, Summary, make_plan, summarize
from bench.observe import (
    CLK_TCK,
    busy_idle,
    cpu_ticks,
    cpu_used,
    mean_delta,
    peak_rss_per_process_mb,
    scrape,
    wait_quiet,
)
from bench.processes import ROOT, OwnedProcess, free_port, migrate, payhooks, service_env

BENCH_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/payhooks_bench"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
# Measured on the 2-core machine (batched, n=20,000, C=64): 2 client processes reach ~10%
# more accepted/s with a ~30% lower p99 than one; a pair can drive ~8,500 req/s at a no-op
# endpoint, so the client is not what limits the figures.
CLIENT_PROCESSES = 2
TARGET_ACCEPTED_PER_S, TARGET_P99_MS, TARGET_RATIO = 5000.0, 40.0, 2.0
# CPU (% of one core) used by processes that are not part of the benchmark, above which a
# run's figures say more about the neighbours than about the ingest.
DISTURBED_PCT = 20.0


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    summary: Summary
    peak_rss_mb: float | None
    cpu_pct: dict[str, float]  # 100 = one core busy, over the measured phase
    avg_batch: float | None
    avg_confirm_ms: float | None
    distinct_ids: int
    check: Check

    @property
    def unattributed_pct(self) -> float:
        """Kernel work and processes that came and went (other people's tests) meanwhile."""
        groups = ("ingest", "clients", "postgres", "rabbitmq", "other")
        return self.cpu_pct["all"] - sum(self.cpu_pct[g] for g in groups)

    @property
    def ingest_us_per_request(self) -> float | None:
        if self.peak_rss_mb is None:  # no pid given: the ingest's CPU is unknown
            return None
        return self.cpu_pct["ingest"] * 10_000 / self.summary.requests_per_s

    @property
    def correct(self) -> bool:
        return self.check.ok(len(self.summary.ok_ids))


@dataclass(frozen=True, slots=True)
class Check:
    """What the inbox and the orders queue hold for one run's event ids."""

    rows: int  # inbox rows of this run
    rows_answered_200: int  # of those, rows of events answered 200 at least once
    unpublished: int  # rows not marked published (the naive path stores no such marks)
    queued: int  # messages this run added to the orders queue

    def ok(self, answered_200: int) -> bool:
        """Every event answered 200 is stored, and every stored row was published: confirmed
        (no unpublished mark left) and in the queue. Within one ingest process a row is
        published once; copies of an event that reach two processes (INGEST_PROCESSES,
        replicas) may publish it twice, which consumers drop (reported, not a failure)."""
        return (
            self.rows_answered_200 == answered_200
            and self.unpublished == 0
            and self.queued >= self.rows
        )


# --- servers we own ---------------------------------------------------------------------------


def server_command(name: str) -> list[str]:
    if name == "naive":
        return [sys.executable, "-m", "bench.naive_ingest"]
    return payhooks("run", "ingest")


class Server(OwnedProcess):
    """One ingest subprocess we own: started on a free port, stopped with SIGTERM."""

    def __init__(self, name: str, env: dict[str, str], log: IO[bytes], errors: IO[bytes]) -> None:
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._env = {**env, "INGEST_PORT": str(self.port)}
        self._log = log
        self._errors = errors

    def start(self, ready_timeout_s: float = 30.0) -> None:
        self.process = subprocess.Popen(
            server_command(self.name),
            env=self._env,
            cwd=ROOT,
            stdout=self._log,
            stderr=self._errors,
        )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._errors.seek(0)
                tail = self._errors.read()[-3000:].decode(errors="replace")
                raise RuntimeError(f"{self.name} ingest exited at startup:\n{tail}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.base_url}/readyz", timeout=2) as response,
            ):
                if response.status == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} ingest not ready in {ready_timeout_s}s")


# --- the database and the broker --------------------------------------------------------------


async def _check(
    database_url: str, amqp_url: str, queue: str, run_id: str, answered_200: set[str]
) -> Check:
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS rows, count(*) FILTER (WHERE event_id = ANY($2::text[])) AS ok,"
            " count(u.id) AS unpublished"
            " FROM inbox i LEFT JOIN inbox_unpublished u ON u.id = i.id"
            " WHERE provider = 'xhub' AND event_id LIKE $1",
            run_id + "%",
            list(answered_200),
        )
    finally:
        await conn.close()
    assert row is not None
    return Check(row["rows"], row["ok"], row["unpublished"], await _queued(amqp_url, queue))


async def _queued(amqp_url: str, queue: str) -> int:
    connection = await aio_pika.connect(first_node(amqp_url), timeout=5)
    async with connection:
        declared = await (await connection.channel()).declare_queue(queue, passive=True)
        return declared.declaration_result.message_count or 0


async def _repeated_messages(amqp_url: str, queue: str, expected: int) -> Counter[str]:
    """Drain `queue` (ours, about to be deleted) and count message ids sent more than once."""
    seen: Counter[str] = Counter()
    connection = await aio_pika.connect(first_node(amqp_url), timeout=5)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1000)
        source = await channel.get_queue(queue, ensure=False)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(60), source.iterator(no_ack=True) as messages:
                async for message in messages:
                    seen[message.message_id or "?"] += 1
                    if sum(seen.values()) >= expected:
                        break
    return Counter({k: n for k, n in seen.items() if n > 1})


# --- one run ----------------------------------------------------------------------------------


def run_one(
    name: str,
    args: argparse.Namespace,
    base_url: str,
    server_pid: int | None,
    secret: bytes,
) -> Result:
    run_id = f"bench-{uuid.uuid4().hex[:8]}-"
    warmup = make_plan(args.warmup, 0.0, secret, id_prefix=run_id + "w", body_size=args.body_size)
    plan: Plan = make_plan(
        args.n, args.duplicates, secret, id_prefix=run_id + "m", body_size=args.body_size
    )
    queue = f"{args.prefix}orders"
    database = urlsplit(args.database_url).path.lstrip("/")
    queued_before = asyncio.run(_queued(args.amqp_url, queue))
    wait_quiet(args.quiet_wait)

    clients = Clients(
        f"{base_url}/webhooks/xhub",
        warmup.deliveries,
        plan.deliveries,
        args.concurrency,
        args.clients,
        args.max_seconds,
    )
    clients.start()
    try:
        # Planner statistics for the warmed-up tables, as autovacuum keeps them on a live
        # system: planned on the TRUNCATEd tables, a copy's lookup stays a sequential scan of
        # the growing inbox in the server's prepared statement (bench/backing.py's analyze).
        clients.wait_started(before=lambda: asyncio.run(analyze(args.database_url, INBOX_TABLES)))
        metrics_before = scrape(base_url)
        cpu_before = cpu_ticks(server_pid, clients.pids, database, args.servers)
        machine_before, wall_before = busy_idle(), time.monotonic()
        tallies = clients.join()
        machine_after, wall = busy_idle(), time.monotonic() - wall_before
        cpu_after = cpu_ticks(server_pid, clients.pids, database, args.servers)
        metrics_after = scrape(base_url)
    finally:
        clients.stop()
    summary = summarize(tallies)
    used = cpu_used(cpu_before, cpu_after)
    cpu_pct = {
        group: 100 * used[group] / CLK_TCK / wall
        for group in ("ingest", "postgres", "rabbitmq", "other")
    }
    cpu_pct["clients"] = 100 * summary.client_cpu_s / summary.elapsed_s
    busy = machine_after[0] - machine_before[0]
    cpu_pct["all"] = 100 * busy / CLK_TCK / wall

    # Rows a failed batch may have committed are published by the sweeper once they are
    # older than services/ingest/sweeper.py's SWEEP_AFTER_S: give it that long to settle.
    deadline = time.monotonic() + args.settle_seconds
    while True:
        check = asyncio.run(_check(args.database_url, args.amqp_url, queue, run_id, summary.ok_ids))
        check = replace(check, queued=check.queued - queued_before)
        if check.ok(len(summary.ok_ids)) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if check.queued > check.rows and args.url is None:
        repeated = asyncio.run(_repeated_messages(args.amqp_url, queue, check.queued))
        print(f"  [{name}] events published more than once: {len(repeated)},", end=" ")
        print(f"e.g. {repeated.most_common(5)}", flush=True)
    confirm_s = mean_delta(
        metrics_before, metrics_after, "payhooks_publish_confirm_duration_seconds"
    )
    return Result(
        name=name,
        summary=summary,
        peak_rss_mb=peak_rss_per_process_mb(server_pid) if server_pid else None,
        cpu_pct=cpu_pct,
        avg_batch=mean_delta(metrics_before, metrics_after, "payhooks_ingest_batch_size"),
        avg_confirm_ms=None if confirm_s is None else confirm_s * 1000,
        distinct_ids=warmup.distinct_ids + plan.distinct_ids,
        check=check,
    )


def run_owned(name: str, args: argparse.Namespace) -> Result:
    secret = secrets.token_hex(16)
    env = service_env(
        ("INGEST_TLS_", "XHUB_", "AMQP_"),
        database_url=args.database_url,
        amqp_url=args.amqp_url,
        prefix=args.prefix,
        secret=secret,
        log_level=args.server_log_level,
    )
    topology = topology_of(env)
    # A clean start, and a clean end below: the inbox emptied, the server's topology removed.
    asyncio.run(reset(args.database_url, args.amqp_url, topology, INBOX_TABLES))
    with open(args.server_log, "ab") as log, tempfile.TemporaryFile() as errors:
        server = Server(name, env, log, errors)
        try:
            server.start()
            assert server.process is not None
            print(f"[{name}] pid {server.process.pid} on {server.base_url}", flush=True)
            return run_one(name, args, server.base_url, server.process.pid, secret.encode())
        finally:
            server.stop()
            asyncio.run(reset(args.database_url, args.amqp_url, topology, INBOX_TABLES))


# --- output -----------------------------------------------------------------------------------


def _row(label: str, *cells: str) -> str:
    return f"{label:<24}" + "".join(f"{c:>14}" for c in cells)


def print_table(results: list[Result]) -> None:
    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [_row("", *(r.name for r in results))]
    rows: list[tuple[str, list[str]]] = [
        ("requests", [f"{r.summary.requests:,}" for r in results]),
        ("accepted", [f"{r.summary.accepted:,}" for r in results]),
        ("duplicate", [f"{r.summary.duplicate:,}" for r in results]),
        ("errors (non-200)", [f"{r.summary.errors:,}" for r in results]),
        ("elapsed s", [f"{r.summary.elapsed_s:.2f}" for r in results]),
        ("accepted/s", [f"{r.summary.accepted_per_s:,.0f}" for r in results]),
        ("duplicate/s", [f"{r.summary.duplicate_per_s:,.0f}" for r in results]),
        ("total requests/s", [f"{r.summary.requests_per_s:,.0f}" for r in results]),
        ("latency p50 ms", [f"{r.summary.p50_ms:.1f}" for r in results]),
        ("latency p99 ms", [f"{r.summary.p99_ms:.1f}" for r in results]),
        ("latency max ms", [f"{r.summary.max_ms:.1f}" for r in results]),
        ("ingest peak RSS MB per process", [fmt(r.peak_rss_mb, ".1f") for r in results]),
        ("avg accept batch", [fmt(r.avg_batch, ".1f") for r in results]),
        ("avg confirm ms/batch", [fmt(r.avg_confirm_ms, ".1f") for r in results]),
    ]
    for group in ("ingest", "clients", "postgres", "rabbitmq", "other"):
        rows.append((f"CPU % {group}", [f"{r.cpu_pct[group]:.0f}" for r in results]))
    cores = os.cpu_count() or 1
    rows += [
        (f"CPU % all (max {100 * cores})", [f"{r.cpu_pct['all']:.0f}" for r in results]),
        ("CPU % unattributed", [f"{r.unattributed_pct:.0f}" for r in results]),
        ("ingest CPU us/request", [fmt(r.ingest_us_per_request, ".0f") for r in results]),
    ]
    rows += [
        ("distinct event ids", [f"{r.distinct_ids:,}" for r in results]),
        ("ids answered 200", [f"{len(r.summary.ok_ids):,}" for r in results]),
        ("  of them stored", [f"{r.check.rows_answered_200:,}" for r in results]),
        ("inbox rows", [f"{r.check.rows:,}" for r in results]),
        ("  unpublished", [f"{r.check.unpublished:,}" for r in results]),
        ("messages queued", [f"{r.check.queued:,}" for r in results]),
        ("correct", ["yes" if r.correct else "NO" for r in results]),
    ]
    lines += [_row(label, *cells) for label, cells in rows]
    print("\n".join(lines))
    for r in results:
        if r.summary.errors:
            print(f"[{r.name}] non-200 answers: {r.summary.statuses}")
        if (foreign := r.cpu_pct["other"] + r.unattributed_pct) > DISTURBED_PCT:
            print(
                f"[{r.name}] WARNING: other work took {foreign:.0f}% of a core during the run:"
                " its figures are low, run again"
            )


def print_verdict(batched: Result, naive: Result) -> None:
    b, n = batched.summary, naive.summary
    ratio = b.accepted_per_s / n.accepted_per_s
    print(_row("batched/naive accepted/s", f"{ratio:.2f}x"))
    print(_row("batched/naive p99", f"{b.p99_ms / n.p99_ms:.2f}x"))
    ok = (
        b.accepted_per_s >= TARGET_ACCEPTED_PER_S
        and b.p99_ms <= TARGET_P99_MS
        and ratio >= TARGET_RATIO
        and batched.correct
    )
    print(
        f"target (>= {TARGET_ACCEPTED_PER_S:,.0f} accepted/s, p99 <= {TARGET_P99_MS:.0f} ms,"
        f" >= {TARGET_RATIO:.0f}x naive, correct): {'MET' if ok else 'NOT MET'}"
    )


# --- command line -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=50_000, help="measured requests (default 50000)")
    p.add_argument("--concurrency", "-c", type=int, default=64, help="open connections")
    p.add_argument("--duplicates", type=float, default=0.1, help="share of resends (0-1)")
    p.add_argument("--warmup", type=int, default=1000, help="unmeasured requests first")
    p.add_argument("--body-size", type=int, default=1024, help="bytes per webhook body")
    p.add_argument("--clients", type=int, default=CLIENT_PROCESSES, help="client processes")
    p.add_argument("--max-seconds", type=float, default=300.0, help="time cap per run")
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=20.0,
        help="how long the checks wait for stragglers (sweeper) before calling a run wrong",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        help="wait up to this long for the (shared) machine to be idle before each run",
    )
    p.add_argument("--only", choices=("batched", "naive"), help="run one of the two servers")
    p.add_argument(
        "--url",
        help="bench this running ingest instead (base URL); owns nothing, and its queue check"
        " assumes nothing consumes the orders queue meanwhile",
    )
    p.add_argument("--pid", type=int, help="with --url: its pid, for RSS and CPU")
    p.add_argument("--secret", help="with --url: a secret it accepts (XHUB_WEBHOOK_SECRETS)")
    p.add_argument("--database-url", help="inbox database (default: a bench database)")
    p.add_argument("--amqp-url", default=os.environ.get("AMQP_URL", DEFAULT_AMQP_URL))
    p.add_argument("--prefix", help="AMQP prefix (default: bench. or, with --url, AMQP_PREFIX)")
    p.add_argument("--server-log", default=os.devnull, help="where owned servers log")
    p.add_argument("--server-log-level", default="INFO", help="LOG_LEVEL of owned servers")
    p.set_defaults(servers=None)  # bench.copies: the broker and database processes to count
    args = p.parse_args(argv)
    if not 0 <= args.duplicates < 1 or args.n < 1 or args.concurrency < args.clients:
        p.error("need 0 <= --duplicates < 1, --n >= 1 and --concurrency >= --clients")
    if args.url:
        args.database_url = args.database_url or os.environ.get(
            "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/payhooks"
        )
        args.prefix = os.environ.get("AMQP_PREFIX", "") if args.prefix is None else args.prefix
        args.secret = args.secret or os.environ.get("XHUB_WEBHOOK_SECRETS", "").split(",")[0]
        if not args.secret:
            p.error("--url needs --secret (or XHUB_WEBHOOK_SECRETS)")
        if not urlsplit(args.url).hostname:
            p.error("--url must be like http://127.0.0.1:8080")
    else:
        args.database_url = args.database_url or BENCH_DATABASE_URL
        args.prefix = "bench." if args.prefix is None else args.prefix
        if not args.prefix:
            p.error("owned servers need a non-empty --prefix (their queues are deleted)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"n={args.n:,} concurrency={args.concurrency} duplicates={args.duplicates:.0%}"
        f" body={args.body_size} B warmup={args.warmup} client processes={args.clients}",
        flush=True,
    )
    if args.url:
        base_url = args.url.rstrip("/").removesuffix("/webhooks/xhub")
        result = run_one("ingest", args, base_url, args.pid, args.secret.encode())
        print_table([result])
        return 0 if result.correct else 1
    migrate(args.database_url)
    with own_vhost(args.amqp_url) as amqp_url:
        args.amqp_url = amqp_url
        names = [name for name in ("batched", "naive") if args.only in (None, name)]
        results = [run_owned(name, args) for name in names]
    print()
    print_table(results)
    if len(results) == 2:
        print()
        print_verdict(*results)
    # The exit status says whether the ingest was correct; the target verdict is for reading.
    return 0 if all(r.correct for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
