"""Wire envelopes the workers exchange, with orjson encode/decode."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import orjson

from shared.amqp.topology import message_id
from shared.errors import PermanentError
from shared.vocabulary import CHECKED_AT, RECONCILIATION, SOURCE

# The `order.*` messages are a contract shops may consume (docs/operations.md, "Integrating
# with your shop"): every one carries this in its `schema` header. Within version 1 fields are
# only ever added; a change that breaks a consumer gets a new version, published beside it for
# a release.
ORDER_TRANSITION_SCHEMA = "payhooks.order_transition/1"


class InvalidMessageError(PermanentError):
    """A message body that can never be processed (goes straight to the DLQ)."""


@dataclass(frozen=True, slots=True)
class OrderTransition:
    """An order moved from one status to another (published as `order.<to lower>`)."""

    event: str
    payment_id: str
    order_id: str
    user_id: str
    from_status: str
    to_status: str
    source_event_id: str

    @property
    def message_id(self) -> str:
        # Deterministic: the same source event can only ever produce the same message. Fits an
        # AMQP short string (a 250-character event id plus ":order.paid" would not: hashed).
        return message_id(f"{self.source_event_id}:{self.event}")

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, body: bytes) -> OrderTransition:
        try:
            data: Any = orjson.loads(body)
            return cls(**{name: str(data[name]) for name in cls.__dataclass_fields__})
        except (orjson.JSONDecodeError, KeyError, TypeError) as e:
            raise InvalidMessageError(f"not an order transition: {e}") from None


def reconciler_headers(checked_at: datetime) -> dict[str, str]:
    """The headers that mark a message as the reconciler's synthetic event, sought at
    `checked_at`: the one thing that grants the provider's answer its power (SPEC 5, D11)."""
    return {SOURCE: RECONCILIATION, CHECKED_AT: checked_at.isoformat()}


def checked_at_of(headers: Mapping[str, Any]) -> datetime | None:
    """When the provider's answer a reconciler's message carries was sought; None for any
    other message (a webhook's, whatever its body says)."""
    value = headers.get(CHECKED_AT)
    if headers.get(SOURCE) != RECONCILIATION or not isinstance(value, str):
        return None
    try:
        checked_at = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidMessageError(f"{CHECKED_AT} header is not ISO 8601") from None
    if checked_at.utcoffset() is None:
        raise InvalidMessageError(f"{CHECKED_AT} header has no time zone")
    return checked_at
