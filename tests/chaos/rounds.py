"""The faults of `make chaos`, one per round (two in the combined rounds).

A fault is injected, held for `hold_s`, then restored; `restore` runs again in the round's
`finally`, so a failing round still leaves RabbitMQ and PostgreSQL running and the network
open. Killed services come back through `payhooks run all`'s supervisor, as in production
through the orchestrator."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tests import faults
from tests.chaos.stack import Stack

Step = Callable[[Stack], Awaitable[None]]


async def _nothing(stack: Stack) -> None:
    return None


def _blocking(fn: Callable[[], None]) -> Step:
    async def step(stack: Stack) -> None:
        await asyncio.to_thread(fn)

    return step


def _kill(service: str) -> Step:
    async def step(stack: Stack) -> None:
        stack.kill(service)

    return step


async def _cut_rabbitmq(stack: Stack) -> None:
    stack.amqp_proxy.cut()


async def _cut_postgres(stack: Stack) -> None:
    stack.pg_proxy.cut()


async def _stall_rabbitmq(stack: Stack) -> None:
    stack.amqp_proxy.stall()


async def _stall_postgres(stack: Stack) -> None:
    stack.pg_proxy.stall()


async def _cut_smtp(stack: Stack) -> None:
    stack.smtp_proxy.cut()


async def _stall_smtp(stack: Stack) -> None:
    stack.smtp_proxy.stall()


async def _network_back(stack: Stack) -> None:
    stack.amqp_proxy.restore()
    stack.pg_proxy.restore()
    stack.smtp_proxy.restore()


async def _backing_services_up(stack: Stack) -> None:
    """Whatever a round did, RabbitMQ and PostgreSQL run afterwards and the network is open."""
    await _network_back(stack)
    await asyncio.to_thread(faults.ensure_rabbitmq)
    await asyncio.to_thread(faults.ensure_postgres)


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    what: str
    inject: Step
    hold_s: float = 0.0
    restore: Step = _backing_services_up


def _both(first: Step, second: Step) -> Step:
    async def step(stack: Stack) -> None:
        await asyncio.gather(first(stack), second(stack))

    return step


FAULTS: tuple[Fault, ...] = (
    Fault("none", "no fault (the baseline)", _nothing),
    Fault(
        "rabbitmq-stop",
        "rabbitmqctl stop_app, 20 s, start_app",
        _blocking(faults.rabbitmq_stop_app),
        hold_s=20,
    ),
    Fault(
        "rabbitmq-kill",
        "RabbitMQ's node killed with SIGKILL, started again after 5 s",
        _blocking(faults.rabbitmq_kill),
        hold_s=5,
    ),
    Fault("postgres-restart", "pg_ctlcluster restart", _blocking(faults.postgres_restart)),
    Fault(
        "postgres-stop",
        "PostgreSQL stopped for 20 s, then started",
        _blocking(faults.postgres_stop),
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
        _both(_blocking(faults.rabbitmq_stop_app), _kill("ingest")),
        hold_s=20,
    ),
    Fault(
        "postgres-restart+kill-orders",
        "pg_ctlcluster restart and kill -9 of orders at once",
        _both(_blocking(faults.postgres_restart), _kill("orders")),
    ),
)

BY_NAME = {f.name: f for f in FAULTS}
