"""Breaker-release burst bench: X-Hub's held-back backlog delivered at once to a real ingest.

    python -m bench.burst [--events 10000] [--runs 3] [--processes 1]

It starts its own `payhooks run ingest` (free port, database `payhooks_burst`, created by
`payhooks migrate` and dropped at the end, a RabbitMQ vhost of its own, deleted at the end;
no workers), and for each run, against 127.0.0.1 only: the simulator's deliverer
(services/sim, as tests/integration/test_ingest_burst.py) holds --events + 1 deliveries behind
the merchant's open breaker; the probe passes after the 5-minute pause (3 s at time scale 100)
and the other --events go at once, each on its own connection, each timed from the release.
The deliverer runs in this process, on the same cores as what it measures, sending with
bench/raw_http.py's OneShotSender (--aiohttp: the simulator's own aiohttp client, which
costs more CPU than ingest spends on the burst and so measures mostly itself).

Per run: the first answers after the release, the time from the release to the last answer,
the slowest answer, CPU seconds during the run (ingest, this process = the simulator,
PostgreSQL, RabbitMQ, anything else), ingest's peak RSS, the accept rate ingest measured, and
whether every event is stored once and queued once. Exit status 1 if an answer was not a 200
within 10 s, a delivery ended FAILED, or an event is missing or doubled.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import asyncpg
import uvloop

from bench.backing import own_vhost, topology_of
from bench.ingest import DEFAULT_AMQP_URL, Server
from bench.observe import CLK_TCK, cpu_ticks, cpu_used, peak_rss_per_process_mb, scrape, wait_quiet
from bench.processes import migrate, service_env
from bench.raw_http import OneShotSender
from services.sim.burst import BUDGET_S, LARGEST_BACKLOG, BurstFigures, figures
from services.sim.deliverer import TIMEOUT_S, Deliverer, DeliveryRecord, SimWebhook
from shared.amqp.topology import Topology, delete
from shared.process.file_limit import raise_to_hard_limit
from shared.providers.xhub.events import status_changed

DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/payhooks_burst"
TIME_SCALE = 100.0  # the breaker's 5-minute pause takes 3 s


@dataclass(frozen=True, slots=True)
class Run:
    burst: BurstFigures
    last_answer_s: float  # release to the last answer
    cpu_s: dict[str, float]
    stored: int
    queued: int
    releases: int  # times the breaker closed and let what it held go (1: it never reopened)
    attempts: Counter[str]  # every attempt's answer ("None": no answer), the probe's included
    listen_overflows: int  # the machine's, during the run: handshakes the backlog dropped

    def ok(self, events: int) -> bool:
        return (
            self.burst.all_answered_200_in_budget
            and self.burst.released == events
            and self.burst.failed == 0
            and self.releases == 1
            and self.stored == self.queued == events + 1
        )


def listen_overflows() -> int:
    """TcpExt ListenOverflows of this network namespace so far (every listener's)."""
    names, values = [
        line.split()
        for line in Path("/proc/net/netstat").read_text().splitlines()
        if line.startswith("TcpExt:")
    ][:2]
    return int(dict(zip(names, values, strict=True))["ListenOverflows"])


def _backlog(run_id: str, n: int) -> list[SimWebhook]:
    return [
        SimWebhook(
            event_id=f"evt_{run_id}{i:06d}",
            merchant_id="merchant_burst",
            payload=status_changed(
                f"pay_{run_id}{i:06d}",
                "paid",
                "100.00",
                "USD",
                "2026-12-05T10:00:00+00:00",
                external_id=f"ord_{run_id}{i:06d}",
            ),
        )
        for i in range(n)
    ]


async def _deliver(
    url: str, secret: bytes, backlog: list[SimWebhook], lean: bool
) -> tuple[list[DeliveryRecord], int]:
    async with Deliverer(
        url,
        secret,
        time_scale=TIME_SCALE,
        breakers_open=True,
        sender=OneShotSender(TIMEOUT_S) if lean else None,
    ) as deliverer:
        records = list(await asyncio.gather(*(deliverer.deliver(w) for w in backlog)))
        return records, len(deliverer.releases)


async def _stored_and_queued(amqp_url: str, queue: str, run_id: str) -> tuple[int, int]:
    """Events of this run in the inbox (each row once: event_id is unique per provider) once
    every publish is marked, and messages in the orders queue."""
    conn = await asyncpg.connect(DATABASE_URL, timeout=5)
    try:
        deadline = time.monotonic() + 30
        while await conn.fetchval("SELECT count(*) FROM inbox_unpublished"):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        stored = await conn.fetchval(
            "SELECT count(*) FROM inbox WHERE event_id LIKE $1", f"evt_{run_id}%"
        )
    finally:
        await conn.close()
    connection = await aio_pika.connect(amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        queued = declared.declaration_result.message_count or 0
        await declared.purge()  # the next run counts its own
    return int(stored), queued


def one_run(
    events: int, server: Server, secret: bytes, amqp_url: str, queue: str, lean: bool
) -> Run:
    run_id = uuid.uuid4().hex[:8]
    backlog = _backlog(run_id, events + 1)  # the probe, then `events` at once
    before = cpu_ticks(server.pid, [os.getpid()], "payhooks_burst")
    own_before, overflows = time.process_time(), listen_overflows()
    records, releases = uvloop.run(_deliver(server.base_url, secret, backlog, lean))
    own_s, overflows = time.process_time() - own_before, listen_overflows() - overflows
    used = cpu_used(before, cpu_ticks(server.pid, [os.getpid()], "payhooks_burst"))
    burst = figures(records)
    released_at = min((r.released_at for r in records if r.released_at is not None), default=0.0)
    last = max((at for r in records for at in r.answered_at), default=released_at)
    cpu_s = {group: used[group] / CLK_TCK for group in ("ingest", "postgres", "rabbitmq", "other")}
    cpu_s["simulator"] = own_s
    stored, queued = asyncio.run(_stored_and_queued(amqp_url, queue, run_id))
    attempts = Counter(str(code) for r in records for code in r.http_statuses)
    return Run(burst, last - released_at, cpu_s, stored, queued, releases, attempts, overflows)


def report(run: Run, events: int, server: Server) -> None:
    print(f"  {run.burst.render()}")
    print(
        f"  release to last answer {run.last_answer_s:.2f} s; breaker closings {run.releases};"
        f" stored {run.stored:,}, queued {run.queued:,} (of {events + 1:,} with the probe)"
    )
    print(
        f"  every attempt's answer: {dict(run.attempts)}; listen queue overflows"
        f" {run.listen_overflows} (the machine's)"
    )
    cpu = ", ".join(f"{group} {seconds:.1f}" for group, seconds in run.cpu_s.items())
    print(f"  CPU seconds during the run (the 3 s pause included): {cpu}")
    rate = scrape(server.base_url).get("payhooks_ingest_accept_rate")
    peak = peak_rss_per_process_mb(server.pid)
    print(
        f"  ingest peak RSS {peak or 0:.0f} MB; accept rate it measured"
        f" {rate or 0:,.0f}/s; verdict {'ok' if run.ok(events) else 'FAILED'}",
        flush=True,
    )


async def _drop_database() -> None:
    conn = await asyncpg.connect(DATABASE_URL.rsplit("/", 1)[0] + "/postgres", timeout=5)
    try:
        await conn.execute("DROP DATABASE IF EXISTS payhooks_burst WITH (FORCE)")
    finally:
        await conn.close()


async def _delete_topology(amqp_url: str, topology: Topology) -> None:
    connection = await aio_pika.connect(amqp_url, timeout=5)
    async with connection:
        await delete(await connection.channel(), topology)


def run(args: argparse.Namespace, amqp_url: str) -> bool:
    secret = secrets.token_hex(16)
    env = service_env(
        ("INGEST_TLS_", "XHUB_", "AMQP_"),
        database_url=DATABASE_URL,
        amqp_url=amqp_url,
        prefix="bench-burst.",
        secret=secret,
        log_level="WARNING",
        INGEST_PROCESSES=str(args.processes),
    )
    topology = topology_of(env)
    migrate(DATABASE_URL)
    ok = True
    with open(args.server_log, "ab") as log, tempfile.TemporaryFile() as errors:
        server = Server("ingest", env, log, errors)
        try:
            server.start()
            print(f"ingest pid {server.pid} on {server.base_url}, no workers", flush=True)
            for n in range(args.runs):
                wait_quiet(args.quiet_wait)
                print(f"run {n + 1}: {args.events:,} released at once", flush=True)
                queue = topology.work["orders"].name
                result = one_run(
                    args.events, server, secret.encode(), amqp_url, queue, not args.aiohttp
                )
                report(result, args.events, server)
                ok &= result.ok(args.events)
        finally:
            server.stop()
            asyncio.run(_delete_topology(amqp_url, topology))
            asyncio.run(_drop_database())
    print("verdict:", "ok" if ok else "FAILED")
    return ok


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=LARGEST_BACKLOG, help="released at once")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--processes", type=int, default=1, help="INGEST_PROCESSES")
    p.add_argument("--aiohttp", action="store_true", help="send with aiohttp's client")
    p.add_argument("--quiet-wait", type=float, default=60.0)
    p.add_argument("--amqp-url", default=os.environ.get("AMQP_URL", DEFAULT_AMQP_URL))
    p.add_argument("--server-log", default=os.devnull, help="where the ingest logs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = raise_to_hard_limit()
    if files < args.events + 1_000:
        print(f"open-file limit {files}: {args.events} connections need more (ulimit -n)")
        return 2
    print(f"budget {BUDGET_S:g} s per answer; this process may open {files:,} files")
    with own_vhost(args.amqp_url) as amqp_url:
        return 0 if run(args, amqp_url) else 1


if __name__ == "__main__":
    sys.exit(main())
