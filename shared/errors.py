"""The error hierarchy the edges map: transient means retry later, permanent means never."""

from __future__ import annotations


class PayhooksError(Exception):
    """Base of every error payhooks raises on purpose."""


class TransientError(PayhooksError):
    """A dependency is down, slow or overloaded: the same input may succeed later."""


class PermanentError(PayhooksError):
    """The input itself is wrong: retrying it can never succeed."""


class UnavailableError(TransientError):
    """PostgreSQL or RabbitMQ did not answer in time; ingest maps this to 503."""
