"""One-off connections for terminal commands: PostgreSQL or RabbitMQ, or UnreachableError."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aio_pika
import asyncpg
from aio_pika.abc import AbstractChannel

from shared.amqp.topology import Topology, build_topology
from shared.config import Settings
from shared.config_values import amqp_nodes
from shared.db import init_connection

_TIMEOUT_S = 5.0


class UnreachableError(Exception):
    """PostgreSQL or RabbitMQ could not be reached (exit 3)."""


@asynccontextmanager
async def database(settings: Settings) -> AsyncIterator[asyncpg.Connection[Any]]:
    try:
        conn: asyncpg.Connection[Any] = await asyncpg.connect(
            settings.database_url, timeout=_TIMEOUT_S
        )
    except (OSError, TimeoutError, asyncpg.PostgresError) as e:
        raise UnreachableError(f"cannot reach PostgreSQL: {e}") from None
    try:
        await init_connection(conn)
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def broker(settings: Settings) -> AsyncIterator[tuple[AbstractChannel, Topology]]:
    connection, error = None, None
    for node in amqp_nodes(settings.amqp_url):  # a cluster's nodes, in turn
        try:
            connection = await aio_pika.connect(node, timeout=_TIMEOUT_S)
            break
        except (OSError, TimeoutError, aio_pika.exceptions.AMQPError) as e:
            error = e  # the last node's reason is the one shown
    if connection is None:
        raise UnreachableError(f"cannot reach RabbitMQ: {error}") from None
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        yield channel, build_topology(settings.amqp_prefix, settings.retry_delays_s)
    finally:
        await connection.close()
