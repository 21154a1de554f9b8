"""RabbitMQ topology as data, the only module that spells exchange and queue names: one topic
exchange (routing key = event type) whose alternate exchange feeds `unrouted`, and per work
queue its retry queues (one per RETRY_DELAYS step) and its DLQ, all quorum queues."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import aiormq
import structlog
from aio_pika.abc import AbstractChannel, AbstractQueue, ExchangeType

from shared.vocabulary import DLQ_SUFFIX, LOCK_SUFFIX

log = structlog.get_logger(__name__)

# A message redelivered this many times (the process died holding it, again and again) is
# dead-lettered by RabbitMQ itself with reason `delivery_limit`.
DELIVERY_LIMIT = 10

WORK_QUEUES = ("orders", "bonuses", "emails")

# Which routing keys each work queue consumes. Provider events for payments and refunds go to
# orders; the transitions the orders worker publishes go to bonuses and emails.
BINDINGS: dict[str, tuple[str, ...]] = {
    "orders": ("payment.status_changed", "refund.*"),
    "bonuses": ("order.*",),
    "emails": ("order.*",),
}

# The bound of `unrouted` (events no worker consumes: withdrawals, kyc, reminders, ...): kept a
# week for an operator to look at, at most this many messages and bytes (a few hundred bytes
# to a few KB each), the oldest dropped first beyond that. A look reads all of them at once,
# which AMQP's largest prefetch (65,535) must cover (shared/ops/dlq.py `peeking`). Dropping loses
# nothing for good: the inbox keeps every accepted event with its raw body for RETENTION_DAYS
# (>= 35). Not `reject-publish`: that would fail ingest's publish and answer X-Hub 503 for ever.
UNROUTED_TTL_S = 7 * 24 * 3600
UNROUTED_MAX_MESSAGES = 50_000
UNROUTED_MAX_BYTES = 128 * 1024 * 1024
UNROUTED_ARGS: dict[str, Any] = {
    "x-queue-type": "quorum",
    "x-message-ttl": UNROUTED_TTL_S * 1000,
    "x-max-length": UNROUTED_MAX_MESSAGES,
    "x-max-length-bytes": UNROUTED_MAX_BYTES,
    "x-overflow": "drop-head",
}

# Dead-lettering from a quorum queue is at-least-once only with reject-publish (RabbitMQ 3.10+).
_QUORUM_DLX_ARGS = {
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    bindings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkQueue:
    """A work queue's names: where it lives, where it retries, where it dies."""

    name: str
    retry_queues: tuple[str, ...]
    dlq: str


@dataclass(frozen=True, slots=True)
class Topology:
    prefix: str
    exchange: str
    alternate_exchange: str
    unrouted: str
    work: dict[str, WorkQueue]
    queues: tuple[QueueSpec, ...]

    def work_queue(self, base_name: str) -> WorkQueue:
        return self.work[base_name]


def dlq_of(queue: str) -> str:
    return queue + DLQ_SUFFIX


def queue_of_dlq(dlq: str) -> str:
    return dlq.removesuffix(DLQ_SUFFIX)


def lock_of(dlq: str) -> str:
    """The exclusive queue a DLQ's reader holds (shared/ops/dlq_lock.py)."""
    return dlq + LOCK_SUFFIX


def retry_queue_name(queue: str, delay_s: float) -> str:
    # The delay is part of the name: a queue's TTL can't change once declared, so a new
    # RETRY_DELAYS gets new queues instead of a PRECONDITION_FAILED at startup.
    return f"{queue}.retry.{round(delay_s * 1000)}ms"


def build_topology(prefix: str, retry_delays_s: tuple[float, ...]) -> Topology:
    exchange = f"{prefix}payhooks.events"
    unrouted = f"{prefix}unrouted"
    queues = [QueueSpec(unrouted, dict(UNROUTED_ARGS))]
    work: dict[str, WorkQueue] = {}
    for base in WORK_QUEUES:
        name = f"{prefix}{base}"
        dlq = dlq_of(name)
        retries = tuple(retry_queue_name(name, d) for d in retry_delays_s)
        queues.append(
            QueueSpec(
                name,
                {
                    "x-queue-type": "quorum",
                    "x-delivery-limit": DELIVERY_LIMIT,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": dlq,
                    **_QUORUM_DLX_ARGS,
                },
                BINDINGS[base],
            )
        )
        # A delay may repeat (1,1,1 = three retries after 1 s): one queue serves those steps.
        for retry, delay in dict(zip(retries, retry_delays_s, strict=True)).items():
            queues.append(
                QueueSpec(
                    retry,
                    {
                        "x-queue-type": "quorum",
                        "x-message-ttl": round(delay * 1000),
                        "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": name,
                        **_QUORUM_DLX_ARGS,
                    },
                )
            )
        queues.append(QueueSpec(dlq, {"x-queue-type": "quorum"}))
        work[base] = WorkQueue(name, retries, dlq)
    return Topology(
        prefix=prefix,
        exchange=exchange,
        alternate_exchange=f"{prefix}payhooks.unrouted",
        unrouted=unrouted,
        work=work,
        queues=tuple(queues),
    )


async def declare(channel: AbstractChannel, topology: Topology) -> aio_pika.abc.AbstractExchange:
    """Declare everything; idempotent, run at every startup. Returns the events exchange."""
    alternate = await channel.declare_exchange(
        topology.alternate_exchange, ExchangeType.FANOUT, durable=True
    )
    exchange = await channel.declare_exchange(
        topology.exchange,
        ExchangeType.TOPIC,
        durable=True,
        arguments={"alternate-exchange": topology.alternate_exchange},
    )
    for spec in topology.queues:
        if spec.name == topology.unrouted:
            queue = await _declare_unrouted(channel, spec)
        else:
            queue = await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)
        for key in spec.bindings:
            await queue.bind(exchange, routing_key=key)
        if spec.name == topology.unrouted:
            await queue.bind(alternate, routing_key="")
    return exchange


async def _declare_unrouted(channel: AbstractChannel, spec: QueueSpec) -> AbstractQueue:
    """Declare `unrouted` with its bound; if it exists from before the bound (RabbitMQ refuses
    other arguments for an existing queue: PRECONDITION_FAILED), use it as it is and warn.

    The attempt runs on a channel of its own: the refusal closes the channel it happens on.
    The queue is then declared passively on `channel`, which is what a robust channel repeats
    after a reconnect, so that cannot fail the same way later.
    """
    underlay = await channel.get_underlay_channel()
    probe = await underlay.connection.channel(publisher_confirms=False)
    try:
        await probe.queue_declare(spec.name, durable=True, arguments=spec.arguments)
    except aiormq.exceptions.ChannelPreconditionFailed as e:
        log.warning(
            "topology.unrouted_unbounded",
            queue=spec.name,
            error=str(e),
            action="it exists with other arguments (from before its bound): used as it is;"
            ' bound it with a policy or recreate it (docs/operations.md, "RabbitMQ topology")',
        )
        return await channel.declare_queue(spec.name, passive=True)
    finally:
        if not probe.is_closed:
            await probe.close()
    return await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments)


async def delete(channel: AbstractChannel, topology: Topology) -> None:
    """Remove every queue and exchange of `topology` (tests and benchmarks with a prefix)."""
    for spec in topology.queues:
        await channel.queue_delete(spec.name)
    await channel.exchange_delete(topology.exchange)
    await channel.exchange_delete(topology.alternate_exchange)


_MAX_ROUTING_KEY_BYTES = 255


@functools.lru_cache(maxsize=1024)  # a handful of types in practice; any string may come
def routing_key(event_type: str) -> str:
    """The routing key for an event type; one AMQP can't carry goes to `unrouted`."""
    if len(event_type.encode("utf-8", "replace")) > _MAX_ROUTING_KEY_BYTES or "\x00" in event_type:
        return "unroutable"
    return event_type


def message_id(event_id: str) -> str:
    """The AMQP message id for an event id (a short string: at most 255 bytes).

    Longer ids are replaced by their SHA-256, which is just as unique and just as stable for
    the consumers' dedup.
    """
    raw = event_id.encode("utf-8", "replace")
    if len(raw) > _MAX_ROUTING_KEY_BYTES:
        return "sha256:" + hashlib.sha256(raw).hexdigest()
    return event_id


def _topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: `*` is exactly one word, `#` zero or more."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


@functools.lru_cache(maxsize=1024)
@functools.lru_cache(maxsize=1024)  # a handful of types in practice; any string may come
def is_routed(event_type: str) -> bool:
    """Whether some work queue consumes this event type (else it lands in `unrouted`)."""
    key = routing_key(event_type)
    return any(_topic_matches(p, key) for keys in BINDINGS.values() for p in keys)


def queues_for(event_type: str) -> tuple[str, ...]:
    """The work queues (base names) bound to this event type now, as BINDINGS says: read at
    each call, so a release that binds a new type changes the answer (an operator's replay of
    events that sat in `unrouted`, shared/ops/replay.py)."""
    key = routing_key(event_type)
    return tuple(q for q in WORK_QUEUES if any(_topic_matches(p, key) for p in BINDINGS[q]))
