"""One reader of a DLQ at a time, across every process: a reader holds the exclusive queue
`<dlq>.lock`, because messages one reader holds unacknowledged are hidden from every other,
and a requeue or purge would handle part of the DLQ and report success."""

from __future__ import annotations

import asyncio
import contextlib
import random
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiormq
from aio_pika.abc import AbstractChannel

from shared.amqp.topology import lock_of

# How long a reader waits for another to finish with a DLQ (a requeue of thousands of
# messages takes seconds), and the pause between two tries.
LOCK_WAIT_S = 30.0
_LOCK_RETRY_S = (0.1, 0.3)
# A payment view shows the database without dead letters rather than wait that long.
VIEW_LOCK_WAIT_S = 3.0
_DROP_TIMEOUT_S = 5.0


class DlqBusyError(Exception):
    """Another reader (an operator command, an api replica) kept the DLQ past the wait."""


# RabbitMQ lets a connection declare its own exclusive queue again, so readers that share a
# connection (the api's requests and its monitor) take turns here before asking RabbitMQ.
_turns: weakref.WeakKeyDictionary[aiormq.abc.AbstractConnection, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


@asynccontextmanager
async def reading(
    channel: AbstractChannel, dlq: str, *, wait_s: float | None = None
) -> AsyncIterator[None]:
    """Hold `dlq` for reading its messages on `channel`: one reader at a time, across every
    process. DlqBusyError after `wait_s` (LOCK_WAIT_S) without it.

    The lock is the exclusive queue `<dlq>.lock` on the reader's connection: RabbitMQ refuses
    it to any other connection (RESOURCE_LOCKED) and deletes it when the connection closes, so
    a reader that crashed never keeps it.
    """
    underlay = await channel.get_underlay_channel()
    async with _held(underlay.connection, dlq, LOCK_WAIT_S if wait_s is None else wait_s):
        try:
            yield
        finally:
            # Acks and hand-backs get no reply: one round trip on the reader's channel makes
            # sure RabbitMQ has them all before the next reader starts.
            if not underlay.is_closed:
                with contextlib.suppress(
                    aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError
                ):
                    await underlay.basic_qos(prefetch_count=0)


@asynccontextmanager
async def _held(
    connection: aiormq.abc.AbstractConnection, dlq: str, wait_s: float
) -> AsyncIterator[None]:
    turn = _turns.setdefault(connection, {}).setdefault(dlq, asyncio.Lock())
    name = lock_of(dlq)
    try:
        async with asyncio.timeout(wait_s):
            await turn.acquire()
            try:
                await _take(connection, name)
            except BaseException:
                await _release(turn, connection, name)
                raise
    except TimeoutError:
        raise DlqBusyError(
            f"{dlq} is busy: another requeue, purge or show held it for {wait_s:g} s;"
            " try again when it has finished"
        ) from None
    try:
        yield
    finally:
        await _release(turn, connection, name)


async def _take(connection: aiormq.abc.AbstractConnection, name: str) -> None:
    while True:
        # Each try runs to its end even when the wait runs out meanwhile: a cancellation
        # between channel.open and its open-ok makes aiormq give the channel number out
        # again while RabbitMQ still has it open, and RabbitMQ then closes the whole
        # connection ("second 'channel.open' seen"; seen once in a CI run). A try is short,
        # and one that took the lock after all is dropped by the caller's release.
        attempt = asyncio.ensure_future(_try_take(connection, name))
        try:
            taken = await asyncio.shield(attempt)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await attempt
            raise
        if taken:
            return
        await asyncio.sleep(random.uniform(*_LOCK_RETRY_S))


async def _try_take(connection: aiormq.abc.AbstractConnection, name: str) -> bool:
    attempt = await connection.channel(publisher_confirms=False)
    try:
        await attempt.queue_declare(name, exclusive=True, auto_delete=True)
        return True  # the queue belongs to the connection; the channel can go
    except aiormq.exceptions.ChannelLockedResource:
        return False  # another connection holds it (and RabbitMQ closed this channel)
    finally:
        if not attempt.is_closed:
            await attempt.close()


async def _release(
    turn: asyncio.Lock, connection: aiormq.abc.AbstractConnection, name: str
) -> None:
    try:
        await asyncio.shield(_drop(connection, name))
    finally:
        turn.release()


async def _drop(connection: aiormq.abc.AbstractConnection, name: str) -> None:
    """Delete the lock if this connection holds it. Run after every attempt, even a failed or
    cancelled one: RabbitMQ refuses the deletion to anyone but the holder, and a lock left on
    the api's long-lived connection would shut every other reader out."""
    # RuntimeError: the connection is closed, and the lock went with it.
    with contextlib.suppress(aiormq.exceptions.AMQPError, OSError, RuntimeError, TimeoutError):
        async with asyncio.timeout(_DROP_TIMEOUT_S):
            await _delete(connection, name)


async def _delete(connection: aiormq.abc.AbstractConnection, name: str) -> None:
    channel = await connection.channel(publisher_confirms=False)
    try:
        await channel.queue_delete(name)
    finally:
        if not channel.is_closed:
            await channel.close()
