"""The messages payhooks publishes: one shape, the same AMQP properties on every publish."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, DeliveryMode
from aiormq import spec

from shared.amqp.topology import message_id, routing_key


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish on the events exchange."""

    routing_key: str
    body: bytes
    message_id: str
    type: str
    headers: dict[str, str]


def properties(outgoing: Outgoing, now: dt.datetime) -> spec.Basic.Properties:
    """The AMQP properties every payhooks publish carries.

    message_id and type are AMQP short strings (255 bytes): an id built from a provider's
    event id can be longer (an outbox id adds ":order.paid"), and a message pamqp cannot
    encode would fail on every attempt. message_id() keeps short ids and hashes long ones.
    The timestamp (whole seconds) is when it was published: how long a message has waited in
    a queue nobody consumes (`unrouted`) is read from it.
    """
    return spec.Basic.Properties(
        content_type="application/json",
        delivery_mode=DeliveryMode.PERSISTENT.value,
        headers=dict(outgoing.headers),
        message_id=message_id(outgoing.message_id),
        message_type=routing_key(outgoing.type),
        timestamp=now,
    )


def to_message(outgoing: Outgoing) -> aio_pika.Message:
    """`outgoing` as an aio_pika.Message with the same properties (for publishing through an
    aio-pika exchange, as tests do)."""
    p = properties(outgoing, dt.datetime.now(dt.UTC))
    return aio_pika.Message(
        outgoing.body,
        message_id=p.message_id,
        type=p.message_type,
        content_type=p.content_type,
        delivery_mode=DeliveryMode.PERSISTENT,
        headers=p.headers,
        timestamp=p.timestamp,
    )


def persistent_copy(message: AbstractIncomingMessage, headers: dict[str, Any]) -> aio_pika.Message:
    """The received message, body and ids unchanged, to publish again with new `headers`."""
    return aio_pika.Message(
        message.body,
        headers=headers,
        message_id=message.message_id,
        type=message.type,
        content_type=message.content_type,
        delivery_mode=DeliveryMode.PERSISTENT,
    )
