"""The faults of `make chaos`, one per round (two in the combined rounds).

A fault is injected, held for `hold_s`, then restored; `restore` runs again in the round's
`finally`, so a failing round still leaves the run's RabbitMQ node and PostgreSQL cluster
running and the network open. The servers stopped, killed and restarted are the run's own
(tests/private_servers.py), never the machine's shared ones. Killed services come back through
`payhooks run all`'s supervisor, as in production through the orchestrator."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from tests import faults
from tests.chaos.stack import Stack
from tests.private_servers import PrivateServers

Step = Callable[[Stack, PrivateServers], Awaitable[None]]


async def _nothing(stack: Stack, servers: PrivateServers) -> None:
    return None


def _on_rabbitmq(fn: Callable[[faults.RabbitNode], None]) -> Step:
    async def step(stack: Stack, servers: PrivateServers) -> None:
        await asyncio.to_thread(fn, servers.rabbit)

    return step


def _on_postgres(fn: Callable[[faults.PgCluster], None]) -> Step:
    async def step(stack: Stack, servers: PrivateServers) -> None:
        await asyncio.to_thread(fn, servers.postgres)

    return step


def _kill(service: str) -> Step:
    async def step(stack: Stack, servers: PrivateServers) -> None:
        stack.kill(service)

    return step


async def _cut_rabbitmq(stack: Stack, servers: PrivateServers) -> None:
    stack.amqp_proxy.cut()


async def _cut_postgres(stack: Stack, servers: PrivateServers) -> None:
    stack.pg_proxy.cut()


async def _stall_rabbitmq(stack: Stack, servers: PrivateServers) -> None:
    stack.amqp_proxy.stall()


async def _stall_postgres(stack: Stack, servers: PrivateServers) -> None:
    stack.pg_proxy.stall()


async def _cut_smtp(stack: Stack, servers: PrivateServers) -> None:
    stack.smtp_proxy.cut()


async def _stall_smtp(stack: Stack, servers: PrivateServers) -> None:
    stack.smtp_proxy.stall()


# Issue 39's outage rounds: longer than the whole ladder, which they shorten to 1.4 s. A cut
# proxy is what a stopped server is to its clients (every connection reset, every new one
# refused), without stopping the server this machine's other users share.
FAST_LADDER = "0.2,0.4,0.8"
OUTAGE_S = 60.0
TERMINATE_FOR_S = 20.0
TERMINATE_EVERY_S = 0.5


async def _terminate_connections(stack: Stack, servers: PrivateServers) -> None:
    """Every connection to the round's own database terminated every 0.5 s for 20 s (a
    failover or a pooler restart seen from the services); other databases are left alone."""
    admin = await asyncpg.connect(stack.database_url, timeout=10)
    try:
        loop = asyncio.get_running_loop()
        until = loop.time() + TERMINATE_FOR_S
        while loop.time() < until:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            await asyncio.sleep(TERMINATE_EVERY_S)
    finally:
        await admin.close()


async def _network_back(stack: Stack, servers: PrivateServers) -> None:
    stack.amqp_proxy.restore()
    stack.pg_proxy.restore()
    stack.smtp_proxy.restore()


async def _backing_services_up(stack: Stack, servers: PrivateServers) -> None:
    """Whatever a round did, the run's RabbitMQ node and PostgreSQL cluster run afterwards and
    the network is open."""
    await _network_back(stack, servers)
    await asyncio.to_thread(faults.ensure_rabbitmq, servers.rabbit)
    await asyncio.to_thread(faults.ensure_postgres, servers.postgres)


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    what: str
    inject: Step
    hold_s: float = 0.0
    restore: Step = _backing_services_up
    retry_delays: str | None = None  # the round's RETRY_DELAYS (None: the stack's default)


def _both(first: Step, second: Step) -> Step:
    async def step(stack: Stack, servers: PrivateServers) -> None:
        await asyncio.gather(first(stack, servers), second(stack, servers))

    return step


FAULTS: tuple[Fault, ...] = (
    Fault("none", "no fault (the baseline)", _nothing),
    Fault(
        "rabbitmq-stop",
        "rabbitmqctl stop_app, 20 s, start_app",
        _on_rabbitmq(faults.rabbitmq_stop_app),
        hold_s=20,
    ),
    Fault(
        "rabbitmq-kill",
        "RabbitMQ's node killed with SIGKILL, started again after 5 s",
        _on_rabbitmq(faults.rabbitmq_kill),
        hold_s=5,
    ),
    Fault("postgres-restart", "pg_ctlcluster restart", _on_postgres(faults.postgres_restart)),
    Fault(
        "postgres-stop",
        "PostgreSQL stopped for 20 s, then started",
        _on_postgres(faults.postgres_stop),
        hold_s=20,
    ),
    *(
        Fault(f"kill-{service}", f"kill -9 of {service}", _kill(service))
        for service in ("ingest", "orders", "bonuses", "email", "reconciler")
    ),
    Fault("cut-rabbitmq", "network to RabbitMQ cut for 30 s", _cut_rabbitmq, hold_s=30),
    Fault("cut-postgres", "network to PostgreSQL cut for 30 s", _cut_postgres, hold_s=30),
    Fault(
        "stall-rabbitmq",
        "network to RabbitMQ a black hole for 30 s",
        _stall_rabbitmq,
        hold_s=30,
    ),
    Fault(
        "stall-postgres",
        "network to PostgreSQL a black hole for 30 s",
        _stall_postgres,
        hold_s=30,
    ),
    Fault("cut-smtp", "network to the SMTP server cut for 30 s", _cut_smtp, hold_s=30),
    Fault(
        "stall-smtp",
        "network to the SMTP server a black hole for 30 s",
        _stall_smtp,
        hold_s=30,
    ),
    Fault(
        "rabbitmq-stop+kill-ingest",
        "rabbitmqctl stop_app and kill -9 of ingest, 20 s, start_app",
        _both(_on_rabbitmq(faults.rabbitmq_stop_app), _kill("ingest")),
        hold_s=20,
    ),
    Fault(
        "postgres-restart+kill-orders",
        "pg_ctlcluster restart and kill -9 of orders at once",
        _both(_on_postgres(faults.postgres_restart), _kill("orders")),
    ),
    Fault(
        "outage-postgres",
        "PostgreSQL unreachable 60 s (network cut), ladder 0.2,0.4,0.8",
        _cut_postgres,
        hold_s=OUTAGE_S,
        retry_delays=FAST_LADDER,
        restore=_network_back,  # these rounds stop no server: none to start again
    ),
    Fault(
        "outage-rabbitmq",
        "RabbitMQ unreachable 60 s (network cut), ladder 0.2,0.4,0.8",
        _cut_rabbitmq,
        hold_s=OUTAGE_S,
        retry_delays=FAST_LADDER,
        restore=_network_back,  # these rounds stop no server: none to start again
    ),
    Fault(
        "outage-smtp",
        "SMTP server refusing 60 s, ladder 0.2,0.4,0.8",
        _cut_smtp,
        hold_s=OUTAGE_S,
        retry_delays=FAST_LADDER,
        restore=_network_back,  # these rounds stop no server: none to start again
    ),
    Fault(
        "outage-pg-terminate",
        "every database connection terminated every 0.5 s for 20 s, ladder 0.2,0.4,0.8",
        _terminate_connections,
        retry_delays=FAST_LADDER,
        restore=_network_back,  # these rounds stop no server: none to start again
    ),
)

BY_NAME = {f.name: f for f in FAULTS}
