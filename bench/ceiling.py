"""The ceiling under bench.workers: the same three hops with empty handlers, batched.

    python -m bench.ceiling [--n 10000] [--batch 128] [--prefetch 256]

What the machine allows for one payment's messages at this moment: N `payment.status_changed`
messages published to payhooks' own topology (quorum work queues, a vhost of this run's own),
and three hop processes standing in for the workers. Each takes up to --batch delivered
messages (or what arrived within 2 ms), writes them to PostgreSQL in one statement (its
processed mark), the orders hop publishes one `order.paid` per message (routed to the bonuses
and emails queues) with the confirms awaited together, and then acks the batch once. Nothing
else: no state machine, no ledger, no email. Payments/s = N / (last message marked by both the
bonuses and the emails hop - first publish); CPU per payment per process group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aio_pika
import aiormq
import asyncpg
import uvloop
from aiormq import spec

from bench.backing import own_vhost
from bench.observe import CpuGroups
from bench.processes import spawn, terminate
from shared.publish_together import publish_together
from shared.topology import build_topology, declare, delete

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432"
DATABASE = "payhooks_bench_ceiling"
PREFIX = "ceil."
HOPS = ("orders", "bonuses", "emails")
_TABLE = (
    "CREATE TABLE seen (hop text NOT NULL, message_id text NOT NULL, PRIMARY KEY (hop, message_id))"
)
_MARK = "INSERT INTO seen (hop, message_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING"
_COLLECT_S = 0.002


def _topology() -> Any:
    return build_topology(PREFIX, (1.0,))


def _properties(message_id: str) -> spec.Basic.Properties:
    return spec.Basic.Properties(
        content_type="application/json", delivery_mode=2, message_id=message_id
    )


async def _hop(name: str, amqp_url: str, database_url: str, batch: int, prefetch: int) -> None:
    """One stand-in worker: batches in, one statement, (orders: publishes), one ack."""
    topology = _topology()
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await declare(channel, topology)
    await channel.set_qos(prefetch_count=prefetch)
    underlay = cast(aiormq.Channel, await channel.get_underlay_channel())
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    incoming: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
    queue = await channel.get_queue(topology.work[name].name, ensure=False)
    await queue.consume(incoming.put)
    while True:
        messages = [await incoming.get()]
        for wait in (False, True):
            while len(messages) < batch and not incoming.empty():
                messages.append(incoming.get_nowait())
            if wait and len(messages) < batch:
                await asyncio.sleep(_COLLECT_S)
        await pool.execute(_MARK, name, [m.message_id or "" for m in messages])
        if name == "orders":
            out = [
                ("order.paid", m.body, _properties(f"{m.message_id}:order.paid")) for m in messages
            ]
            await asyncio.gather(*await publish_together(underlay, exchange.name, out))
        await messages[-1].ack(multiple=True)


async def _drive(amqp_url: str, database_url: str, n: int) -> tuple[float, float]:
    """Publish N payments; (first publish, last payment through) as time.time()."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await declare(channel, _topology())
        underlay = cast(aiormq.Channel, await channel.get_underlay_channel())
        body = b'{"event":"payment.status_changed","status":"paid","amount":"100.00"}'
        started = time.time()
        for first in range(0, n, 500):
            out = [
                ("payment.status_changed", body, _properties(f"evt_{i}"))
                for i in range(first, min(n, first + 500))
            ]
            await asyncio.gather(*await publish_together(underlay, exchange.name, out))
        conn = await asyncpg.connect(database_url)
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                marked = await conn.fetchval(
                    "SELECT count(*) FROM seen WHERE hop IN ('bonuses', 'emails')"
                )
                if marked >= 2 * n:
                    break
                await asyncio.sleep(0.05)
            else:
                raise TimeoutError("the hops did not get every payment through in 10 minutes")
        finally:
            await conn.close()
        return started, time.time()


async def _cleanup(amqp_url: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await delete(await connection.channel(), _topology())


def _psql(sql: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(f"{DEFAULT_PG}/postgres")
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


@dataclass(frozen=True, slots=True)
class Ceiling:
    per_s: float  # payments through all three hops per second
    cpu_us: dict[str, float]  # CPU per payment by process group


def measure(n: int, amqp_url: str, *, batch: int = 128, prefetch: int = 256) -> Ceiling:
    """Run the hops on a vhost and a database of their own, both gone afterwards."""
    database_url = f"{DEFAULT_PG}/{DATABASE}"
    _psql(f"DROP DATABASE IF EXISTS {DATABASE}")
    _psql(f"CREATE DATABASE {DATABASE}")
    hops: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with own_vhost(amqp_url) as url, tempfile.TemporaryDirectory() as logs:
            asyncio.run(_psql_on(database_url, _TABLE))
            for name in HOPS:
                command = [sys.executable, "-m", "bench.ceiling", "--hop", name]
                command += ["--amqp-url", url, "--database-url", database_url]
                command += ["--batch", str(batch), "--prefetch", str(prefetch)]
                hops[name] = spawn(command, dict(os.environ), Path(logs) / f"{name}.log")
            time.sleep(3.0)  # connected and consuming
            cpu = CpuGroups({p.pid: name for name, p in hops.items()}, [os.getpid()], DATABASE)
            before = cpu.snapshot()
            started, done = uvloop.run(_drive(url, database_url, n))
            pct = CpuGroups.pct(before, cpu.snapshot())
            for process in hops.values():
                terminate(process, timeout_s=5)
            with contextlib.suppress(Exception):
                asyncio.run(_cleanup(url))
    finally:
        for process in hops.values():
            terminate(process, timeout_s=5)
        _psql(f"DROP DATABASE IF EXISTS {DATABASE}")
    wall = done - started
    groups = (*HOPS, "postgres", "rabbitmq")
    return Ceiling(n / wall, {g: pct.get(g, 0.0) * wall / n * 10_000 for g in groups})


def report(ceiling: Ceiling) -> None:
    total = sum(ceiling.cpu_us.values())
    print(f"ceiling (bench.ceiling)                 {ceiling.per_s:,.0f} payments/s")
    print(
        "  CPU us per payment                    "
        + "  ".join(f"{g} {v:,.0f}" for g, v in ceiling.cpu_us.items())
        + f"  total {total:,.0f}",
        flush=True,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--prefetch", type=int, default=256)
    p.add_argument("--amqp-url", default=os.environ.get("AMQP_URL", DEFAULT_AMQP_URL))
    p.add_argument("--hop", choices=HOPS, help=argparse.SUPPRESS)  # a hop process
    p.add_argument("--database-url", help=argparse.SUPPRESS)  # a hop process's
    args = p.parse_args()
    if args.hop:
        uvloop.run(_hop(args.hop, args.amqp_url, args.database_url, args.batch, args.prefetch))
        return 0
    report(measure(args.n, args.amqp_url, batch=args.batch, prefetch=args.prefetch))
    return 0


async def _psql_on(database_url: str, sql: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


if __name__ == "__main__":
    sys.exit(main())
