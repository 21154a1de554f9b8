"""The ceiling under bench.workers: the same hops with empty handlers, batched.

    python -m bench.ceiling [--n 10000] [--batch 128] [--prefetch 256] [--accept]

What the machine allows for one payment's messages at this moment: N `payment.status_changed`
messages published to payhooks' own topology (quorum work queues, a vhost of this run's own),
and three hop processes standing in for the workers. Each takes up to --batch delivered
messages (or what arrived within 2 ms), writes them to PostgreSQL in one statement (its
processed mark), the orders hop publishes one `order.paid` per message (routed to the bonuses
and emails queues) with the confirms awaited together, and then acks the batch once. Nothing
else: no state machine, no ledger, no email. Payments/s = N / (last message marked by both the
bonuses and the emails hop - first publish); CPU per payment per process group.

With --accept (bench.workers measures both), the payments come in the way the real pipeline's
do: N signed webhooks over HTTP from the same load clients (C connections), to a stand-in for
ingest that checks the signature, parses the JSON, and stores a batch (payhooks ingest's rule:
16 waiting or the oldest 10 ms old, 4 batches in flight) in one statement, publishes it with
the confirms awaited together and answers 200. Payments/s is then N / (last message marked by
both the bonuses and the emails hop - first 200), as bench.workers counts the real pipeline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
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
import orjson
import uvloop
from aiohttp import web
from aiormq import spec

from bench.backing import own_vhost
from bench.observe import CpuGroups
from bench.payments import make_deliveries, make_payments
from bench.processes import free_port, spawn, terminate
from bench.stamped_load import Clients, warm_up
from services.ingest.accept import AcceptorConfig
from shared.amqp.publish_together import publish_together
from shared.amqp.topology import build_topology, declare, delete
from shared.providers.xhub import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from shared.providers.xhub.signatures import sign

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
_ACCEPTED = "CREATE TABLE accepted (event_id text PRIMARY KEY, body bytea NOT NULL)"
_STORE = (
    "INSERT INTO accepted (event_id, body) SELECT * FROM unnest($1::text[], $2::bytea[])"
    " ON CONFLICT DO NOTHING"
)
_SECRET = b"ceiling-secret"


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


async def _accept(amqp_url: str, database_url: str, port: int) -> None:
    """The stand-in for ingest: signature, JSON, a batch stored in one statement and published
    with its confirms awaited together, then 200 to every request of the batch."""
    rule = AcceptorConfig()
    loop = asyncio.get_running_loop()
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await declare(channel, _topology())
    underlay = cast(aiormq.Channel, await channel.get_underlay_channel())
    pool = await asyncpg.create_pool(
        database_url, min_size=rule.max_in_flight, max_size=rule.max_in_flight
    )
    in_flight = asyncio.Semaphore(rule.max_in_flight)
    waiting: list[tuple[str, bytes, asyncio.Future[None]]] = []
    timer: asyncio.TimerHandle | None = None
    batches: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak ones)

    async def store_and_publish(batch: list[tuple[str, bytes, asyncio.Future[None]]]) -> None:
        async with in_flight:
            try:
                await pool.execute(_STORE, [e for e, _, _ in batch], [b for _, b, _ in batch])
                out = [("payment.status_changed", b, _properties(e)) for e, b, _ in batch]
                await asyncio.gather(*await publish_together(underlay, exchange.name, out))
            except Exception as e:  # a 500 each: the clients count it as an error
                for _, _, answer in batch:
                    answer.set_exception(e)
                return
        for _, _, answer in batch:
            answer.set_result(None)

    def send() -> None:
        nonlocal timer, waiting
        if timer is not None:
            timer.cancel()
            timer = None
        batch, waiting = waiting, []
        task = loop.create_task(store_and_publish(batch))
        batches.add(task)
        task.add_done_callback(batches.discard)

    async def webhook(request: web.Request) -> web.Response:
        nonlocal timer
        body = await request.read()
        headers = request.headers
        signature = sign(_SECRET, headers[TIMESTAMP_HEADER], body)
        if not hmac.compare_digest(signature, headers[SIGNATURE_HEADER]):
            return web.Response(status=401)
        orjson.loads(body)
        answer = loop.create_future()
        waiting.append((headers[ID_HEADER], body, answer))
        if len(waiting) >= rule.gather_enough:
            send()
        elif timer is None:
            timer = loop.call_later(rule.gather_s, send)
        await answer
        return web.Response(body=b'{"status":"accepted"}', content_type="application/json")

    app = web.Application()
    app.router.add_post("/webhooks/xhub", webhook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def _marked(database_url: str, n: int) -> float:
    """When the bonuses and the emails hop have both marked `n` payments (time.time())."""
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            marked = await conn.fetchval(
                "SELECT count(*) FROM seen WHERE hop IN ('bonuses', 'emails')"
            )
            if marked >= 2 * n:
                return time.time()
            await asyncio.sleep(0.05)
        raise TimeoutError("the hops did not get every payment through in 10 minutes")
    finally:
        await conn.close()


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
        return started, await _marked(database_url, n)


def _drive_http(
    url: str,
    database_url: str,
    groups: dict[int, str],
    n: int,
    warmup: int,
    concurrency: int,
    clients: int,
) -> tuple[float, float, dict[str, float]]:
    """N webhooks over HTTP from bench.workers' load clients after a warm-up: (first 200,
    last payment through, CPU % by group meanwhile, the load clients and this process left
    out as bench.workers leaves them out)."""
    warm = make_deliveries(make_payments("ceil", "w", warmup), _SECRET)
    measured = make_deliveries(make_payments("ceil", "m", n), _SECRET)
    uvloop.run(warm_up(url, warm, concurrency))
    uvloop.run(_marked(database_url, warmup))
    load = Clients(url, measured, concurrency, 0, clients, max_seconds=600)
    load.start()
    try:
        load.wait_started()
        cpu = CpuGroups(groups, [*load.pids, os.getpid()], DATABASE)
        before = cpu.snapshot()
        done = uvloop.run(_marked(database_url, warmup + n))
        pct = CpuGroups.pct(before, cpu.snapshot())
        stamps = [t for _, stamped in load.join() for t in stamped.values()]
    finally:
        load.stop()
    if len(stamps) != n:
        raise RuntimeError(f"the stand-in for ingest accepted {len(stamps)} of {n}")
    return min(stamps), done, pct


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
    accept: bool = False  # the payments came in over HTTP through the stand-in for ingest

    @property
    def name(self) -> str:
        return "HTTP accept + 3 hops" if self.accept else "3 hops"


def measure(
    n: int,
    amqp_url: str,
    *,
    batch: int = 128,
    prefetch: int = 256,
    accept: bool = False,
    concurrency: int = 64,
    clients: int = 2,
    warmup: int = 500,
) -> Ceiling:
    """Run the hops on a vhost and a database of their own, both gone afterwards."""
    database_url = f"{DEFAULT_PG}/{DATABASE}"
    _psql(f"DROP DATABASE IF EXISTS {DATABASE}")
    _psql(f"CREATE DATABASE {DATABASE}")
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with own_vhost(amqp_url) as url, tempfile.TemporaryDirectory() as logs:
            asyncio.run(_psql_on(database_url, _TABLE))
            for name in HOPS:
                processes[name] = _spawn(name, url, database_url, logs, batch, prefetch)
            port = free_port() if accept else 0
            if accept:
                asyncio.run(_psql_on(database_url, _ACCEPTED))
                processes["accept"] = _spawn("accept", url, database_url, logs, port=port)
            time.sleep(3.0)  # connected and consuming
            groups = {p.pid: name for name, p in processes.items()}
            if accept:
                http = f"http://127.0.0.1:{port}/webhooks/xhub"
                started, done, pct = _drive_http(
                    http, database_url, groups, n, warmup, concurrency, clients
                )
            else:
                cpu = CpuGroups(groups, [os.getpid()], DATABASE)
                before = cpu.snapshot()
                started, done = uvloop.run(_drive(url, database_url, n))
                pct = CpuGroups.pct(before, cpu.snapshot())
            for process in processes.values():
                terminate(process, timeout_s=5)
            with contextlib.suppress(Exception):
                asyncio.run(_cleanup(url))
    finally:
        for process in processes.values():
            terminate(process, timeout_s=5)
        _psql(f"DROP DATABASE IF EXISTS {DATABASE}")
    wall = done - started
    groups_shown = (*(["accept"] if accept else []), *HOPS, "postgres", "rabbitmq")
    cpu_us = {g: pct.get(g, 0.0) * wall / n * 10_000 for g in groups_shown}
    return Ceiling(n / wall, cpu_us, accept)


def _spawn(
    name: str,
    amqp_url: str,
    database_url: str,
    logs: str,
    batch: int = 0,
    prefetch: int = 0,
    port: int = 0,
) -> subprocess.Popen[bytes]:
    """A hop process (batch, prefetch) or the stand-in for ingest (port)."""
    command = [sys.executable, "-m", "bench.ceiling", "--hop", name]
    command += ["--amqp-url", amqp_url, "--database-url", database_url]
    command += ["--batch", str(batch), "--prefetch", str(prefetch), "--port", str(port)]
    return spawn(command, dict(os.environ), Path(logs) / f"{name}.log")


def report(ceiling: Ceiling) -> None:
    total = sum(ceiling.cpu_us.values())
    label = f"ceiling: {ceiling.name}"
    print(f"{label:<40}{ceiling.per_s:,.0f} payments/s")
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
    p.add_argument(
        "--accept", action="store_true", help="the payments over HTTP through a stand-in ingest"
    )
    p.add_argument("--amqp-url", default=os.environ.get("AMQP_URL", DEFAULT_AMQP_URL))
    p.add_argument("--hop", choices=(*HOPS, "accept"), help=argparse.SUPPRESS)  # a process
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)  # the accept process's
    p.add_argument("--database-url", help=argparse.SUPPRESS)  # a hop process's
    args = p.parse_args()
    if args.hop == "accept":
        uvloop.run(_accept(args.amqp_url, args.database_url, args.port))
        return 0
    if args.hop:
        uvloop.run(_hop(args.hop, args.amqp_url, args.database_url, args.batch, args.prefetch))
        return 0
    report(
        measure(args.n, args.amqp_url, batch=args.batch, prefetch=args.prefetch, accept=args.accept)
    )
    return 0


async def _psql_on(database_url: str, sql: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


if __name__ == "__main__":
    sys.exit(main())
