"""Parked-event release latency: from an order's registration to its parked event's effect.

    python -m bench.parked_release [--n 200] [--rate 20] [--orders 1]

It owns what it runs and removes it at the end: a database of its own
(`payhooks_bench_parked`, dropped), a RabbitMQ vhost of its own (deleted), and `payhooks run
orders` as --orders subprocesses (the production process: its worker, outbox relay and parked
relay with its NOTIFY listener; LOG_LEVEL=WARNING, logs in --log-dir). It publishes N `paid`
events to the orders queue for payments with no order, as ingest would, and waits until all N
are parked. Then it registers their orders one at a time at --rate per second through
shared/queries/orders.py `register_order` (what the API, console and CLI call), and polls
order_transitions every --poll-ms for the transitions of the payments registered and not yet
seen.

Figure: per payment, the time from the call to register_order to the first poll that sees
its PENDING -> PAID transition committed (an upper bound: a poll's interval at most above the
commit), p50 / p90 / p99 / max; also from register_order's commit. Exit status 1 if a check
fails (N transitions, one processed mark per event, every parked row released and published,
nothing in orders.dlq) or the p99 is above --target-ms (1000).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import tempfile
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import orjson

from bench.backing import delete_topology, own_vhost, topology_of
from bench.processes import migrate, ports_for, service_env
from bench.services import Service, stop_all, wait_ready
from services.ingest.accept import outgoing
from shared.amqp.outgoing import to_message
from shared.db import create_pool
from shared.queries import orders as orders_sql

DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/payhooks_bench_parked"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PREFIX = "benchp."
TARGET_MS = 1000.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.parked_release", description=__doc__)
    p.add_argument("--n", type=int, default=200, help="parked events (one payment each)")
    p.add_argument("--rate", type=float, default=20.0, help="registrations per second")
    p.add_argument("--orders", type=int, default=1, help="orders processes")
    p.add_argument("--poll-ms", type=float, default=2.0, help="effect poll interval")
    p.add_argument("--target-ms", type=float, default=TARGET_MS, help="p99 target")
    p.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--log-dir", type=Path, default=None)
    p.add_argument("--log-level", default="WARNING", help="the orders processes' LOG_LEVEL")
    return p.parse_args(argv)


def event_body(payment_id: str) -> bytes:
    return orjson.dumps(
        {
            "event": "payment.status_changed",
            "payment_id": payment_id,
            "external_id": f"ord_{payment_id}",
            "status": "paid",
            "amount": "100.00",
            "currency": "USD",
            "created_at": dt.datetime.now(dt.UTC).isoformat(),
        }
    )


def order_of(payment_id: str) -> orders_sql.NewOrder:
    return orders_sql.NewOrder(
        f"ord_{payment_id}",
        payment_id,
        f"user_{payment_id}",
        f"{payment_id}@bench.localhost",
        Decimal("100.00"),
        "USD",
    )


async def park_all(amqp_url: str, queue: str, payments: list[str], pool: Any) -> None:
    """Publish one paid event per payment straight to the orders queue; wait until parked."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        for payment_id in payments:
            message = outgoing("xhub", f"evt_{payment_id}", "payment.status_changed",
                               event_body(payment_id))  # fmt: skip
            await channel.default_exchange.publish(to_message(message), routing_key=queue)
    finally:
        await connection.close()
    deadline = time.monotonic() + 60
    while (n := await pool.fetchval("SELECT count(*) FROM parked_events")) < len(payments):
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {n} of {len(payments)} events parked in 60 s")
        await asyncio.sleep(0.05)


async def measure(
    pool: Any, payments: list[str], rate: float, poll_s: float
) -> tuple[list[float], list[float]]:
    """Register each payment's order at `rate`; the latencies (ms) from the call and from
    its commit to the transition seen committed."""
    called: dict[str, float] = {}
    committed: dict[str, float] = {}
    seen: dict[str, float] = {}
    done = asyncio.Event()

    async def poll() -> None:
        async with pool.acquire() as conn:
            while len(seen) < len(payments):
                waiting = [p for p in called if p not in seen]
                if waiting:
                    rows = await conn.fetch(
                        "SELECT DISTINCT payment_id FROM order_transitions"
                        " WHERE payment_id = ANY($1::text[])",
                        waiting,
                    )
                    now = time.perf_counter()
                    for row in rows:
                        seen[row["payment_id"]] = now
                await asyncio.sleep(poll_s)
        done.set()

    poller = asyncio.create_task(poll())
    start = time.perf_counter()
    for i, payment_id in enumerate(payments):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        called[payment_id] = time.perf_counter()
        await orders_sql.register_order(pool, order_of(payment_id))
        committed[payment_id] = time.perf_counter()
    try:
        async with asyncio.timeout(30):
            await done.wait()
    finally:
        poller.cancel()
    from_call = [(seen[p] - called[p]) * 1000 for p in payments]
    from_commit = [(seen[p] - committed[p]) * 1000 for p in payments]
    return from_call, from_commit


async def checks(pool: Any, amqp_url: str, dlq: str, n: int) -> list[str]:
    failed = []
    transitions = await pool.fetchval("SELECT count(*) FROM order_transitions")
    if transitions != n:
        failed.append(f"{transitions} transitions, not {n}")
    marks = await pool.fetchval("SELECT count(*) FROM processed_events WHERE worker = 'orders'")
    if marks != n:
        failed.append(f"{marks} processed marks, not {n}")
    unfinished = await pool.fetchval(
        "SELECT count(*) FROM parked_events WHERE published_at IS NULL"
    )
    if unfinished:
        failed.append(f"{unfinished} parked events not released and published")
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(dlq, passive=True)
        if dead := declared.declaration_result.message_count:
            failed.append(f"{dead} messages in {dlq}")
    finally:
        await connection.close()
    return failed


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def line(label: str, values: list[float]) -> str:
    return (
        f"{label:<34} p50 {quantile(values, 0.5):7.1f} ms   p90 {quantile(values, 0.9):7.1f} ms"
        f"   p99 {quantile(values, 0.99):7.1f} ms   max {max(values):7.1f} ms"
    )


async def run(args: argparse.Namespace, amqp_url: str, log_dir: Path) -> int:
    env = service_env(
        ("UNKNOWN_PAYMENT_PARK_SECONDS", "RETRY_DELAYS"),
        database_url=DATABASE_URL,
        amqp_url=amqp_url,
        prefix=PREFIX,
        secret="bench-secret",
        log_level=args.log_level,
    )
    topology = topology_of(env)
    ports = ports_for(f"orders{i}" for i in range(args.orders))
    services = {
        name: Service("orders", port, {**env, "ORDERS_PORT": str(port)}, log_dir)
        for name, port in ports.items()
    }
    for name, service in services.items():
        service.log_path = log_dir / f"{name}.log"
    pool = await create_pool(DATABASE_URL, max_size=4)
    try:
        await pool.execute(
            "TRUNCATE orders, order_transitions, processed_events, outbox, parked_events"
            " RESTART IDENTITY CASCADE"
        )
        for service in services.values():
            service.start()
        await asyncio.to_thread(wait_ready, services, time.monotonic() + 60)
        run_id = uuid.uuid4().hex[:8]
        payments = [f"pay_{run_id}_{i:05d}" for i in range(args.n)]
        await park_all(amqp_url, topology.work["orders"].name, payments, pool)
        print(f"{args.n} events parked; registering their orders at {args.rate:g}/s", flush=True)
        from_call, from_commit = await measure(pool, payments, args.rate, args.poll_ms / 1000)
        failed = await checks(pool, amqp_url, topology.work["orders"].dlq, args.n)
    finally:
        stop_all(services)
        await pool.close()
        await delete_topology(amqp_url, topology)
    print(line("registration call -> effect seen", from_call))
    print(line("registration commit -> effect seen", from_commit))
    p99 = quantile(from_call, 0.99)
    met = p99 <= args.target_ms and not failed
    for failure in failed:
        print(f"CHECK FAILED: {failure}")
    print(
        f"n={args.n} rate={args.rate:g}/s orders processes={args.orders}"
        f" poll={args.poll_ms:g} ms: p99 {p99:.1f} ms (target <= {args.target_ms:g} ms):"
        f" {'MET' if met else 'NOT MET'}"
    )
    return 0 if met else 1


async def drop_database() -> None:
    admin = await asyncpg.connect(ADMIN_URL)
    try:
        await admin.execute("DROP DATABASE IF EXISTS payhooks_bench_parked WITH (FORCE)")
    finally:
        await admin.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-parked-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    migrate(DATABASE_URL)
    try:
        with own_vhost(args.amqp_url) as amqp_url:
            return asyncio.run(run(args, amqp_url, log_dir))
    finally:
        asyncio.run(drop_database())


if __name__ == "__main__":
    sys.exit(main())
