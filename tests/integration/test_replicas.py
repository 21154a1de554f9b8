"""Replicas of every service (SPEC 1): `payhooks run all --replicas N` runs N copies of each,
on ports of their own, competing for the same queues; the periodic sweeps that replicas share
take each row once (the reconciler's leases and the inbox relay's are tested beside their
services: test_reconciler.py, test_ingest_replicas.py)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import aiohttp

from services.cli.run_all import REPLICA_PORT_STEP
from services.orders.outbox import OutboxRelay
from shared.amqp.broker import Broker
from shared.amqp.topology import Topology, declare
from shared.config import Settings
from shared.db import create_pool
from shared.queries import outbox as outbox_sql
from tests.helpers import drain, eventually
from tests.integration.system import consumer_counts
from tests.integration.test_run_all import children_of, ready
from tests.processes import payhooks_command, run_all_env


async def test_run_all_with_two_replicas_runs_two_competing_copies_of_every_service(
    settings: Settings, amqp: Any, topology: Topology, db: Any
) -> None:
    env, ports = run_all_env(settings)
    process = await asyncio.create_subprocess_exec(
        *payhooks_command(),
        "run",
        "all",
        "--replicas",
        "2",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with aiohttp.ClientSession() as session:
            # No reconciler: no provider API is configured here.
            services = [p for name, p in ports.items() if name != "SMTP_PORT"]
            for port in [p + REPLICA_PORT_STEP * r for p in services for r in (0, 1)]:
                await eventually(
                    lambda port=port: ready(session, port),  # type: ignore[misc]
                    lambda s: s == 200,
                    timeout_s=40,
                )
        assert len(children_of(process.pid)) == 2 * len(services) + 1  # and the SMTP sink
        queues = [topology.work[q].name for q in ("orders", "bonuses", "emails")]
        assert await consumer_counts(amqp, queues) == dict.fromkeys(queues, 2)
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(40):
            output, _ = await process.communicate()
    text = output.decode(errors="replace")
    assert process.returncode == 0, text[-2000:]
    assert "payhooks: starting ingest#1, ingest#2, orders#1, orders#2," in text


async def test_two_outbox_relays_sweeping_at_once_publish_each_stranded_row_once(
    settings: Settings, amqp: Any, topology: Topology, db: Any
) -> None:
    """Transitions committed by a worker that died before publishing them: the relays of two
    orders replicas sweep at the same moment; each row goes out once (SKIP LOCKED, the lock
    held until the publish is confirmed and the row marked)."""
    await declare(amqp, topology)
    rows = [(f"evt_{n}:order.paid", "order.paid", b'{"payment_id":"p"}') for n in range(300)]
    await outbox_sql.add_many_to_outbox(db, rows)
    pool = await create_pool(settings.database_url, max_size=4)
    brokers = [Broker(settings.amqp_url, topology) for _ in range(2)]
    try:
        for broker in brokers:
            await broker.start()
            await broker.wait_connected(10)
        relays = [OutboxRelay(pool, broker) for broker in brokers]
        sent = await asyncio.gather(*(relay.relay_once() for relay in relays))
        sent += await asyncio.gather(*(relay.relay_once() for relay in relays))
        sent += await asyncio.gather(*(relay.relay_once() for relay in relays))
    finally:
        for broker in brokers:
            await broker.close()
        await pool.close()
    assert sum(sent) == len(rows)
    published = await drain(amqp, topology.work["bonuses"].name)
    assert sorted(m.message_id or "" for m in published) == sorted(r[0] for r in rows)
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
