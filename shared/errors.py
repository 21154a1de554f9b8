"""The error hierarchy the edges map: transient means retry later, permanent means never."""

from __future__ import annotations


class PayhooksError(Exception):
    """Base of every error payhooks raises on purpose."""


class TransientError(PayhooksError):
    """A dependency is down, slow or overloaded: the same input may succeed later.

    `reason` is what a worker records when the retry ladder runs out.
    """

    reason = "retries_exhausted"


class PermanentError(PayhooksError):
    """The input itself is wrong: retrying it can never succeed (straight to the DLQ)."""

    reason = "invalid_message"


class UnknownPaymentError(TransientError):
    """An event for a payment no order is registered for (yet): retry, then dead-letter."""

    reason = "unknown_payment"


class UnavailableError(TransientError):
    """PostgreSQL or RabbitMQ did not answer in time; ingest maps this to 503."""
