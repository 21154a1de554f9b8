"""RabbitMQ's resource alarms as a publisher sees them: a blocked connection, seen at once."""

from __future__ import annotations

from aio_pika.abc import AbstractRobustConnection

from shared.errors import BrokerUnavailableError


class BlockedError(BrokerUnavailableError):
    """RabbitMQ blocks publishers (a memory or disk alarm): nothing was published."""

    def __init__(self) -> None:
        super().__init__("RabbitMQ is blocking publishers (memory or disk alarm)")


def is_blocked(connection: AbstractRobustConnection | None) -> bool:
    """Whether RabbitMQ has blocked `connection` (AMQP connection.blocked: a memory or disk
    alarm), seen without waiting. aiormq keeps that state private, but its public ready()
    waits exactly while the connection is blocked: one step of that coroutine finishes at once
    unless it would wait."""
    if connection is None or connection.is_closed or connection.transport is None:
        return False
    underlying = connection.transport.connection
    if underlying.is_closed:  # a lost connection waits in ready() too, but is not blocked
        return False
    ready = underlying.ready()
    try:
        ready.send(None)
    except StopIteration:
        return False
    ready.close()  # leaves no waiter behind (asyncio.Event.wait cleans up in `finally`)
    return True
