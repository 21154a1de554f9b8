"""Turning an HTTP delivery into a verified webhook, or saying exactly why not. No I/O.
What differs per provider (headers, signature scheme, body shape) is its `Provider`'s."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

# MalformedWebhookError: raised here and by the providers' body checks (their `headline`).
from shared.providers.base import MalformedWebhookError as MalformedWebhookError
from shared.providers.base import Provider

_MAX_ID_LENGTH = 255
_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only (str.isdigit() takes other scripts)
# Headers kept out of the stored copy: credentials that might sit in front of us.
_UNSTORED_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


@dataclass(frozen=True, slots=True)
class Signed:
    """What an authentically signed delivery says about our own configuration."""

    # Position of the matching secret in the provider's secrets (XHUB_WEBHOOK_SECRETS, ...;
    # 0 = the first): which secret the provider signs with, so an old one is retired on
    # evidence. Never the secret itself.
    secret_index: int
    # Our clock minus the delivery's timestamp header, in seconds: positive when it is in our
    # past (our clock ahead of the provider's, plus transit), negative when in our future.
    # None for a timestamp of more than 15 digits, which no clock is near.
    clock_skew_s: float | None


class RejectedWebhookError(ValueError):
    """The request is not provably from the provider, now (401).

    `outcome` is `invalid_signature` or `stale`; a stale delivery was authentically signed,
    and `signed` says how.
    """

    def __init__(self, outcome: str, message: str, signed: Signed | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.signed = signed


@dataclass(frozen=True, slots=True)
class WebhookHeaders:
    """The identifying headers of one delivery attempt."""

    event_id: str
    timestamp: str
    signature: str


@dataclass(frozen=True, slots=True)
class Webhook:
    """A delivery that passed every check: authentic, fresh, a JSON object with an event."""

    event_id: str
    event_type: str
    payment_id: str | None
    body: bytes


def read_headers(headers: Mapping[str, str], provider: Provider) -> WebhookHeaders:
    """The delivery's id, timestamp and signature as its headers give them. A provider whose
    id is in the body (Stripe) gets "" here and the body's in parse_body; one whose timestamp
    is in the signature header (Stripe's `t=`) is refused as unsigned (401) without one."""
    signature = headers.get(provider.signature_header, "")
    event_id = ""
    if (id_header := provider.id_header) is not None:
        event_id = _event_id(headers.get(id_header, ""), f"{id_header} header")
    if (timestamp_header := provider.timestamp_header) is not None:
        timestamp = headers.get(timestamp_header, "").strip()
        if not timestamp:
            raise MalformedWebhookError(f"missing {timestamp_header} header")
        if not _INTEGER.fullmatch(timestamp):
            raise MalformedWebhookError(f"{timestamp_header} must be Unix seconds")
    else:
        in_signature = provider.timestamp_in_signature
        timestamp = in_signature(signature).strip() if in_signature is not None else ""
        if not signature:
            raise RejectedWebhookError(
                "invalid_signature", f"missing {provider.signature_header} header"
            )
        if not _INTEGER.fullmatch(timestamp):
            raise RejectedWebhookError(
                "invalid_signature", f"{provider.signature_header} has no Unix seconds timestamp"
            )
    return WebhookHeaders(event_id, timestamp, signature)


def _event_id(value: str, where: str) -> str:
    event_id = value.strip()
    if not event_id:
        raise MalformedWebhookError(f"missing {where}")
    if len(event_id) > _MAX_ID_LENGTH or not event_id.isprintable():
        raise MalformedWebhookError(f"{where} must be 1-{_MAX_ID_LENGTH} printable characters")
    return event_id


def authenticate(
    delivery: WebhookHeaders,
    body: bytes,
    secrets: tuple[bytes, ...],
    now_s: float,
    tolerance_s: int,
    provider: Provider,
) -> Signed:
    """Which secret signed the delivery and how far its timestamp is from `now_s`; raise
    RejectedWebhookError unless the signature matches and the timestamp is fresh.

    The signature is checked first: `stale` then means an authentic delivery with a clock
    too far off, which is what an operator needs to know.
    """
    if not delivery.signature:
        raise RejectedWebhookError(
            "invalid_signature", f"missing {provider.signature_header} header"
        )
    index = provider.matching_secret(
        secrets, delivery.event_id, delivery.timestamp, body, delivery.signature
    )
    if index is None:
        raise RejectedWebhookError("invalid_signature", "signature does not match")
    # A numeric timestamp far off (milliseconds, a negative one) is a clock problem: stale.
    # Digits beyond 15 can't be near now, and int() of thousands of digits is refused.
    skew_s = None if len(delivery.timestamp) > 15 else now_s - int(delivery.timestamp)
    signed = Signed(index, skew_s)
    if skew_s is None or abs(skew_s) > tolerance_s:
        raise RejectedWebhookError("stale", "timestamp outside the allowed tolerance", signed)
    return signed


def parse_body(
    delivery: WebhookHeaders,
    body: bytes,
    provider: Provider,
    options: Mapping[str, str] | None = None,
) -> Webhook:
    """The verified body as a webhook; `options`: the provider's own settings (its screen's)."""
    try:
        payload: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise MalformedWebhookError("body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise MalformedWebhookError("body must be a JSON object")
    headline = provider.headline(payload)
    if provider.screen is not None:
        headline = provider.screen(payload, headline, options or {})
    event_id = delivery.event_id
    if provider.id_header is None:  # the id is the body's (Stripe's `id`)
        given = headline.event_id
        event_id = _event_id(given if isinstance(given, str) else "", 'body "id"')
    return Webhook(
        event_id=event_id,
        event_type=headline.event_type,
        payment_id=_payment_id(headline.payment_id),
        body=body,
    )


def _payment_id(value: Any) -> str | None:
    """The inbox's lookup copy of the body's payment id (the body keeps the exact value).

    None for what no registered order can have (orders take ids of at most 255 characters):
    such an event is still stored and published, and the orders worker dead-letters it as an
    unknown payment, where an operator sees it.
    """
    if isinstance(value, bool):  # bool is an int subclass; true is no payment id
        return None
    if isinstance(value, str | int):
        text = str(value)
        return text if len(text) <= _MAX_ID_LENGTH else None
    return None


def storable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {str(k): v for k, v in headers.items() if k.lower() not in _UNSTORED_HEADERS}
