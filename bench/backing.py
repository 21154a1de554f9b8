"""PostgreSQL and RabbitMQ as the benchmarks see them: a clean start (tables emptied, a
prefixed topology deleted), a RabbitMQ vhost of the run's own, queue depths and consumers, the
database's commit count."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import aio_pika
import asyncpg

from shared.amqp.topology import Topology, build_topology, delete
from shared.config import Settings
from tests import run_vhost

# A bench declares one topology at a time (22 queues with the default RETRY_DELAYS, a few more
# with a longer ladder) and deletes it; RabbitMQ refuses declares beyond this.
BENCH_MAX_QUEUES = 100


@contextlib.contextmanager
def own_vhost(amqp_url: str) -> Iterator[str]:
    """The AMQP URL for this bench run: a vhost of its own on a broker on this machine,
    deleted with everything in it at the end (a killed run's by the next run); `amqp_url`
    itself for a broker elsewhere, one rabbitmqctl cannot reach or a list of nodes (a
    cluster of the run's own, bench.copies)."""
    if "," in amqp_url:
        yield amqp_url
        return
    with run_vhost.own_vhost(amqp_url, "bench", BENCH_MAX_QUEUES) as url:
        yield url


def first_node(amqp_url: str) -> str:
    """The URL the bench's own connections use: AMQP_URL may list a cluster's nodes
    (comma-separated, as payhooks reads it); the bench asks the first."""
    return amqp_url.split(",", 1)[0].strip()


def topology_of(env: dict[str, str]) -> Topology:
    """The names the services started with `env` will declare (retry tiers too)."""
    settings = Settings.from_env(env)
    return build_topology(settings.amqp_prefix, settings.retry_delays_s)


# What an ingest benchmark empties: the inbox, its dedup keys (migration 021), its unpublished ids.
INBOX_TABLES = "inbox, inbox_keys, inbox_unpublished"


async def reset(database_url: str, amqp_url: str, topology: Topology, tables: str) -> None:
    """Empty `tables` (a constant list, never user input) and remove `topology`, which a
    killed run may have left behind."""
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        await conn.execute(f"TRUNCATE {tables} RESTART IDENTITY")
    finally:
        await conn.close()
    await delete_topology(amqp_url, topology)


# Rows of earlier days a running system has (and keeps for RETENTION_DAYS): the workers look
# them up by key, and an empty table gets plans no live system runs (see analyze).
HISTORY_ROWS = 50_000
_HISTORY = (
    "INSERT INTO processed_events (worker, event_id, outcome, processed_at)"
    " SELECT w, 'hist_evt_' || g, 'ok', now() - interval '1 day'"
    " FROM generate_series(1, $1::int) g, (VALUES ('orders'), ('bonuses')) v(w)",
    "INSERT INTO order_transitions (payment_id, from_status, to_status, event_id, at)"
    " SELECT 'hist_pay_' || g, 'PENDING', 'PAID', 'hist_evt_' || g, now() - interval '1 day'"
    " FROM generate_series(1, $1::int) g",
    "INSERT INTO emails_sent (payment_id, template, message_id, recipient, event_id, skipped,"
    " sent_at) SELECT 'hist_pay_' || g, 'payment_succeeded', '<hist.' || g || '@bench>',"
    " 'buyer@bench.localhost', 'hist_evt_' || g, false, now() - interval '1 day'"
    " FROM generate_series(1, $1::int) g",
    "INSERT INTO outbox (message_id, routing_key, body, created_at, published_at)"
    " SELECT 'hist_msg_' || g, 'order.paid', '{}', now() - interval '1 day',"
    " now() - interval '1 day' FROM generate_series(1, $1::int) g",
)


async def add_history(database_url: str, rows: int = HISTORY_ROWS) -> None:
    """`rows` payments' worth of earlier days' rows (ids prefixed hist_, never the run's)."""
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        for statement in _HISTORY:
            await conn.execute(statement, rows)
    finally:
        await conn.close()


async def analyze(database_url: str, tables: str) -> None:
    """Fresh planner statistics for `tables` (a constant list), as autovacuum keeps them on a
    running system. With the tables nearly empty (right after the TRUNCATE) a lookup of a
    batch's keys is planned as a sequential scan, which the services' prepared statements
    keep until autovacuum analyzes again, a minute or more into the run, while the table
    grows: measured without the history, 8-10 ms a statement, half of PostgreSQL's CPU."""
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        await conn.execute(f"ANALYZE {tables}")
    finally:
        await conn.close()


async def delete_topology(amqp_url: str, topology: Topology) -> None:
    connection = await aio_pika.connect(first_node(amqp_url), timeout=5)
    async with connection:
        await delete(await connection.channel(), topology)


async def commit_count(database_url: str) -> int:
    """Transactions committed in the bench database so far (PostgreSQL's statistics)."""
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        value = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await conn.close()
    return int(value or 0)


async def queue_counts(amqp_url: str, queues: list[str]) -> dict[str, tuple[int, int]]:
    """(messages, consumers) per queue; a queue that does not exist counts as (-1, 0)."""
    found: dict[str, tuple[int, int]] = {}
    connection = await aio_pika.connect(first_node(amqp_url), timeout=5)
    async with connection:
        for name in queues:
            channel = await connection.channel()
            try:
                declared = await channel.declare_queue(name, passive=True)
            except aio_pika.exceptions.ChannelClosed:
                found[name] = (-1, 0)
                continue
            result = declared.declaration_result
            found[name] = (result.message_count or 0, result.consumer_count or 0)
            await channel.close()
    return found


def wait_consumed(amqp_url: str, queues: list[str], deadline: float) -> None:
    """Until every queue has a consumer; RuntimeError past `deadline` (monotonic)."""
    while any(c < 1 for _, c in asyncio.run(queue_counts(amqp_url, queues)).values()):
        if time.monotonic() > deadline:
            raise RuntimeError("the workers are not consuming their queues")
        time.sleep(0.2)
