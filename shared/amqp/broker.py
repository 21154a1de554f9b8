"""RabbitMQ for a service's lifetime: connected in the background (the service starts while
the broker is down), reconnected by aio-pika, publishes confirmed and mandatory, failed at
once while RabbitMQ blocks publishers."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import cast

import aio_pika
import aiormq
import structlog
from aio_pika import RobustConnection
from aio_pika.abc import (
    AbstractExchange,
    AbstractRobustChannel,
    AbstractRobustConnection,
)
from aiohttp import web
from yarl import URL

from shared.amqp.alarms import BlockedError, is_blocked
from shared.amqp.outgoing import Outgoing, properties
from shared.amqp.publish_together import publish_error, publish_together, retrieve_exception
from shared.amqp.topology import Topology, declare
from shared.config_values import amqp_nodes
from shared.errors import BrokerUnavailableError
from shared.process.tasks import cancel_and_wait
from shared.process.web import READINESS_CHECKS, SERVING

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_S = 5.0
_RECONNECT_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
_ATTEMPT_TIMEOUT_S = 20.0
# Longer than aio-pika's own reconnect (every 5 s) and channel restore take after an outage.
_STUCK_AFTER_S = 30.0
# With a cluster's nodes to choose from, a node gone this long is given up for the next one
# (aio-pika's own reconnect only ever tries the node it lost).
NODE_LOST_AFTER_S = 3.0
_STILL_WAITING_EVERY_S = 60.0
_CLOSE_S = 5.0  # a connection that does not close by then is left to the garbage collector
_WATCH_INTERVAL_S = 2.0
# How often a wait for confirms looks whether RabbitMQ has blocked the connection meanwhile.
_BLOCKED_POLL_S = 0.05
_BLOCKED_MEMORY_S = 0.001


def _failed(error: BaseException) -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    future.add_done_callback(retrieve_exception)
    return future


class Broker:
    """Owns the connection, a publisher-confirms channel and the declared topology."""

    def __init__(self, url: str, topology: Topology) -> None:
        # One node, or a cluster's nodes tried in turn (AMQP_URL): the next one after a failed
        # attempt, and after losing the one in use (NODE_LOST_AFTER_S).
        self._nodes = amqp_nodes(url)
        self._node = 0  # the index of the node in use, or to try next
        # Counts the connections made: a consumer on an older one consumes again at once.
        self.generation = 0
        self.topology = topology
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._blocked_seen, self._blocked_seen_at = False, -1.0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="broker-connect")

    async def _run(self) -> None:
        """Connect, then watch: aio-pika's robust connection brings the connection back after
        an outage, but `make chaos` twice saw one that never did (made while RabbitMQ was
        stopping; no attempt, no log). Not ready for _STUCK_AFTER_S: start afresh."""
        await self._connect_forever()
        loop = asyncio.get_running_loop()
        unready_since: float | None = None
        while True:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            if self.is_ready:
                unready_since = None
                continue
            unready_since = unready_since or loop.time()
            give_up_s = NODE_LOST_AFTER_S if len(self._nodes) > 1 else _STUCK_AFTER_S
            if loop.time() - unready_since < give_up_s:
                continue
            self._node = (self._node + 1) % len(self._nodes)
            log.error(
                "broker.reconnecting_afresh",
                not_ready_s=round(loop.time() - unready_since),
                next_node=self.node,
            )
            stale, self._connection, self._channel, self._exchange = (
                self._connection,
                None,
                None,
                None,
            )
            self._connected.clear()
            if stale is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CONNECT_TIMEOUT_S):
                        await stale.close()
            await self._connect_forever()
            unready_since = None

    async def wait_connected(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            await self._connected.wait()

    async def close(self) -> None:
        if self._task is not None:
            # A cancellation that lands while aio-pika opens the connection or a channel can be
            # swallowed there; the task then connected and watched for ever (a shutdown that
            # never ended, seen as a 60 s test teardown timeout).
            await cancel_and_wait(self._task, again_after_s=_CLOSE_S / 5)
        if self._connection is not None:
            # Bounded: a connection half-way through a reconnect can keep close() waiting.
            try:
                await asyncio.wait_for(self._connection.close(), _CLOSE_S)
            except Exception as e:  # shutting down: nothing left to do with it
                log.warning("broker.close_failed", error=repr(e))

    @property
    def node(self) -> str:
        """The node in use (or tried next), as host:port: never the URL's credentials."""
        url = URL(self._nodes[self._node])
        return f"{url.host}:{url.port or (5671 if url.scheme == 'amqps' else 5672)}"

    @property
    def channel(self) -> AbstractRobustChannel:
        if self._channel is None or self._channel.is_closed:
            raise BrokerUnavailableError("RabbitMQ channel is not open")
        return self._channel

    @property
    def connection(self) -> AbstractRobustConnection:
        if self._connection is None or self._connection.is_closed:
            raise BrokerUnavailableError("RabbitMQ is not connected")
        return self._connection

    async def publish_to_queue(
        self, queue: str, message: aio_pika.Message, timeout_s: float
    ) -> None:
        """Publish straight to one queue (retry tiers, DLQs) and wait for the confirm."""
        channel = self.channel
        await asyncio.wait_for(
            channel.default_exchange.publish(message, queue, mandatory=True), timeout_s
        )

    async def ping(self) -> bool:
        """A real round trip: a stalled broker or network shows up here, not just a closed
        socket. Skipped while RabbitMQ blocks the connection (it reads nothing then)."""
        if not self.is_ready or self._connection is None or self._connection.transport is None:
            return False
        if self.blocked:
            return True  # connected; `blocked` is reported on its own
        # Opening a channel is answered by the broker itself. (A passive declare on the robust
        # channel is not: aio-pika answers it from its cache for an exchange it declared, so a
        # black-holed broker looked ready.) Its own channel: a round trip given up on here
        # must not leave the publishing channel waiting for a late reply.
        probe = await self._connection.transport.connection.channel(publisher_confirms=False)
        await probe.close()
        return True

    async def probe(self) -> None:
        """Raises unless RabbitMQ answers and takes publishes: what a worker paused for it
        asks before it takes work again."""
        if not await self.ping():
            raise BrokerUnavailableError("RabbitMQ is not connected")
        if self.blocked:
            raise BlockedError()

    @property
    def blocked(self) -> bool:
        """True while RabbitMQ blocks this connection's publishes (a memory or disk alarm:
        from its next publish after the alarm until it clears, nothing is confirmed)."""
        # Looked at by every request: the answer is kept for a millisecond.
        now = time.monotonic()
        if now - self._blocked_seen_at > _BLOCKED_MEMORY_S:
            self._blocked_seen, self._blocked_seen_at = is_blocked(self._connection), now
        return self._blocked_seen

    @property
    def is_ready(self) -> bool:
        return (
            self._connection is not None
            and not self._connection.is_closed
            and self._channel is not None
            and not self._channel.is_closed
        )

    async def start_publishes(self, messages: Sequence[Outgoing]) -> list[asyncio.Future[None]]:
        """Send every message now; one future per message that resolves at its confirm.

        A future that fails means "not published". One still pending after a deadline means
        "unknown": the frames may be in the broker already and a late confirm can still come,
        so callers must not cancel it (and must not treat it as failed for sure).
        """
        if self._exchange is None or self._channel is None or not self.is_ready:
            return [_failed(BrokerUnavailableError("RabbitMQ is not connected")) for _ in messages]
        if self.blocked:
            return [_failed(BlockedError()) for _ in messages]
        # Straight onto the exchange's channel (aiormq), the batch in one write, without an
        # aio_pika.Message per message. The channel was opened with on_return_raises, so an
        # unroutable mandatory message still fails.
        now = dt.datetime.now(dt.UTC)
        try:
            channel = cast(aiormq.Channel, await self._channel.get_underlay_channel())
            futures = await publish_together(
                channel,
                self._exchange.name,
                [(m.routing_key, m.body, properties(m, now)) for m in messages],
            )
        except Exception as e:  # the channel closed under us: none of them went out
            return [_failed(BrokerUnavailableError(f"publish failed: {e!r}")) for _ in messages]
        for future in futures:
            future.add_done_callback(retrieve_exception)
        return futures  # type: ignore[return-value]  # publish resolves to the confirm frame

    async def publish_many(
        self, messages: Sequence[Outgoing], timeout_s: float
    ) -> list[BaseException | None]:
        """Publish and wait up to `timeout_s`; None per confirmed message, else its error
        (PublishTimeoutError when the outcome is unknown)."""
        futures = await self.start_publishes(messages)
        await self.wait_confirms(futures, timeout_s)
        return [publish_error(f) for f in futures]

    async def wait_confirms(
        self, futures: Sequence[asyncio.Future[None]], timeout_s: float
    ) -> None:
        """Wait until every publish is settled, `timeout_s` has passed, or RabbitMQ blocks the
        connection (no confirm comes until the alarm clears: the outcome is unknown now)."""
        if not futures:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (remaining := deadline - loop.time()) > 0:
            _, pending = await asyncio.wait(futures, timeout=min(remaining, _BLOCKED_POLL_S))
            if not pending or self.blocked:
                return

    async def _connect_forever(self) -> None:
        attempt, said_at = 0, 0.0
        while True:
            # Built by hand rather than with connect_robust() so that a failure or a
            # cancellation half-way (shutdown during startup) can always close it: a robust
            # connection left open keeps reconnecting for ever.
            connection = RobustConnection(URL(self._nodes[self._node]))
            try:
                # One bound for the whole attempt: a broker going away half-way (stop_app while
                # we declare) once left an attempt waiting for ever with no connection open.
                async with asyncio.timeout(_ATTEMPT_TIMEOUT_S):
                    await connection.connect(timeout=CONNECT_TIMEOUT_S)
                    channel = await connection.channel(
                        publisher_confirms=True, on_return_raises=True
                    )
                    exchange = await declare(channel, self.topology)
            except BaseException as e:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CONNECT_TIMEOUT_S):
                        await asyncio.shield(connection.close())
                # Anything but cancellation is retried: aio-pika also raises RuntimeError
                # ("... closed") when the broker closes the connection half-way, and a
                # connect task that died on it left ingest answering 503 for good.
                if not isinstance(e, Exception):
                    raise
                if _cancelling():  # our cancellation came back as an aio-pika error
                    raise asyncio.CancelledError from e
                failed_node = self.node
                self._node = (self._node + 1) % len(self._nodes)
                attempt += 1
                # Every node of the list once without a pause, then the backoff per round.
                delay = 0.0
                if attempt % len(self._nodes) == 0:
                    rounds = attempt // len(self._nodes)
                    delay = _RECONNECT_BACKOFF_S[min(rounds - 1, len(_RECONNECT_BACKOFF_S) - 1)]
                # A broker that stays away is said once, plainly, then once a minute: not a
                # line every few seconds for as long as it is down.
                now = time.monotonic()
                if attempt == 1 or now - said_at >= _STILL_WAITING_EVERY_S:
                    said_at = now
                    log.warning(
                        "broker.unreachable" if attempt == 1 else "broker.still_unreachable",
                        node=failed_node,
                        attempts=attempt,
                        error=repr(e),
                        hint="payhooks waits for RabbitMQ and connects by itself once it is"
                        " reachable: start it (e.g. `rabbitmq-server -detached`) or set"
                        " AMQP_URL to where it runs",
                    )
                await asyncio.sleep(delay)
                continue
            if _cancelling():  # cancelled, but aio-pika swallowed it
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CONNECT_TIMEOUT_S):
                        await asyncio.shield(connection.close())
                raise asyncio.CancelledError
            self._connection, self._channel, self._exchange = connection, channel, exchange
            self.generation += 1
            self._connected.set()
            log.info("broker.connected", node=self.node)
            return


def _cancelling() -> bool:
    """Whether the running task has been asked to cancel (whatever caught the error)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


BROKER = web.AppKey("broker", Broker)


def broker_ctx(url: str, topology: Topology) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context owning the service's Broker (connects in the background)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        broker = Broker(url, topology)
        await broker.start()
        app[BROKER] = broker

        app[SERVING]["rabbitmq"] = lambda: broker.node

        async def rabbitmq() -> bool:
            return await broker.ping()

        async def rabbitmq_not_blocked() -> bool:
            return not broker.blocked

        app[READINESS_CHECKS].extend([rabbitmq, rabbitmq_not_blocked])
        try:
            yield
        finally:
            await broker.close()

    return ctx
