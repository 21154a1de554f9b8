"""The error hierarchy the edges map: transient means retry later, permanent means never; a
transient error may name the dependency that is down (an outage, not the message's fault).
The exit codes of the terminal commands close the file."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class Dependency(StrEnum):
    """What payhooks' own infrastructure consists of (the `dependency` label)."""

    POSTGRESQL = "postgresql"
    RABBITMQ = "rabbitmq"
    SMTP = "smtp"


class PayhooksError(Exception):
    """Base of every error payhooks raises on purpose."""


class TransientError(PayhooksError):
    """A dependency is down, slow or overloaded: the same input may succeed later.

    `reason` is what a worker records when the retry ladder runs out; `dependency`, where
    set, says the failure is that dependency's outage (shared/outages.py): no ladder step.
    """

    reason = "retries_exhausted"
    dependency: ClassVar[Dependency | None] = None


class PermanentError(PayhooksError):
    """The input itself is wrong: retrying it can never succeed (straight to the DLQ)."""

    reason = "invalid_message"


class UnknownPaymentError(TransientError):
    """An event for a payment no order is registered for (yet). The orders worker parks such
    an event and dead-letters it with this reason once UNKNOWN_PAYMENT_PARK_SECONDS have
    passed (services/orders/parked.py); the bonuses and email workers retry, then
    dead-letter."""

    reason = "unknown_payment"


class UnavailableError(TransientError):
    """PostgreSQL or RabbitMQ did not answer in time; ingest maps this to 503."""


class BrokerUnavailableError(UnavailableError):
    """RabbitMQ is not connected, its channel closed under a publish, or it blocks publishers."""

    dependency = Dependency.RABBITMQ


# What a terminal command (`payhooks ...`, the simulator) exits with: the errors above
# as a shell sees them, the way the api answers them with a status.
EXIT_OK = 0
EXIT_NOTHING = 1  # nothing matched
EXIT_USAGE = 2  # usage or configuration
EXIT_UNREACHABLE = 3  # PostgreSQL, RabbitMQ (or, for send, ingest) unreachable
EXIT_CONFLICT = 4  # a conflicting order
EXIT_BUSY = 5  # the DLQ is held by another reader: try again later, nothing is broken
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away (`| head`): 128 + SIGPIPE, as shells say
